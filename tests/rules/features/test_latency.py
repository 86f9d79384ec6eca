"""rules.features.latency: TTFT percentiles and the SLO checks."""

from __future__ import annotations

import pandas as pd
import pytest
from support.featcap import make_requests, make_tables

from diag.ground import stages
from rules import run_rules
from rules.features import compute_features


def test_slo_checks() -> None:
    feats = compute_features(make_tables(make_requests([0.01] * 99 + [1.0])), slo={"ttft_p50": 0.02, "ttft_max": 0.5})
    checks = feats.value("slo_checks")
    assert checks["ttft_p50"]["met"] is True
    assert checks["ttft_max"]["met"] is False


def _diagnose_capture(users: list[int] | None, kind: str = "diagnose"):  # noqa: ANN202
    """A diagnose-like capture: 20 requests at 10-token prompts answered in 50 ms, 10 ladder rungs of
    2,000 tokens answered in 2 s; TPOT 20 ms and 4 tokens at the short prompts, 5 ms and 20 tokens
    at the rungs (most token gaps are the rungs')."""
    meta = {"kind": kind} | ({"users_workload": {"prompt_tokens": users}} if users else {})
    req = make_requests([0.05] * 20 + [2.0] * 10, input_tokens=[10] * 20 + [2000] * 10,
                        tpot_s=[0.02] * 20 + [0.005] * 10, segment=["concurrency=1"] * 20 + ["prompt=2048"] * 10)
    tables = make_tables(req, meta=meta)
    gap_ns = [20_000_000] * 20 + [5_000_000] * 10
    tables.spans = pd.DataFrame({
        "trace_id": req["trace_id"], "span_id": [f"{i:016x}" for i in range(30)], "name": stages.SPAN_REQUEST,
        "start_ns": req["start_ns"], "end_ns": req["start_ns"] + 1e9,
        stages.ATTR_TOKEN_TIMES_NS: [[int(t) + k * g for k in range(4 if g > 5_000_000 else 20)]
                                     for t, g in zip(req["start_ns"], gap_ns)]})
    return tables


SLO = {"ttft_p99": 0.5, "tpot_p99": 0.01, "itl_p50": 0.01}


def test_slos_are_judged_at_the_users_prompt_lengths_in_a_diagnose_capture() -> None:
    """Users who send 8-16 tokens: the ladder's 2,000-token rungs do not break their TTFT target, and
    the TPOT the rungs' fast decode would hide is theirs; the rows say which requests they cover."""
    checks = compute_features(_diagnose_capture([8, 16]), slo=SLO).value("slo_checks")
    assert checks["ttft_p99"]["met"] is True and checks["ttft_p99"]["value_s"] == 0.05
    assert checks["tpot_p99"]["met"] is False and checks["tpot_p99"]["value_s"] == 0.02
    assert checks["itl_p50"]["met"] is False and checks["itl_p50"]["value_s"] == pytest.approx(0.02)
    assert "20 of 30 requests" in checks["ttft_p99"]["over"] and "8-16 tokens" in checks["ttft_p99"]["over"]
    d = run_rules(_diagnose_capture([8, 16]), slo=SLO)
    note = next(n for n in d.notes if n.startswith("an SLO is broken"))
    assert "tpot_p99 = 20.0 ms" in note and "ttft" not in note and "(over 20 of 30 requests" in note


@pytest.mark.parametrize("users, kind", [(None, "diagnose"), ([8, 16], "probe")])
def test_otherwise_every_steady_request_counts(users, kind) -> None:  # noqa: ANN001
    """No users' lengths, or not diagnose's design (a probe's load is the users' own): all requests."""
    checks = compute_features(_diagnose_capture(users, kind), slo=SLO).value("slo_checks")
    assert checks["ttft_p99"]["met"] is False and "over" not in checks["ttft_p99"]
    assert checks["itl_p50"]["value_s"] == pytest.approx(0.005)  # 60 gaps of 20 ms, 190 of 5 ms


def test_users_longer_than_anything_sent_fall_back_to_all_and_say_so() -> None:
    checks = compute_features(_diagnose_capture([5000, 8000]), slo=SLO).value("slo_checks")
    assert checks["ttft_p99"]["met"] is False
    assert checks["ttft_p99"]["over"].startswith("all 30 requests: none was sent at your users' prompt lengths")


def _sweep(high_n: int):  # noqa: ANN202
    """200 lone requests answered in 50 ms, then ``high_n`` at 8 in flight answered in 800 ms."""
    return make_tables(make_requests([0.05] * 200 + [0.8] * high_n,
                                     segment=["concurrency=1"] * 200 + ["concurrency=8"] * high_n))


def test_an_slo_met_pooled_but_broken_at_one_load_level_is_broken() -> None:
    """A sweep (or ttft diagnose's ramp) that broke the TTFT target at 8 in flight does not meet it
    because 200 lone requests pooled with them do: the worst level is what the target is held to."""
    checks = compute_features(_sweep(6), slo={"ttft_p95": 0.5}).value("slo_checks")
    assert checks["ttft_p95"]["met"] is False and checks["ttft_p95"]["value_s"] == pytest.approx(0.8)
    assert checks["ttft_p95"]["over"].startswith("the worst load level, concurrency=8 (6 requests; 50 ms over all")


def test_a_load_level_of_too_few_requests_is_not_held_to_the_slo_alone() -> None:
    checks = compute_features(_sweep(4), slo={"ttft_p95": 0.5}).value("slo_checks")
    assert checks["ttft_p95"]["met"] is True and "over" not in checks["ttft_p95"]
