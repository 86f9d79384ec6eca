"""``ttft diagnose`` end to end against the bundled engine (``ttft serve`` in its own process),
with a fault injected and healthy: the verdict, the steps and why, the one capture that
``ttft analyze`` and ``ttft report`` read afterwards, ``--metrics`` alongside, and Ctrl-C.

Slow: each case starts an engine and probes it for 5-30 s on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from diag import cli
from diag.analysis import analyze_paths
from diag.analysis.diagnose import CONFIDENT, DiagnoseConfig, DiagnoseResult, PlanConfig, format_result, run_diagnose
from diag.analysis.report.text import format_analysis
from diag.analysis.scenarios.engine_process import EngineProcess
from rules import OUTCOMES, evidence

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[4]


def _diagnose(args: list[str], out: Path, **kw) -> DiagnoseResult:  # noqa: ANN003
    """Start ``ttft serve ARGS --threads 1``, run diagnose against it into ``out``, stop it."""
    metrics = kw.pop("metrics", False)
    with EngineProcess([*args, "--threads", "1"]) as eng:
        cfg = DiagnoseConfig(eng.url, out, kw.pop("plan", PlanConfig(budget_s=90)),
                             metrics_url=eng.url + "/metrics" if metrics else None, **kw)
        res = run_diagnose(cfg)
    print(format_result(res, format_analysis(res.analysis) if res.analysis else None))  # shown on failure
    return res


def _stages(res: DiagnoseResult) -> list[str]:
    return [r.step.stage for r in res.records]


def _check_capture(res: DiagnoseResult) -> None:
    """One capture with every step's segment; ``ttft analyze`` gives the same verdict; ``ttft
    report`` writes; meta.json records the steps and why."""
    again = analyze_paths([res.capture], slo=res.analysis.slo)
    assert again.diagnosis.verdict.category == res.analysis.diagnosis.verdict.category
    segments = set(again.tables.requests["segment"].dropna())
    assert {f"{r.step.kind}={r.step.value:g}" if r.step.kind != "baseline" else "concurrency=1"
            for r in res.records} <= segments
    meta = json.loads((res.capture / "meta.json").read_text())
    assert meta["kind"] == "diagnose" and len(meta["diagnose"]["steps"]) == len(res.records)
    assert all(s["reason"] for s in meta["diagnose"]["steps"])
    # confident or not is said, and a verdict under the bar names what would decide
    cert = res.certainty()
    assert meta["diagnose"]["certainty"]["confident"] == cert.confident
    # a leading candidate under the floor (the verdict healthy or inconclusive) is what the certainty
    # reads: never confident, however sure the healthy verdict beside it is
    d = res.analysis.diagnosis
    assert cert.confident == (d.leading is None and d.verdict.confidence >= CONFIDENT and cert.category not in OUTCOMES)
    assert (cert.verdict == d.verdict.category) if d.leading is not None else cert.verdict is None
    assert cert.confident or (cert.why_not and cert.decide)
    assert cert.lines()[0] in format_result(res)
    assert cli.main(["report", str(res.capture), "-o", str(res.capture.parent / "report.html")]) == 0


def _view_verdict(capture: Path) -> str:
    """The verdict panel of ``ttft view CAPTURE`` (the Textual app, driven headless)."""
    from tui.app import TTFTApp
    from tui.sources import CaptureSource

    async def main() -> str:
        app = TTFTApp(CaptureSource(capture), refresh_s=0.2)
        async with app.run_test(size=(160, 50)) as pilot:
            for _ in range(400):
                vm = app.last_vm
                if vm is not None and not vm.verdict.pending and not vm.verdict.stale:
                    return vm.verdict.category
                await pilot.pause(0.05)
        raise AssertionError("ttft view did not settle on the capture")

    return asyncio.run(main())


def test_one_request_at_a_time_is_queue_from_the_ramp(tmp_path: Path) -> None:
    res = _diagnose(["--max-running", "1"], tmp_path / "cap", metrics=True)
    v = res.analysis.diagnosis.verdict
    assert v.category == "queue", v.title
    # the engine's queue-time histogram measured the wait the sweep infers: not a black-box guess
    row = next(e for e in v.evidence if e.key == evidence.QUEUE_SHARE_METRICS)
    assert row.crossed and v.confidence >= 0.7 and not v.black_box, (v.confidence, v.title)
    assert not any(f.category == "healthy" for f in res.analysis.diagnosis.findings)
    stages = _stages(res)
    assert stages[0] == "baseline" and stages.count("ladder") >= 3 and stages.count("ramp") >= 2
    ramp = [r for r in res.records if r.step.stage == "ramp"]
    assert "TTFT broke" in res.stopped and "TTFT broke" in ramp[-1].step.reason  # chosen from what c=2 showed
    assert (res.capture / "series").is_dir() and any((res.capture / "series").glob("*prometheus*"))
    assert res.time_to_verdict_s is not None and res.time_to_verdict_s <= res.probing_s <= 90
    _check_capture(res)
    assert "queue" in _view_verdict(res.capture).lower()
    # the tool's own work between steps (the running verdict, the engine's /metrics parsed) is not
    # the client lagging: one client process, and its stalls at the first tokens a small share of TTFT
    assert not any(f.category == "loadgen" for f in res.analysis.diagnosis.findings)
    health = json.loads((res.capture / "meta.json").read_text())["client_health"]
    assert health["processes"] == 1 and health["segments"] == len(res.records) + 1
    assert health["saturated"] is False and health["first_token"]["share"] < 0.2, health


def test_the_ladder_records_the_context_limit_it_meets_and_its_refusals_are_not_failures(tmp_path: Path) -> None:
    res = _diagnose(["--max-context", "512"], tmp_path / "cap", plan=PlanConfig(budget_s=40))
    meta = json.loads((res.capture / "meta.json").read_text())
    limit = meta["probe"]["context_limit"]
    assert limit["how"] == "ttft diagnose: prompt ladder" and limit["context_limit_tokens"] == 512
    assert limit["accepted_prompt_tokens"] < limit["refused_prompt_tokens"] <= 512
    (seg,) = limit["refused_segments"]
    rung = next(r.point for r in res.records if r.point is not None and r.point.segment == seg)
    assert rung.over_context == 1 and rung.failed == 0 and rung.refused_too_long  # one request found it
    assert not any(r.step.kind == "prompt" and r.step.value > rung.value for r in res.records)
    assert "refused as longer than the server's context" in format_result(res)
    d = res.analysis.diagnosis
    assert d.features.value("context_limit_refused_n") == 1 and d.features.value("requests_failed_n") == 0
    assert d.verdict.category != "failures"
    report = tmp_path / "report.md"
    assert cli.main(["report", str(res.capture), "-o", str(report)]) == 0
    assert " 0 failed" in report.read_text() and " 1 failed" not in report.read_text()


class _UnstatedLimit:
    """A pass-through HTTP proxy (127.0.0.1, its own thread and event loop, one client session to
    ``upstream`` for its life) that drops ``max_model_len`` from ``GET /v1/models``: a server that
    states no context limit (transformers serve lists none), so only its refusals reveal it.
    Streams pass chunk by chunk."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(request.method, self.upstream + request.rel_url.path_qs, data=body,
                                         headers=headers) as up:
            if request.path == "/v1/models":
                doc = await up.json(content_type=None)
                for entry in doc.get("data", []):
                    entry.pop("max_model_len", None)
                return web.json_response(doc, status=up.status)
            out = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")})
            await out.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
            except ConnectionResetError:  # the client hung up (a cancelled request): nothing to pass on
                pass
            return out

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def __enter__(self) -> _UnstatedLimit:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def test_a_follow_ups_long_prompts_refused_past_an_unstated_context_are_its_limit_not_failures(tmp_path: Path) -> None:
    # a 1100-token context the server does not state: the ladder's rungs (to 512 tokens) fit, and the
    # mixed follow-up's long prompt, sized to prefill for twice the ITL target (far past 1100 tokens),
    # is refused as longer than the context: the experiment's limit, not the server failing
    with EngineProcess(["--max-context", "1100", "--threads", "1"]) as eng, _UnstatedLimit(eng.url) as proxy:
        cfg = DiagnoseConfig(proxy.url, tmp_path / "cap", PlanConfig(budget_s=90), slo={"itl_p99": 0.5})
        res = run_diagnose(cfg)
    print(format_result(res, format_analysis(res.analysis) if res.analysis else None))  # shown on failure
    (mixed,) = _mixed(res)
    assert mixed.step.value > 1100 and mixed.point.over_context == 12 and mixed.point.failed == 0
    limit = json.loads((res.capture / "meta.json").read_text())["probe"]["context_limit"]
    assert mixed.point.segment in limit["refused_segments"]
    d = res.analysis.diagnosis
    assert d.features.value("context_limit_refused_n") >= 12 and d.features.value("requests_failed_n") == 0
    assert d.verdict.category != "failures" and not any(f.category == "failures" for f in d.findings)


def test_a_front_end_pool_is_not_called_an_engine_queue_when_the_engines_metrics_say_none(tmp_path: Path) -> None:
    """One HTTP worker: the client sees requests served one at a time, as behind a queue, but the
    engine's own queue time is ~0: the queue finding stays a black-box guess, weakened by it."""
    res = _diagnose(["--inject", "frontend_workers=1"], tmp_path / "cap", metrics=True)
    d = res.analysis.diagnosis
    q = next((f for f in d.findings if f.category == "queue"), None)
    if q is not None:
        row = next(e for e in q.evidence if e.key == evidence.QUEUE_SHARE_METRICS)
        assert not row.crossed and row.value < 0.1 and q.black_box and q.confidence < 0.5, (q.confidence, q.title)
    assert d.verdict.category not in ("healthy", "queue") or d.verdict.confidence < 0.5, d.verdict.title


@pytest.mark.parametrize("cache", [False, True], ids=["cache-off", "cache-on"])
def test_when_prompt_work_leads_a_repeated_prefix_tells_whether_the_server_reuses_it(tmp_path: Path, cache: bool) -> None:
    """Concurrency capped at 1 (no ramp): the ladder says prompt work; the prefix follow-up then
    tells whether the server reuses a repeated prefix. Cache off: repeats cost a first use -> a
    prefix_cache finding, conditional (the prefix was diagnose's own test, not known to be the
    users' prompts), after the verdict of what was measured, prompt work. On: they are spared ->
    the prefix_cache rule passes, saying the cache hits."""
    res = _diagnose(["--enable-prefix-caching"] if cache else [], tmp_path / "cap",
                    plan=PlanConfig(budget_s=90, max_concurrency=1))
    follow = [r for r in res.records if r.step.stage == "follow-up"]
    assert [r.step.kind for r in follow] == ["prefix"] and "prefix caching" in follow[0].step.reason
    assert follow[0].point is not None and follow[0].point.ok == follow[0].step.requests
    d = res.analysis.diagnosis
    # the ladder names prompt work (as the verdict, or under the floor as the leading candidate)
    assert d.named == "prefill_compute", d.verdict.title
    if cache:
        assert any(p.rule_id == "prefix_cache" and "the cache hits" in p.reason for p in d.passed)
    else:
        pc = next(f for f in d.findings if f.category == "prefix_cache")
        assert pc.conditional and "if your prompts share one" in pc.title and not d.verdict.demoted_by
        saving = next(e for e in pc.evidence if e.key == evidence.PREFIX_SAVING)
        assert saving.crossed and saving.value < 0.5
        # users who say their prompts share a prefix (--workload) are judged for it: measured, not
        # conditional; users who say they share none are not told about a cache
        theirs = _with_workload(res, shared_prefix_tokens=512)
        mine = next(f for f in theirs.findings if f.category == "prefix_cache")
        assert not mine.conditional and mine.confidence > pc.confidence
        none = _with_workload(res, shared_prefix_tokens=0)
        assert any(p.rule_id == "prefix_cache" and "your prompts share none" in p.reason for p in none.passed)
    _check_capture(res)


def _with_workload(res: DiagnoseResult, **workload):  # noqa: ANN003, ANN202
    """The run's capture diagnosed again as if the users had said ``--workload`` this."""
    from dataclasses import replace

    from rules import run_rules

    tables = analyze_paths([res.capture], slo=res.analysis.slo).tables
    return run_rules(replace(tables, meta={**tables.meta, "users_workload": workload}), slo=res.analysis.slo)


def test_a_slow_tokenizer_is_named_from_the_prompt_ladder(tmp_path: Path) -> None:
    res = _diagnose(["--inject", "tokenize_ms_per_token=3"], tmp_path / "cap")
    assert res.analysis.diagnosis.named == "tokenize", res.analysis.diagnosis.verdict.title
    ladder = [r for r in res.records if r.step.stage == "ladder"]
    assert len(ladder) >= 3 and "per-token part" in ladder[0].step.reason
    _check_capture(res)


def test_a_healthy_engine_within_a_generous_slo_is_healthy_with_its_goodput(tmp_path: Path) -> None:
    plan = PlanConfig(budget_s=60, max_concurrency=4)
    res = _diagnose([], tmp_path / "cap", plan=plan, slo={"ttft_p99": 2.0, "tpot_p99": 0.2})
    assert res.analysis.diagnosis.verdict.category == "healthy", res.analysis.diagnosis.verdict.title
    # healthy never ends the run early: the design ran (the cap, or a break the SLO absorbed)
    assert not res.stopped.startswith("the verdict is confident") and any(r.step.value == 4 for r in res.records)
    g = res.goodput()
    assert g["held"] == "concurrency=4" and g["goodput_rps"] > 0
    assert res.startup and res.startup["first_ttft_s"] > 0
    _check_capture(res)


def test_a_small_kv_cache_is_named_from_the_long_ramp(tmp_path: Path) -> None:
    # 51 blocks of 16 tokens: about 8 short requests (64 + 32 tokens) fit at once, 2-3 long ones
    res = _diagnose(["--policy", "chunked", "--chunk-size", "16", "--kv-blocks", "51", "--block-size", "16"],
                    tmp_path / "cap")
    d = res.analysis.diagnosis
    v = d.leading or d.verdict  # client only: named, as the verdict or the leading candidate
    assert d.named == "kv_cache", d.verdict.title
    assert "Fewer requests are admitted the more tokens each holds" in v.title and v.black_box
    long = [r for r in res.records if r.step.kind == "long"]
    assert len(long) >= 3 and "limit in tokens" in long[0].step.reason
    feats = res.analysis.diagnosis.features
    # about 2-3 long streams fit the 816 tokens at once, 8 short ones: fewer decode at once at the
    # long prompt than the short ramp reached (which may stop at 4 when decode breaks on 2 cores)
    assert feats.value("long_ramp_decode_cap") <= 3 and feats.value("long_ramp_knee_ratio") > 1
    _check_capture(res)


def _mixed(res: DiagnoseResult) -> list:
    return [r for r in res.records if r.step.kind == "mixed"]


def test_short_prompts_waiting_for_a_long_ones_chunks_are_head_of_line_from_the_mixed_follow_up(tmp_path: Path) -> None:
    # chunked prefill with no cap on partial prefills: a running partial prefill takes each step's
    # 48-token chunk, so a short prompt behind a long one waits for its whole prefill. (With 16-token
    # chunks the long ramp's prompts prefill one at a time for as long as they decode, which caps
    # how many decode at once as a KV limit does: the long ramp then reads kv_cache.)
    res = _diagnose(["--policy", "chunked", "--chunk-size", "48"], tmp_path / "cap")
    (mixed,) = _mixed(res)
    assert "head-of-line" in mixed.step.reason and mixed.step.value >= 4 * PlanConfig().input_tokens
    d = res.analysis.diagnosis
    v = d.leading or d.verdict  # client only: named, as the verdict or the leading candidate
    assert d.named == "head_of_line", d.verdict.title
    row = next(e for e in v.evidence if e.key == evidence.HOL_TTFT_X)
    assert row.value >= 3.0 and row.crossed
    assert "ttft diagnose's own test" in (v.note or "")
    # users whose prompts do not mix lengths (--workload prompt_tokens=600-900) never wait behind another's
    # prefill: not head-of-line for them
    alike = _with_workload(res, prompt_tokens=[600, 900])
    assert alike.named != "head_of_line"
    assert any(p.rule_id == "head_of_line" and "do not mix lengths" in p.reason for p in alike.passed)
    assert _with_workload(res, prompt_tokens=[16, 900]).named == "head_of_line"
    _check_capture(res)


@pytest.mark.parametrize("engine,stalls", [(["--policy", "prefill-first"], True),
                                           (["--policy", "chunked", "--chunk-size", "32", "--max-partial-prefills",
                                             "4"], False)], ids=["whole-prompt", "chunked-shared"])
def test_an_itl_target_is_judged_with_long_prompts_among_the_streams(tmp_path: Path, engine: list[str],
                                                                       stalls: bool) -> None:
    # the long prompt prefills for at least twice the target alone (about 500 ms here): a prefill
    # that runs whole, ahead of decode, stalls the running streams past it; 32-token chunks shared
    # with the short prompts do not. The target sits well apart from both: the chunked steps' p99
    # gap is ~40 ms on a quiet 2-core box and passed 60 ms on a loaded CI one
    res = _diagnose(engine, tmp_path / "cap", slo={"ttft_p99": 5.0, "itl_p99": 0.15})
    (mixed,) = _mixed(res)
    assert "ITL target of 150.0 ms" in mixed.step.reason
    d = res.analysis.diagnosis
    mixed_itl = d.features.value("itl_mixed_slo")["itl_p99"]
    assert mixed_itl["met"] is (not stalls)
    if stalls:  # the ITL target is broken: interference may be the verdict (rules.verdict)
        assert d.named == "interference", d.verdict.title
        named = d.leading or d.verdict
        assert any(e.key == evidence.slo_mixed("itl_p99") and e.crossed for e in named.evidence)
    else:
        assert d.named not in ("interference", "head_of_line"), d.verdict.title
    _check_capture(res)


def test_a_server_still_loading_its_model_is_a_cold_start_from_its_first_answer(tmp_path: Path) -> None:
    # the engine listens at once and loads for 2.5 s: diagnose's API detection waits for it,
    # before any request of the run; every run request is warm
    res = _diagnose(["--lazy-load", "--inject", "load_delay_s=2.5"], tmp_path / "cap")
    d = res.analysis.diagnosis
    v = d.leading or d.verdict
    assert d.named == "cold_start", d.verdict.title
    row = next(e for e in v.evidence if e.key == evidence.COLD_FIRST_CONTACT)
    assert row.value >= 2.0
    assert res.startup["startup_s"] >= 2.0  # and start-up is reported apart
    meta = json.loads((res.capture / "meta.json").read_text())
    assert meta["probe"]["first_contact"]["request"] == "api_detection"
    _check_capture(res)


def test_a_server_that_refuses_connections_while_it_loads_is_waited_for_and_reported_apart(tmp_path: Path) -> None:
    # as vLLM does: the port is taken while the model loads (3 s here, after torch's import) and
    # nothing answers until it is loaded; diagnose starts at once, waits, then diagnoses
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    eng = EngineProcess(["--port", str(port), "--inject", "load_delay_s=3", "--threads", "1"])
    starting = threading.Thread(target=eng.start, daemon=True)
    starting.start()
    try:
        res = run_diagnose(DiagnoseConfig(f"http://127.0.0.1:{port}", tmp_path / "cap", PlanConfig(budget_s=60),
                                          wait_ready_s=120))
    finally:
        starting.join(180)
        eng.stop()
    text = format_result(res, format_analysis(res.analysis) if res.analysis else None)
    print(text)
    assert res.startup["not_serving_s"] >= 3.0 and res.startup["not_serving"] == ["connection refused"]
    assert "start-up: the server was not serving for" in text
    assert res.analysis.diagnosis.verdict.category not in ("failures", "no_data", "cold_start")
    assert any("not serving for" in n and "not TTFT" in n for n in res.analysis.diagnosis.notes)
    assert res.analysis.decomposition["requests"] >= 10
    _check_capture(res)


def test_ctrl_c_leaves_a_valid_diagnosed_capture(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    with EngineProcess(["--max-running", "1", "--threads", "1"]) as eng:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # Ctrl-C as a terminal delivers it: the child's SIGINT at its default even when this test run was
        # started as a background job, which ignores SIGINT for every process it starts (a shell's `cmd &`)
        proc = subprocess.Popen([sys.executable, "-m", "diag", "diagnose", eng.url, "-o", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the live progress: interrupt once the ladder is under way
            seen.append(line)
            if "step 3:" in line:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        stderr = "".join(seen) + stderr
    assert proc.returncode == 130, stderr[-2000:]
    assert "stopped: interrupted (Ctrl-C)" in stdout and "verdict:" in stdout
    meta = json.loads((out / "meta.json").read_text())
    assert meta["diagnose"]["interrupted"] is True
    assert "step 3:" in stderr and "step 5:" not in stderr
    a = analyze_paths([out])
    assert a.decomposition["requests"] >= 8 and a.diagnosis is not None


def test_a_joined_server_capture_makes_the_verdict_confident_and_a_rate_ramp_finds_the_queue(tmp_path: Path) -> None:
    """``--join`` the engine's own capture (written live by ``ttft serve --capture``): the queue is
    measured, not inferred, and the run stops on the confident verdict -- but only after the ramp
    (at concurrency 1 the joined spans say prefill_compute, confidently, of a server that queues).
    Then ``--ramp rate``: open-loop arrivals from half the lone request's service rate."""
    srv = tmp_path / "srv"
    with EngineProcess(["--max-running", "1", "--threads", "1"], capture_dir=srv) as eng:
        joined = run_diagnose(DiagnoseConfig(eng.url, tmp_path / "joined", PlanConfig(budget_s=60), join=[str(srv)]))
        rate = run_diagnose(DiagnoseConfig(eng.url, tmp_path / "rate", PlanConfig(budget_s=60, ramp="rate")))
    print(format_result(joined, format_analysis(joined.analysis)))
    print(format_result(rate, format_analysis(rate.analysis)))
    v = joined.analysis.diagnosis.verdict
    assert v.category == "queue" and not v.black_box and v.confidence >= 0.7, v.title
    assert joined.stopped.startswith("the verdict is confident: queue")
    assert sum(r.step.kind == "concurrency" for r in joined.records) >= 2
    assert rate.analysis.diagnosis.named == "queue", rate.analysis.diagnosis.verdict.title
    kinds = [r.step.kind for r in rate.records]
    assert "rate" in kinds and "concurrency" not in kinds
    first_rate = next(r.step for r in rate.records if r.step.kind == "rate")
    base = rate.records[0].point
    assert first_rate.value == pytest.approx(0.5 / base.e2e_p50_s, rel=0.05)
