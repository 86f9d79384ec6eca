"""``ttft probe --ray``: the probe's workers as Ray actors on a real local Ray cluster.

Fast tests cover what needs no cluster (the address, the missing extra, the in-flight tracker and
the driver's stand-in spans); the slow ones start one local Ray for the module, run the probe's
workers on it against the fake SSE server and the bundled engine's catalogue scenarios, kill an
actor mid-phase, and leave no raylet.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, ProbeSession, WorkloadSpec, eventloop, run_probe
from collectors.probe.results import RequestResult
from collectors.probe.inflight import WORKER_LOST, InFlight, InFlightTracker, lost_result, stand_in_span_lines
from collectors.probe.ray_workers import RAY_EXTRA, RayWorkersError, check_address, require_ray


def _cfg(url, load, out=2, **kw):
    return ProbeConfig(url, api="completions", load=load,
                       workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse(str(out))), timeout_s=10, **kw)


# --- no cluster -----------------------------------------------------------------------------------


@pytest.mark.parametrize("good", ["local", "auto", "ray://head:10001", "10.0.0.5:6379"])
def test_addresses_accepted(good):
    assert check_address(good) == good


@pytest.mark.parametrize("bad", ["", "ray://", "head", "http://head:10001", "ray://head:port"])
def test_bad_address_is_one_line(bad):
    with pytest.raises(RayWorkersError, match="expected local, auto"):
        check_address(bad)


def test_without_ray_the_cli_names_the_extra(server, monkeypatch, capsys):
    from diag.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as when it is not installed
    with pytest.raises(RayWorkersError, match=r"ttft-diag\[ray\]"):
        require_ray()
    for cmd in (["probe", server.url("ok"), "--no-capture"], ["diagnose", server.url("ok")]):
        assert main([*cmd, "--ray", "local", "--workers", "2"]) == 2
        err = capsys.readouterr().err.strip()
        assert RAY_EXTRA in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, want", [
    (["--random", "3", "--ray", "local"], "not with --random, --near-miss or --via diagnose"),
    (["--via", "diagnose", "--workers", "2"], "not with --random, --near-miss or --via diagnose"),
    (["--workers", "0"], "--workers must be >= 1"),
    (["--ray", "head"], "expected local, auto"),
])
def test_scenarios_check_spread_flags_are_checked_in_one_line(argv, want, capsys):
    from diag.cli import main

    assert main(["scenarios", "check", *argv]) == 2  # before any calibration or engine
    err = capsys.readouterr().err.strip()
    assert want in err and len(err.splitlines()) == 1


def test_tracker_hands_on_results_and_in_flight_requests(server):
    from collectors.probe.client import StreamingClient
    from collectors.probe.endpoint import resolve_endpoint
    from collectors.probe.workload import Workload
    from collectors.spans import setup_tracing

    async def main():
        ep, _ = await resolve_endpoint(server.url("slow"), "completions", "m")
        sink = setup_tracing(memory=True)
        client = StreamingClient(ep, 4, sink=sink)
        tracker = InFlightTracker()
        tracker.install(client)
        await client.open()
        wl = Workload(WorkloadSpec(LengthSpec.parse("8"), LengthSpec.parse("2")))
        try:
            tasks = [asyncio.ensure_future(client.request(wl.next_item(), f"r{i}", "seg", False)) for i in range(3)]
            await asyncio.sleep(0.03)
            done, inflight = tracker.take()
            results = await asyncio.gather(*tasks)
            after, none_left = tracker.take()
        finally:
            await client.close()
            sink.shutdown()
        return done, inflight, results, after, none_left

    done, inflight, results, after, none_left = eventloop.run(main())
    assert done == [] and sorted(e.request_id for e in inflight) == ["r0", "r1", "r2"]
    assert {e.segment for e in inflight} == {"seg"} and all(len(e.trace_id) == 32 and len(e.span_id) == 16 for e in inflight)
    by_id = {e.request_id: e for e in inflight}
    assert all(r.trace_id == by_id[r.request_id].trace_id for r in results)
    assert sorted(r.request_id for r, _ in after) == ["r0", "r1", "r2"] and none_left == []
    assert {sid for _, sid in after} == {e.span_id for e in inflight}


def test_lost_requests_become_worker_lost_spans_in_their_own_trace(tmp_path):
    from diag.ground.capture import CaptureWriter, load_capture
    from diag.ground.tables import build_tables

    t0 = time.time_ns()
    gone = InFlight("p1.r-7", "r", False, t0, t0 + 1_000, "ab" * 16, "cd" * 8)
    lost = lost_result(gone, "worker 1 lost")
    done = RequestResult("p1.r-6", segment="r", scheduled_ns=t0, start_ns=t0, first_content_ns=t0 + 5_000_000,
                         last_ns=t0 + 9_000_000, token_times_ns=[t0 + 5_000_000, t0 + 9_000_000], status=200,
                         trace_id="ef" * 16)
    lines = stand_in_span_lines([(done, "12" * 8), (lost, gone.span_id)], "completions", "m")
    with CaptureWriter(tmp_path / "cap") as w:
        w.append_span_lines(lines)
    req = build_tables(load_capture(tmp_path / "cap")).requests.set_index("request_id")
    assert lost.error == WORKER_LOST and lost.start_ns == gone.start_ns
    assert req.loc["p1.r-7", "error"] == WORKER_LOST and req.loc["p1.r-7", "trace_id"] == "ab" * 16
    assert req.loc["p1.r-6", "client_ttft_s"] == pytest.approx(0.005, abs=1e-6) and req.loc["p1.r-6", "trace_id"] == "ef" * 16


def test_a_worker_puts_every_timestamp_on_the_drivers_clock(server):
    # the actor's body run in this process: a worker whose clock is 3 s ahead of the driver's
    # (offset +3 s) shifts its results, health samples and spans back by 3 s
    import json

    from collectors.probe.endpoint import resolve_endpoint
    from collectors.probe.load import worker_jobs
    from collectors.probe.ray_actor import ProbeWorker, RayJob
    from collectors.probe.workload import Workload

    ep, _ = eventloop.run(resolve_endpoint(server.url("ok"), "completions", "m"))
    wl = Workload(WorkloadSpec(LengthSpec.parse("8"), LengthSpec.parse("2")))
    (job,) = worker_jobs(1, ep, {"timeout_s": 5.0}, wl, LoadSpec(concurrency=2, requests=4), "seg")
    skew = 3_000_000_000
    t0 = time.time_ns()
    pay = ProbeWorker(0).run(RayJob(job, start_at_ns=t0 - skew, offset_ns=skew))
    t1 = time.time_ns()
    assert pay["error"] is None and pay["inflight"] == []
    results = [r for r, _ in pay["done"]]
    assert len(results) == 4 and all(r.ok for r in results)
    for r in results:
        assert t0 - skew <= r.scheduled_ns <= r.start_ns < r.first_content_ns <= r.last_ns <= t1 - skew
    assert t0 - skew <= pay["start_ns"] <= pay["end_ns"] <= t1 - skew
    ts = [t for h in pay["health"] for t in h["ts_s"]]
    assert ts and all((t0 - skew) / 1e9 - 0.1 <= t <= (t1 - skew) / 1e9 for t in ts)
    starts = [int(sp["startTimeUnixNano"]) for line in pay["span_lines"] for rs in json.loads(line)["resourceSpans"]
              for ss in rs["scopeSpans"] for sp in ss["spans"]]
    assert len(starts) == 4 and all(t0 - skew <= t <= t1 - skew for t in starts)


def test_the_driver_applies_a_measured_offset_unless_the_clock_is_its_own():
    from types import SimpleNamespace

    from collectors.probe.ray_workers import RayWorkers

    skew = -7_000_000
    pool = RayWorkers("local", 1)
    pool._ray = SimpleNamespace(get=lambda x, timeout=None: x)
    pool.actors = [SimpleNamespace(now_ns=SimpleNamespace(remote=lambda: time.time_ns() + skew))]
    pool._info = [{"same_clock": False, "clock_measurements": 0}]
    applied = pool._clock(0)
    clock = pool._info[0]["clock"]
    assert applied == clock["applied_ns"] == clock["offset_ns"]
    assert abs(applied - skew) <= clock["uncertainty_ns"] + 1_000_000
    pool._info[0]["same_clock"] = True
    assert pool._clock(0) == 0 and pool._info[0]["clock"]["applied_ns"] == 0 and pool._info[0]["clock_measurements"] == 2


def test_a_worker_whose_phase_raised_keeps_its_results_and_marks_its_in_flight_requests():
    from types import SimpleNamespace

    from collectors.probe.endpoint import Endpoint
    from collectors.probe.load import WorkerJob
    from collectors.probe.ray_workers import RayWorkers, _Phase

    t0 = time.time_ns()
    ep = Endpoint("http://127.0.0.1:1", "completions", "m")
    job = WorkerJob(0, ep, {}, WorkloadSpec(), None, LoadSpec(concurrency=2, requests=5), "r", "", True)
    done = RequestResult("p0.r-0", segment="r", start_ns=t0, first_content_ns=t0 + 1000, last_ns=t0 + 2000,
                         status=200, trace_id="ab" * 16)
    gone = InFlight("p0.r-1", "r", False, t0, t0 + 10, "cd" * 16, "ef" * 8)
    pool = RayWorkers("local", 1)
    pool._ray = SimpleNamespace()
    pool._info = [{"index": 0, "host": "h", "node_id": "n0", "state": "ok"}]
    part = _Phase(0, None, job, payload={"done": [(done, "12" * 8)], "inflight": [gone], "error": "OSError: boom"})
    out = pool._merge([part], ep)
    assert [(r.request_id, r.error) for r in out.results] == [("p0.r-0", None), ("p0.r-1", WORKER_LOST)]
    assert len(out.span_lines) == 1 and '"worker_lost"' in out.span_lines[0]  # the driver wrote both spans
    info = pool._info[0]
    assert info["state"] == "ok" and info["failed"]["in_flight_marked"] == 1 and info["failed"]["unaccounted"] == 3
    (note,) = out.notes
    assert "worker 0 (host h" in note and "failed (failed: OSError: boom)" in note and "3 more" in note


_SETPRIORITY = os.setpriority


def _in_thread_at_niceness(nice, fn):
    """``fn()`` on a new thread whose niceness is ``nice`` (raising it is always allowed; Linux
    nices threads one by one); its result."""
    import threading

    out = {}

    def body():
        _SETPRIORITY(os.PRIO_PROCESS, 0, nice)
        out["r"] = fn()

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    return out["r"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread niceness is Linux's")
def test_a_worker_takes_back_the_priority_ray_starts_it_without(monkeypatch):
    # Ray starts its workers at niceness 15: on a busy node such a probe measured its own
    # starvation (the healthy scenario read loadgen 0.90 in 2 of 3 runs on 2 shared cores, healthy
    # 3 of 3 at 0). The worker puts its threads back at 0 where it may
    from collectors.probe.ray_actor import raise_priority

    if os.geteuid() == 0:  # root may lower niceness
        assert _in_thread_at_niceness(7, raise_priority) == (7, 0)
    refused = PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "setpriority", lambda *a: (_ for _ in ()).throw(refused))
    assert _in_thread_at_niceness(7, raise_priority) == (7, 7)  # not allowed: kept, and said


def test_a_worker_left_above_niceness_zero_is_noted_once():
    from types import SimpleNamespace

    from collectors.probe.endpoint import Endpoint
    from collectors.probe.load import WorkerJob
    from collectors.probe.ray_workers import NICENESS_ENV, RayWorkers, _Phase

    ep = Endpoint("http://127.0.0.1:1", "completions", "m")
    job = WorkerJob(0, ep, {}, WorkloadSpec(), None, LoadSpec(concurrency=1, requests=1), "r", "", True)
    pool = RayWorkers("local", 1)
    pool._ray = SimpleNamespace(get=lambda x, timeout=None: x)
    actor = SimpleNamespace(now_ns=SimpleNamespace(remote=time.time_ns))
    pool._info = [{"index": 0, "host": "h", "node_id": "n0", "state": "ok", "nice_at_start": 15, "nice": 15}]
    notes = [pool._merge([_Phase(0, actor, job, payload={"done": [], "inflight": [], "error": None, "nice": 15})],
                         ep).notes for _ in range(2)]
    assert len(notes[0]) == 1 and "niceness 15" in notes[0][0] and f"{NICENESS_ENV}=0" in notes[0][0]
    assert notes[1] == [] and pool._info[0]["nice"] == 15  # once per worker; meta.json keeps the figure


def test_sessions_run_on_the_kept_workers_and_only_their_own_are_theirs(monkeypatch):
    from collectors.probe import ray_workers as rw

    pool = rw.RayWorkers("local", 2)
    monkeypatch.setitem(rw._KEPT, ("local", 2), pool)
    assert rw.session_workers("local", 2) == (pool, False)  # a run's actors: not the session's to close
    monkeypatch.setattr(rw.RayWorkers, "start", lambda self: self)
    other, owned = rw.session_workers("local", 3)  # another count: placed for the session
    assert owned and other is not pool and other.workers == 3


# --- a real local Ray ------------------------------------------------------------------------------


def _raylets() -> set[int]:
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"raylet" in cmd.split(b"\0")[0]:
                out.add(int(pid))
    return out


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray (this machine's CPUs) for the module; shut down after, and no raylet of it left."""
    ray = pytest.importorskip("ray")
    before = _raylets()
    from collectors.probe.ray_workers import connect

    connect("local")  # as --ray local starts it: this machine's CPUs, workers at niceness 0
    try:
        yield ray
    finally:
        ray.shutdown()
        deadline = time.monotonic() + 20
        while _raylets() - before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _raylets() - before, "a raylet outlived ray.shutdown()"


@pytest.mark.slow
def test_ray_probe_merges_every_request_once_with_each_workers_clock(ray_cluster, server, tmp_path):
    from diag.ground.capture import load_capture
    from diag.ground.tables import build_tables

    cfg = _cfg(server.url("ok"), LoadSpec(concurrency=4, requests=12, warmup_requests=2), workers=2,
               output=tmp_path / "cap", ray_address="local")
    res = run_probe(cfg)
    assert res.metrics["requests"]["total"] == 12 and res.metrics["requests"]["ok"] == 12
    ids = [r.request_id for r in res.results]
    assert len(ids) == len(set(ids)) == 14 and {i.split(".")[0] for i in ids} == {"p0", "p1"}
    cap = load_capture(tmp_path / "cap")
    req = build_tables(cap).requests
    req = req.loc[~req["segment"].isin(["calibrate", "compat"])]
    assert sorted(req["request_id"]) == sorted(ids) and req["client_ttft_s"].notna().all()
    traced = {s.headers["traceparent"].split("-")[1] for s in server.log}
    assert set(req["trace_id"]) <= traced
    ray_meta = cap.meta["probe"]["ray"]
    assert ray_meta["address"] == "local" and ray_meta["lost_requests"] == 0 and len(ray_meta["workers"]) == 2
    for w in ray_meta["workers"]:
        clock = w["clock"]
        assert w["state"] == "ok" and w["host"] and w["node_id"] and w["same_clock"] is True
        assert clock["applied_ns"] == 0 and clock["uncertainty_ns"] > 0 and clock["exchanges"] >= 4
        assert abs(clock["offset_ns"]) <= clock["uncertainty_ns"] + 2_000_000  # one clock: zero within its error
    assert res.client_health["processes"] >= 2  # each actor's health samples came back


@pytest.mark.slow
def test_a_killed_worker_is_reported_and_its_in_flight_requests_marked(ray_cluster, server, tmp_path):
    from diag.ground.capture import load_capture
    from diag.ground.tables import build_tables

    done_seen: list[int] = []
    cfg = _cfg(server.url("slow"), LoadSpec(concurrency=4, requests=40, warmup_requests=0), workers=2,
               output=tmp_path / "cap", ray_address="local", progress=lambda d, t, label: done_seen.append(d))

    async def main():
        async with ProbeSession(cfg) as s:
            phase = asyncio.ensure_future(s.phase(cfg.load))
            while not done_seen or done_seen[-1] < 4:
                await asyncio.sleep(0.05)
            ray_cluster.kill(s.ray_workers.actors[1], no_restart=True)
            first = await phase
            # the next phase runs on the worker left; with none left, one line says so
            second = await s.phase(LoadSpec(concurrency=2, requests=4))
            ray_cluster.kill(s.ray_workers.actors[0], no_restart=True)
            with pytest.raises(RayWorkersError, match="none is left"):
                await s.phase(LoadSpec(concurrency=2, requests=4))
            return first, second

    outcome, second = eventloop.run(main())
    assert [r.request_id.split(".")[0] for r in second.results] == ["p0"] * 4 and all(r.ok for r in second.results)
    lost = [r for r in outcome.results if r.error == WORKER_LOST]
    assert lost and all(r.request_id.startswith("p1.") for r in lost)
    assert sum(1 for r in outcome.results if r.request_id.startswith("p0.") and r.ok) == 20  # the other worker's
    ids = [r.request_id for r in outcome.results]
    assert len(ids) == len(set(ids))
    assert any("worker 1" in n and "was lost" in n and "worker_lost" in n for n in outcome.notes)
    cap = load_capture(tmp_path / "cap")
    w0, w1 = cap.meta["probe"]["ray"]["workers"]
    assert w1["state"] == "lost" and w1["lost"]["in_flight_marked"] == len(lost)
    assert w0["state"] == "lost" and w0["lost"]["in_flight_marked"] == 0  # killed between phases
    assert cap.meta["probe"]["ray"]["lost_requests"] == len(lost)
    req = build_tables(cap).requests
    marked = req.loc[req["error"] == WORKER_LOST]
    assert sorted(marked["request_id"]) == sorted(r.request_id for r in lost)
    assert set(marked["trace_id"]) <= {s.headers["traceparent"].split("-")[1] for s in server.log}
    # worker 1's finished requests are in the capture too, from the spans the driver wrote for them
    got = {r.request_id for r in outcome.results if r.request_id.startswith("p1.") and r.ok}
    assert got and got <= set(req["request_id"])


@pytest.mark.slow
def test_ray_probe_gives_the_single_process_verdict_on_the_queue_scenario(ray_cluster, tmp_path):
    # the catalogue's queue scenario (the engine admits one sequence at a time, a concurrency sweep),
    # run by the scenario runner as it is, once with the probe in this process and once on two
    # Ray actors: the same verdict, server-side and client-only
    from diag.ground.capture import load_capture
    from diag.analysis.scenarios import MODES, SCENARIOS, Calibration, diagnose_run, run_scenario
    from diag.analysis.scenarios.runner import ProbeWorkers

    queue = next(s for s in SCENARIOS if s.name == "queue")
    cal = Calibration(ttft_short_ms=5.0, prefill_ms_per_token=0.05, decode_step_ms=5.0)  # the plan takes no size from it
    single = run_scenario(queue, tmp_path / "single", cal)
    spread = run_scenario(queue, tmp_path / "ray", cal, where=ProbeWorkers(2, "local"))
    ray_meta = load_capture(spread.client).meta["probe"]["ray"]
    assert len(ray_meta["workers"]) == 2 and ray_meta["lost_requests"] == 0
    for mode in MODES:
        one, many = diagnose_run(single, mode), diagnose_run(spread, mode)
        # the cause named: the verdict, or under the verdict floor its leading candidate (docs/verdict.md)
        named = [v.leading if v.category in ("healthy", "inconclusive") else v.category for v in (one, many)]
        assert named == ["queue", "queue"], (mode, one, many)
        if mode == "server":
            assert many.category == one.category == "queue", (one, many)


@pytest.mark.slow
def test_diagnose_runs_its_steps_on_ray_workers(ray_cluster, tmp_path):
    # ttft diagnose --ray local --workers 2 against an engine that admits one sequence at a time
    from diag.ground.capture import load_capture
    from diag.analysis.diagnose import DiagnoseConfig, PlanConfig, run_diagnose
    from diag.analysis.scenarios.engine_process import EngineProcess
    from diag.ground.tables import build_tables

    with EngineProcess(["--max-running", "1", "--threads", "1"]) as eng:
        res = run_diagnose(DiagnoseConfig(eng.url, tmp_path / "cap", PlanConfig(budget_s=25, max_concurrency=8),
                                          workers=2, ray_address="local"))
    assert res.analysis.diagnosis.named == "queue", res.analysis.diagnosis.verdict.title
    cap = load_capture(res.capture)
    workers = cap.meta["probe"]["ray"]["workers"]
    assert len(workers) == 2 and all(w["state"] == "ok" and w["clock_measurements"] >= 1 for w in workers)
    sent = sum(r.point.ok + r.point.failed for r in res.records if r.point is not None)
    tab = build_tables(cap).requests
    measured = tab.loc[~tab["warmup"] & ~tab["segment"].isin(["calibrate", "compat"])]
    # every request once (a ladder rung's phases of one request each reuse their ids: the trace is the key)
    assert len(measured) == sent and measured["trace_id"].is_unique
    assert {i.split(".")[0] for i in measured["request_id"]} == {"p0", "p1"}  # the ramp's points ran on both


@pytest.mark.slow
def test_scenarios_check_on_ray_gives_the_in_process_verdicts(ray_cluster, tmp_path, capsys):
    # ttft scenarios check NAME... once in this process and once --ray local --workers 2 (the Ray
    # the fixture started is used as it is): per scenario and mode, the same verdict. healthy is
    # the one a starved probe gets wrong (Ray's niceness 15 made it loadgen 0.90 in 2 of 3 runs)
    import json

    from diag.ground.capture import load_capture
    from diag.cli import main
    from diag.analysis.scenarios import Calibration

    cal = tmp_path / "calibration.json"  # the plans' sizes, fixed (as a 2-core machine measured them)
    cal.write_text(json.dumps(Calibration(ttft_short_ms=8.8, prefill_ms_per_token=0.16, decode_step_ms=3.8).to_dict()))
    docs = {}
    for how, extra in (("in-process", []), ("ray", ["--ray", "local", "--workers", "2"])):
        rc = main(["scenarios", "check", "healthy", "prefill_compute", "--calibration", str(cal),
                   "-o", str(tmp_path / how), "--json", *extra])
        docs[how] = json.loads(capsys.readouterr().out)
        assert rc in (0, 1), how
    assert docs["ray"]["probe_workers"] == {"workers": 2, "ray_address": "local"}
    verdicts = {how: {(r["scenario"], m): v["category"] for r in d["matrix"] for m, v in r["verdicts"].items()}
                for how, d in docs.items()}
    assert len(verdicts["ray"]) == 4 and verdicts["ray"] == verdicts["in-process"], verdicts
    workers = load_capture(tmp_path / "ray" / "healthy" / "client").meta["probe"]["ray"]["workers"]
    assert len(workers) == 2 and all(w["state"] == "ok" and w["nice"] == 0 for w in workers)
    # one set of actors for the run, placed before the first engine started
    later = load_capture(tmp_path / "ray" / "prefill_compute" / "client").meta["probe"]["ray"]["workers"]
    assert [w["pid"] for w in later] == [w["pid"] for w in workers]
