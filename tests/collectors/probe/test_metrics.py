"""Metric definitions on hand-made results (no server)."""

from __future__ import annotations

import pytest

from collectors.probe.results import RequestResult
from collectors.probe.metrics import compute_metrics, distribution, format_metrics, request_meets_slo
from diag.ground.slo import parse_slo

MS = 1_000_000


def _r(i, ttft_ms, gaps_ms, out=None, error=None, warmup=False, usage=True, wait_ms=0, req_out=None):
    start = 10_000 * MS * (i + 1)
    t = start + ttft_ms * MS
    times = [t]
    for g in gaps_ms:
        t += g * MS
        times.append(t)
    n = out if out is not None else len(times)
    return RequestResult(f"r{i}", start_ns=start, scheduled_ns=start - wait_ms * MS, token_times_ns=times if error is None else [],
                         first_content_ns=times[0] if error is None else None, last_ns=times[-1] if error is None else None,
                         error=error, error_detail="boom" if error else None, warmup=warmup,
                         usage_output_tokens=n if usage and error is None else None, usage_input_tokens=100,
                         requested_output_tokens=req_out)


def test_distribution_shape():
    d = distribution([1, 2, 3, 4])
    assert d["count"] == 4 and d["p50"] == 2.5 and d["max"] == 4 and d["mean"] == 2.5
    assert distribution([])["p99"] is None


def test_ttft_itl_tpot_e2e_definitions():
    rs = [_r(0, 100, [10, 20, 30]), _r(1, 200, [10])]
    m = compute_metrics(rs, duration_s=2.0)
    assert m["ttft_s"]["p50"] == pytest.approx(0.15)
    # ITL is pooled per chunk: 4 gaps in all
    assert m["itl_s"]["count"] == 4 and m["itl_s"]["max"] == pytest.approx(0.03)
    # TPOT = (E2E - TTFT) / (n - 1): (60 ms)/3 and (10 ms)/1
    assert sorted(round(v, 6) for v in (rs[0].tpot_s, rs[1].tpot_s)) == [0.01, 0.02]
    assert m["e2e_s"]["max"] == pytest.approx(0.21)
    assert m["throughput"]["requests_per_s"] == pytest.approx(1.0)
    assert m["throughput"]["output_tokens_per_s"] == pytest.approx(3.0)
    assert m["throughput"]["input_tokens_per_s"] == pytest.approx(100.0)


def test_tpot_uses_usage_tokens_not_chunks():
    r = _r(0, 100, [10, 10], out=9)  # 3 chunks but 9 tokens (e.g. speculative decoding)
    assert r.tpot_s == pytest.approx(0.020 / 8)


def test_errors_by_kind_and_warmup_excluded():
    rs = [_r(0, 100, [10]), _r(1, 1, [], error="http_5xx"), _r(2, 1, [], error="http_5xx"),
          _r(3, 1, [], error="timeout"), _r(4, 900, [10], warmup=True)]
    m = compute_metrics(rs, 1.0)
    assert m["requests"] == {"total": 4, "ok": 1, "errors": 3, "warmup_excluded": 1, "over_context": 0}
    assert list(m["errors"]) == ["http_5xx", "timeout"]
    assert m["errors"]["http_5xx"]["count"] == 2 and m["errors"]["http_5xx"]["fraction"] == 0.5
    assert m["ttft_s"]["max"] == pytest.approx(0.1)


def test_goodput_under_slo():
    slo = parse_slo("ttft_p99=150ms,tpot_p99=15ms")
    rs = [_r(0, 100, [10, 10]), _r(1, 200, [10]), _r(2, 100, [20, 20]), _r(3, 1, [], error="timeout")]
    assert [request_meets_slo(r, slo) for r in rs] == [True, False, False, False]
    m = compute_metrics(rs, 2.0, slo)
    s = m["slo"]
    assert s["good_requests"] == 1 and s["goodput_rps"] == pytest.approx(0.5)
    assert s["items"]["ttft_p99"]["met"] is False and s["all_met"] is False
    assert request_meets_slo(_r(0, 100, [5, 50]), parse_slo("itl_max=40ms")) is False
    assert request_meets_slo(_r(0, 100, [5, 50]), parse_slo("itl_p50=40ms")) is True


def test_slot_wait_and_scheduled_ttft():
    m = compute_metrics([_r(0, 100, [10], wait_ms=400)], 1.0)
    assert m["slot_wait_s"]["max"] == pytest.approx(0.4)
    assert m["ttft_incl_slot_wait_s"]["max"] == pytest.approx(0.5)


def test_token_sources_discrepancy_and_output_lengths():
    a = _r(0, 100, [10, 10], req_out=3)
    a.tokenizer_output_tokens = 4
    b = _r(1, 100, [10], req_out=3, usage=False)  # 2 chunks, no usage: short by chunk count
    m = compute_metrics([a, b], 1.0)
    assert m["tokens"]["output_source"] == {"server": 1, "chunks": 1}
    d = m["tokens"]["discrepancy"]
    assert d["requests_compared"] == 1 and d["mean_abs_pct"] == pytest.approx(100 / 3)
    assert m["output_lengths"]["honoured"] is False and m["output_lengths"]["requests_short"] == 1
    text = format_metrics(m)
    assert "NOT honoured" in text and "TTFT" in text and "definitions" in text and "discrepancy" in text


def test_refusals_at_a_recorded_context_limit_are_counted_apart():
    rs = [_r(0, 100, [10]), _r(1, 100, [10]), _r(2, 0, [], error="http_4xx"), _r(3, 0, [], error="http_4xx"),
          _r(4, 0, [], error="http_5xx"), _r(5, 0, [], error="http_4xx", warmup=True)]
    for r in rs[2:]:
        r.segment = "prompt=4096"
    m = compute_metrics(rs, 1.0, over_context=["prompt=4096"])
    assert m["requests"] == {"total": 3, "ok": 2, "errors": 1, "warmup_excluded": 1, "over_context": 2}
    assert list(m["errors"]) == ["http_5xx"] and m["errors"]["http_5xx"]["fraction"] == pytest.approx(1 / 3)
    assert "2 refused past the context limit" in format_metrics(m, definitions=False)
    plain = compute_metrics(rs, 1.0)  # no limit recorded: the refusals are errors
    assert plain["requests"]["errors"] == 3 and plain["requests"]["over_context"] == 0
