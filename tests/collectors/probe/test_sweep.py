"""Sweeps: labelled segments of one capture, and their stop rules."""

from __future__ import annotations

import pytest

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, SweepSpec, WorkloadSpec, run_sweep
from collectors.probe.sweep import SweepError, parse_values
from diag.ground.capture import load_capture
from diag.ground.tables import build_tables


def _cfg(url, tmp_path, **kw):
    return ProbeConfig(url, api="completions", load=LoadSpec(warmup_requests=kw.pop("warmup", 0)),
                       workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse("2")), timeout_s=5,
                       output=tmp_path / "cap", **kw)


def test_prompt_sweep_segments_in_one_capture(server, tmp_path):
    res = run_sweep(_cfg(server.url("ok"), tmp_path, warmup=1), SweepSpec("prompt", [64, 128, 256], requests_per_point=2))
    assert [s for s, _ in res.segments] == ["prompt=64", "prompt=128", "prompt=256"]
    assert server.max_in_flight == 1
    assert server.log[0].body["max_tokens"] == 2  # the compatibility check goes first
    words = sorted({len(s.body["prompt"].split()) for s in server.log[1:]})
    assert words[0] >= 60 and words[-1] >= 250
    req = build_tables(load_capture(tmp_path / "cap")).requests
    req = req.loc[~req["segment"].isin(["calibrate", "compat"])]
    measured = req.loc[~req["warmup"]]
    assert measured.groupby("segment").size().to_dict() == {"prompt=64": 2, "prompt=128": 2, "prompt=256": 2}
    assert req["warmup"].sum() == 3 and measured["client_ttft_s"].notna().all()
    assert res.sweep["stopped"] is None and res.sweep["points_run"] == ["prompt=64", "prompt=128", "prompt=256"]


def test_concurrency_sweep_stops_when_errors_appear(server, tmp_path):
    # the cap2 server answers 503 when more than 2 requests are in flight
    res = run_sweep(_cfg(server.url("cap2"), tmp_path), SweepSpec("concurrency", max_value=16, requests_per_point=8))
    labels = [s for s, _ in res.segments]
    assert labels == ["concurrency=1", "concurrency=2", "concurrency=4"]
    assert "errors appeared" in res.sweep["stopped"] and "http_5xx" in res.sweep["stopped"]
    assert res.segments[1][1]["requests"]["errors"] == 0


def test_concurrency_sweep_stops_on_broken_slo(server, tmp_path):
    from diag.ground.slo import parse_slo

    res = run_sweep(_cfg(server.url("slow"), tmp_path, slo=parse_slo("ttft_p99=50ms")),
                    SweepSpec("concurrency", [1, 2], requests_per_point=2))
    assert len(res.segments) == 1 and "SLO broken" in res.sweep["stopped"]


def test_rate_sweep(server, tmp_path):
    res = run_sweep(_cfg(server.url("ok"), tmp_path), SweepSpec("rate", [20, 40], requests_per_point=6))
    assert [s for s, _ in res.segments] == ["rate=20", "rate=40"]
    assert all(m["requests"]["ok"] == 6 for _, m in res.segments)


def test_prompt_sweep_stops_when_a_point_fails_entirely(server, tmp_path):
    res = run_sweep(_cfg(server.url("http400"), tmp_path), SweepSpec("prompt", [64, 128], requests_per_point=1))
    assert len(res.segments) == 1 and "every request failed" in res.sweep["stopped"]


def test_sweep_spec_values():
    assert SweepSpec("prompt", max_value=512).point_values() == [64, 128, 256, 512]
    assert SweepSpec("concurrency").point_values()[-1] == 64
    assert parse_values("1, 2,4") == [1, 2, 4]
    with pytest.raises(SweepError):
        parse_values("1,x")
    with pytest.raises(SweepError):
        SweepSpec("latency")
    with pytest.raises(SweepError):
        SweepSpec("concurrency", [1.5])


def test_prompt_sweep_stops_at_the_context_limit_and_records_it(server, tmp_path):
    from rules import run_rules

    # a server with a 1000-token context (vLLM's 400 past it) and a prefill that grows with the prompt
    res = run_sweep(_cfg(server.url("ctx-1000"), tmp_path, warmup=1), SweepSpec("prompt", requests_per_point=3))
    assert res.sweep["points_run"] == ["prompt=64", "prompt=128", "prompt=256", "prompt=512", "prompt=1024"]
    assert "prompt=1024 was refused as longer than the server's context" in res.sweep["stopped"]
    assert "between 512 and 1024 prompt tokens" in res.sweep["stopped"] and "states 1000 tokens" in res.sweep["stopped"]
    assert max(len(s.body["prompt"].split()) for s in server.log) < 1100  # nothing sent past the refused point
    meta = load_capture(tmp_path / "cap").meta
    limit = meta["probe"]["context_limit"]
    assert limit["refused_segments"] == ["prompt=1024"] and limit["context_limit_tokens"] == 1000
    assert limit["accepted_prompt_tokens"] == 512 and limit["refused_prompt_tokens"] == 1024 and limit["status"] == 400
    assert meta["sweep"]["context_limit"] == limit
    tables = build_tables(load_capture(tmp_path / "cap"))
    d = run_rules(tables)
    assert d.verdict.category != "failures" and not any(f.category == "failures" for f in d.findings)
    assert d.features.value("error_rate") == 0 and d.features.value("context_limit_refused_n") == 3
    assert "the experiment's limit, not failures" in next(p.reason for p in d.passed if p.rule_id == "failures")
    # the verdict is what the lengths below the limit show on their own
    req = tables.requests
    refused_start = int(req.loc[req["segment"] == "prompt=1024", "start_ns"].min())
    below = run_rules(tables, window_ns=(int(req["start_ns"].min()), refused_start))
    assert below.verdict.category == d.verdict.category and below.features.value("context_limit_refused_n") == 0


def test_a_plain_probe_refused_as_too_long_still_fails(server, tmp_path):
    from rules import run_rules

    # the user chose the length: the server refusing it is a failure, as before
    cfg = ProbeConfig(server.url("ctx-1000"), api="completions", load=LoadSpec(requests=6),
                      workload=WorkloadSpec(LengthSpec.parse("2048"), LengthSpec.parse("2")), timeout_s=5,
                      output=tmp_path / "cap")
    from collectors.probe import run_probe

    res = run_probe(cfg)
    assert res.metrics["requests"]["errors"] == 6
    meta = load_capture(tmp_path / "cap").meta
    assert "context_limit" not in meta["probe"]
    d = run_rules(build_tables(load_capture(tmp_path / "cap")))
    assert d.verdict.category == "failures" and "http_4xx x6" in d.verdict.title
