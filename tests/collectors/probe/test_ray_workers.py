"""``ttft probe --ray``: the probe's workers as Ray actors on a real local Ray cluster.

Fast tests cover what needs no cluster (the address, the missing extra, the in-flight tracker and
the driver's stand-in spans); the slow ones start one local Ray (2 CPUs) for the module, run the
probe's workers on it against the fake SSE server, kill an actor mid-phase, and leave no raylet.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, ProbeSession, WorkloadSpec, eventloop, run_probe
from collectors.probe.client import RequestResult
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


def test_tracker_hands_on_results_and_in_flight_requests(server):
    from collectors.probe.client import StreamingClient, resolve_endpoint
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
    from diag.capture import CaptureWriter, load_capture
    from diag.tables import build_tables

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
    """One local Ray (2 CPUs) for the module; shut down after, and no raylet of it left."""
    ray = pytest.importorskip("ray")
    before = _raylets()
    from collectors.probe.ray_workers import runtime_env

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env())
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
    from diag.capture import load_capture
    from diag.tables import build_tables

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
    from diag.capture import load_capture
    from diag.tables import build_tables

    done_seen: list[int] = []
    cfg = _cfg(server.url("slow"), LoadSpec(concurrency=4, requests=40, warmup_requests=0), workers=2,
               output=tmp_path / "cap", ray_address="local", progress=lambda d, t, label: done_seen.append(d))

    async def main():
        async with ProbeSession(cfg) as s:
            phase = asyncio.ensure_future(s.phase(cfg.load))
            while not done_seen or done_seen[-1] < 4:
                await asyncio.sleep(0.05)
            victim = s.ray_workers.actors[1]
            ray_cluster.kill(victim, no_restart=True)
            return await phase

    outcome = eventloop.run(main())
    lost = [r for r in outcome.results if r.error == WORKER_LOST]
    assert lost and all(r.request_id.startswith("p1.") for r in lost)
    assert sum(1 for r in outcome.results if r.request_id.startswith("p0.") and r.ok) == 20  # the other worker's
    ids = [r.request_id for r in outcome.results]
    assert len(ids) == len(set(ids))
    assert any("worker 1" in n and "was lost" in n and "worker_lost" in n for n in outcome.notes)
    cap = load_capture(tmp_path / "cap")
    w1 = cap.meta["probe"]["ray"]["workers"][1]
    assert w1["state"] == "lost" and w1["lost"]["in_flight_marked"] == len(lost)
    assert cap.meta["probe"]["ray"]["lost_requests"] == len(lost)
    req = build_tables(cap).requests
    marked = req.loc[req["error"] == WORKER_LOST]
    assert sorted(marked["request_id"]) == sorted(r.request_id for r in lost)
    assert set(marked["trace_id"]) <= {s.headers["traceparent"].split("-")[1] for s in server.log}
    # worker 1's finished requests are in the capture too, from the spans the driver wrote for them
    got = {r.request_id for r in outcome.results if r.request_id.startswith("p1.") and r.ok}
    assert got and got <= set(req["request_id"])
