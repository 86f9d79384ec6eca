"""The ``frontend`` rule: time before the engine sees a request, told apart from network and tokenize.

Fast cases write captures through the span helpers (server spans with the bundled server's
front-end attributes; the simulator's client + server for the gap by load); the slow one runs
the real server with one HTTP worker under the real probe.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from collectors.spans import setup_tracing
from diag.ground import stages
from diag.ground.capture import load_capture
from diag.analysis.report.text import format_diagnosis
from diag.ground.tables import build_tables
from rules import evidence, run_rules
from support.simcap import Client, Engine, Phase, simulate, tables_of

NS = 1_000_000_000
MS = 1e-3


def _server_capture(path: Path, n: int, http_wait_s, tok_wait_s: float, tokenize_s: float) -> Path:
    """``n`` requests: front-end wait (``http_wait_s(i)`` + ``tok_wait_s``), tokenize, a short queue,
    a 5 ms prefill and 8 tokens 4 ms apart; engine steps beside them."""
    sink = setup_tracing("engine", capture_dir=path, export_interval_s=60)
    t0 = time.time_ns() - 3600 * NS
    for i in range(n):
        s = t0 + i * 200_000_000
        hw = http_wait_s(i)
        w = hw + tok_wait_s
        r = sink.start_request(f"r{i}", start_ns=s, attributes={
            stages.GEN_AI_USAGE_INPUT_TOKENS: 64, stages.ATTR_FRONTEND_WAIT_S: w,
            stages.ATTR_FRONTEND_HTTP_WAIT_S: hw, stages.ATTR_FRONTEND_TOKENIZER_WAIT_S: tok_wait_s})
        at = s + int(w * NS)
        for name, dur_s in ((stages.TOKENIZE, tokenize_s), (stages.QUEUE, 0.0003), (stages.PREFILL, 0.005)):
            r.record_stage(name, at, at + int(dur_s * NS))
            at += int(dur_s * NS)
        for k in range(8):
            r.add_token_time(at + k * 4_000_000)
        r.end(end_ns=at + 8 * 4_000_000)
        sink.record_step(at - 5_000_000, at, {stages.ATTR_STEP_PREFILL_TOKENS: 64, stages.ATTR_STEP_DECODE_SEQS: 0,
                                              stages.ATTR_STEP_WAITING: 0, stages.ATTR_STEP_RUNNING: 1})
    sink.shutdown()
    return path


def _find(d, rule_id: str):
    return next((f for f in d.findings if f.rule_id == rule_id), None)


def _passed(d, rule_id: str) -> str:
    return next(p.reason for p in d.passed if p.rule_id == rule_id)


def test_requests_waiting_for_an_http_worker_are_the_front_end(tmp_path: Path) -> None:
    cap = _server_capture(tmp_path / "srv", 30, lambda i: 0.02 + 0.01 * (i % 4), 0.0002, 0.0005)
    d = run_rules(build_tables(load_capture(cap)))
    assert d.verdict.category == "frontend", format_diagnosis(d)
    f = d.verdict
    assert "HTTP workers" in f.title and f.confidence >= 0.8
    rows = {e.key: e for e in f.evidence}
    assert rows[evidence.FRONTEND_WAIT_SHARE_TAIL].crossed
    assert rows[evidence.ENGINE_QUEUE_SHARE_TAIL].value < 0.05
    # the checks are in the terms of the engine the capture came from (the bundled server), not every engine's
    assert any("--http-workers" in c for c in f.next_checks)
    assert not any("--threads-http" in c or "--api-server-count" in c for c in f.next_checks)


def test_a_small_front_end_wait_is_not_a_finding(tmp_path: Path) -> None:
    cap = _server_capture(tmp_path / "srv", 30, lambda i: 0.0005, 0.0002, 0.0005)
    d = run_rules(build_tables(load_capture(cap)))
    assert _find(d, "frontend") is None
    assert "front-end wait" in _passed(d, "frontend")


def test_waiting_for_a_tokenizer_busy_with_slow_tokenization_is_tokenize(tmp_path: Path) -> None:
    """One tokenizer thread and a slow tokenizer: requests queue for the thread, but the cause is the
    cost per prompt token -- the tokenize rule's, not the front end's pool."""
    cap = _server_capture(tmp_path / "srv", 30, lambda i: 0.0, 0.015, 0.015)
    d = run_rules(build_tables(load_capture(cap)))
    assert d.verdict.category == "tokenize", format_diagnosis(d)
    assert _find(d, "frontend") is None and "see tokenize" in _passed(d, "frontend")


def _sweep(conc_levels=(1, 2, 4, 8)) -> list[Phase]:
    return [Phase(f"concurrency={c}", 12 * c, 64, 16, conc=c) for c in conc_levels]


def test_a_gap_outside_the_engine_clock_that_grows_with_load_is_the_front_end(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(), _sweep(), Client(net_s=1 * MS, frontend_s_per_conc=8 * MS))
    d = run_rules(tables_of(dirs))
    assert d.verdict.category == "frontend", format_diagnosis(d)
    rows = {e.key: e for e in d.verdict.evidence}
    assert rows[evidence.GAP_RISE_X].value > 5
    net = _find(d, "network")
    assert net is None or "frontend" in net.demoted_by


def test_a_fixed_network_delay_is_not_the_front_end(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(), _sweep(), Client(net_s=30 * MS))
    d = run_rules(tables_of(dirs))
    assert d.verdict.category == "network", format_diagnosis(d)
    assert _find(d, "frontend") is None and "a fixed latency" in _passed(d, "frontend")


def test_client_only_at_one_level_names_the_sweep(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(), [Phase("c4", 40, 64, 16, conc=4)], Client(net_s=30 * MS), server=False)
    d = run_rules(tables_of(dirs, ("client",)))
    assert _find(d, "frontend") is None
    reason = _passed(d, "frontend")
    assert "cannot be split into front end and network" in reason and "--sweep concurrency" in reason


@pytest.mark.slow
def test_real_server_with_one_http_worker_is_the_front_end(tmp_path: Path) -> None:
    """``ttft serve --inject frontend_workers=1`` under 4 closed-loop streams: server-side and joined,
    the verdict is frontend (the engine's queue stayed empty)."""
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe

    from support.engine_testutil import serve_process
    from support.engine_testutil import LAUNCH

    cmd = [sys.executable, "-c", LAUNCH, "serve", "--port", "0", "--capture", str(tmp_path / "srv"), "--threads", "1",
           "--inject", "frontend_workers=1"]
    with serve_process(cmd) as (proc, line):
        m = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        assert m, line
        run_probe(ProbeConfig(m.group(1), load=LoadSpec(concurrency=4, requests=24, warmup_requests=2),
                              workload=WorkloadSpec(LengthSpec.parse("32"), LengthSpec.parse("12")), timeout_s=60,
                              output=tmp_path / "cli"))
    for sides in (("srv",), ("cli", "srv")):
        d = run_rules(build_tables([load_capture(tmp_path / s) for s in sides]))
        assert d.verdict.category == "frontend", format_diagnosis(d)
        assert "HTTP workers" in d.verdict.title


def _dynamo_series(path: Path, frontend_s: float, tokenize_s: float) -> Path:
    """Ten 5 s windows of a Dynamo front end's canonical series (TTFT 0.8 s, transit 1 ms)."""
    import pandas as pd

    from diag.ground.capture import CaptureWriter

    t0 = time.time() - 3600
    rows = []
    for k in range(10):
        ts = t0 + 5 * k
        for name, v in ((stages.SERIES_TTFT_S, 0.8), (stages.SERIES_FRONTEND_TIME_S, frontend_s),
                        (stages.SERIES_TOKENIZE_TIME_S, tokenize_s), (stages.SERIES_WORKER_TTFT_S, 0.8 - frontend_s),
                        (stages.SERIES_TRANSIT_S, 0.001), (stages.SERIES_REQUESTS_PER_S, 4.0)):
            rows.append({"ts_s": ts, "source": "prometheus", "series": name, "entity": "", "value": v})
    with CaptureWriter(path, {"engine": "dynamo"}) as w:
        w.write_series("prometheus", pd.DataFrame(rows))
    return path


def test_dynamo_front_end_time_beyond_its_tokenizer_is_the_front_end(tmp_path: Path) -> None:
    d = run_rules(build_tables(load_capture(_dynamo_series(tmp_path / "a", 0.6, 0.04))))
    f = _find(d, "frontend")
    assert f is not None and d.named == "frontend", format_diagnosis(d)  # Dynamo's metrics alone: maybe under the floor
    # the same front-end time spent in its tokenizer is tokenize's
    d = run_rules(build_tables(load_capture(_dynamo_series(tmp_path / "b", 0.6, 0.55))))
    assert _find(d, "frontend") is None and "see tokenize" in _passed(d, "frontend")
    assert d.named == "tokenize", format_diagnosis(d)


def _sweep_with_metrics(tmp: Path, engine_args: list[str]):
    """A real ``ttft serve`` swept at concurrency 1-8 by the real probe scraping its /metrics; the client capture."""
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec
    from collectors.probe.run import run_sweep
    from collectors.probe.sweep import SweepSpec

    from support.engine_testutil import serve_process
    from support.engine_testutil import LAUNCH

    cmd = [sys.executable, "-c", LAUNCH, "serve", "--port", "0", "--threads", "1", *engine_args]
    with serve_process(cmd) as (proc, line):
        url = re.search(r"(http://127\.0\.0\.1:\d+)", line).group(1)
        run_sweep(ProbeConfig(url, load=LoadSpec(concurrency=1, warmup_requests=1), metrics_url=url, timeout_s=60,
                              workload=WorkloadSpec(LengthSpec.parse("32"), LengthSpec.parse("16")), output=tmp / "cli"),
                  # by time, not count: a quiet box serves 8 requests in a fraction of a second, and the
                  # engine's gauges need several scrapes (every 0.5 s) while requests are in flight
                  SweepSpec("concurrency", values=[1, 2, 4, 8], duration_per_point_s=2.0))
    return run_rules(build_tables([load_capture(tmp / "cli")]))


@pytest.mark.slow
def test_client_with_the_engines_gauges_tells_a_front_end_line_from_the_engines(tmp_path: Path) -> None:
    """From the client and the engine's /metrics alone: two HTTP workers under a sweep to 8 streams is the
    front end (most of the client's requests in flight are not in the engine); one request at a time in
    the engine (--max-running 1) is queue, the engine counting every request in flight."""
    d = _sweep_with_metrics(tmp_path / "fe", ["--inject", "frontend_workers=2"])
    assert d.named == "frontend", format_diagnosis(d)  # the verdict, or under the floor the leading candidate
    assert d.features.value("engine_unseen_share") >= 0.5
    d = _sweep_with_metrics(tmp_path / "q", ["--max-running", "1"])
    assert d.named == "queue", format_diagnosis(d)
    assert d.features.value("engine_unseen_share") < 0.2 and _find(d, "frontend") is None


def test_the_client_alone_is_told_what_decides_only_when_no_path_measured_anything() -> None:
    from rules.base import REGISTRY, checks_of
    from support.rulectx import rule_context
    from rules.features import Feature, Features

    assert [c.id for c in checks_of("frontend")] == ["frontend.spans", "frontend.gap", "frontend.unseen",
                                                     "frontend.dynamo", "frontend.client_only"]
    def judge(**values: float) -> object:
        feats = Features()
        for name, value in {"client_only": 1.0, "requests_n": 40.0, **values}.items():
            feats.add(Feature(name, value, "", True))
        return REGISTRY["frontend"].evaluate(rule_context("frontend", feats, client_only=True))

    assert str(judge()).startswith("client only at one load level")
    assert str(judge(ttft_concurrency_ratio=3.0)).startswith("client only: TTFT growing with load")
    # a gap that does not grow with load is the answer, not the client-only caveat
    assert judge(client_server_gap_concurrency_ratio=1.0) == (
        "the client-server gap grows 1.00x with load (< 2x): a fixed latency")
