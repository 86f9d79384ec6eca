"""The random matrix's scoring under the verdict contract (no engine runs): each run's outcome
(right, leading-right, inconclusive, missed, wrong; wrong at >= 0.8 apart; a cause named on a draw
designed healthy), the per-family table and its JSON, and the agreement of repeated runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.analysis.scenarios import Calibration
from diag.analysis.scenarios.catalog import get
from diag.analysis.scenarios.matrix import MODES, Verdict, diagnose_run
from diag.analysis.scenarios.random_draws import draws
from diag.analysis.scenarios.random_matrix import (CONFIDENT, LEADING_RIGHT, MISSED, RIGHT, UNDECIDED, WRONG, DrawResult,
                                          RandomResult, outcome, tally)
from diag.analysis.scenarios.runner import ScenarioRun

CAL = Calibration(ttft_short_ms=6.4, prefill_ms_per_token=0.092, decode_step_ms=2.4)
SAMPLES = Path(__file__).resolve().parents[4] / "samples"


@pytest.mark.parametrize("verdict,truth,mode,expected", [
    (Verdict("queue", 0.9, "t"), "queue", "server", RIGHT),
    (Verdict("queue", 0.8, "t"), "kv_cache", "client-only", RIGHT),  # a KV limit a client cannot see
    (Verdict("queue", 0.8, "t"), "kv_cache", "server", WRONG),
    (Verdict("inconclusive", 0.5, "t", "queue", 0.6), "queue", "server", LEADING_RIGHT),
    (Verdict("healthy", 0.8, "t", "prefill_compute", 0.4), "prefill_compute", "server", LEADING_RIGHT),
    # declining is right where the client cannot see the cause, whatever leads
    (Verdict("inconclusive", 0.5, "t", "queue", 0.6), "kv_cache", "client-only", RIGHT),
    (Verdict("inconclusive", 0.5, "t", "tokenize", 0.6), "queue", "client-only", UNDECIDED),
    (Verdict("inconclusive", 0.5, "t", "queue", 0.6), "kv_cache", "server", UNDECIDED),
    (Verdict("inconclusive", 0.5, "t", "tokenize", 0.6), "healthy", "server", UNDECIDED),
    (Verdict("inconclusive", 0.5, "t"), "network", "server", UNDECIDED),
    (Verdict("no_data", 0.0, "t"), "network", "server", UNDECIDED),
    (Verdict("healthy", 0.9, "t"), "healthy", "client-only", RIGHT),
    (Verdict("healthy", 0.9, "t"), "queue", "server", MISSED),
    (Verdict("healthy", 0.8, "t", "tokenize", 0.4), "queue", "server", MISSED),
    (Verdict("failures", 0.9, "t"), "healthy", "server", WRONG),
    (Verdict("prefill_compute", 0.75, "t"), "head_of_line", "server", WRONG),
])
def test_each_run_gets_one_outcome(verdict, truth, mode, expected):
    assert outcome(verdict, truth, mode) == expected


def test_tally_counts_wrong_confident_and_false_causes():
    runs = [(Verdict("queue", CONFIDENT, "t"), "healthy", "server"),  # a cause where none is, confident
            (Verdict("queue", 0.75, "t"), "healthy", "server"),
            (Verdict("healthy", 0.9, "t"), "healthy", "server"),
            (Verdict("tokenize", 0.95, "t"), "network", "server"),
            (Verdict("inconclusive", 0.5, "t", "network", 0.6), "network", "server")]
    t = tally(runs)
    assert t == {"runs": 5, RIGHT: 1, LEADING_RIGHT: 1, UNDECIDED: 0, MISSED: 0, WRONG: 3, "wrong_confident": 2,
                 "designed_healthy": 3, "false_cause": 2}


def _result(verdicts: dict[int, list[tuple[str, float, str | None]]], seed: int = 4) -> RandomResult:
    """Draws of ``seed`` with the given verdicts in both modes (``=``: the draw's truth)."""
    rs = []
    for i, vs in verdicts.items():
        d = draws(seed, i + 1)[i]
        rs.append(DrawResult(d, {m: [Verdict(d.expected if c == "=" else c, conf, "t",
                                             d.expected if lead == "=" else lead, 0.6 if lead else None)
                                     for c, conf, lead in vs] for m in MODES}))
    return RandomResult(seed, CAL, MODES, rs, calibration_file="runs/calibration.json")


def test_the_per_family_table_and_json_carry_every_outcome():
    res = _result({0: [("=", 0.9, None), ("inconclusive", 0.5, "=")],
                   1: [("zzz", 0.85, None), ("zzz", 0.85, None)],
                   2: [("inconclusive", 0.5, None), ("=", 0.9, None)]})
    groups = res.groups()
    assert sorted({(r.draw.family, r.draw.kind) for r in res.results}) == groups
    for m in MODES:
        whole = res.outcomes(m)
        assert whole["runs"] == 6 and sum(whole[o] for o in (RIGHT, LEADING_RIGHT, UNDECIDED, MISSED, WRONG)) == 6
        assert sum(res.outcomes(m, g)["runs"] for g in groups) == 6
        assert whole[RIGHT] == 2 and whole[LEADING_RIGHT] == 1 and whole[WRONG] == 2 and whole["wrong_confident"] == 2
        assert res.accuracy(m) == (2, 6)  # the accuracy figure stays right / runs
    doc = json.loads(json.dumps(res.to_dict(), default=str))
    for m in MODES:
        assert doc["outcomes"][m]["all"] == res.outcomes(m)
        assert set(doc["outcomes"][m]["per_family"]) == {f"{f}/{k}" for f, k in groups}
        assert doc["agreement"][m] == {"draws": 3, "agree": 1, "share": pytest.approx(1 / 3), "void": 0}
    assert {x["outcome"] for x in doc["misses"]} == {LEADING_RIGHT, WRONG, UNDECIDED}
    text = res.format_text()
    assert "outcomes per family and kind" in text
    for fam, kind in groups:
        assert f"{fam}/{kind}" in text
    assert "agreement server: 1/3 draws (33%)" in text
    assert "leading " in text and ": leading-right;" in text


def test_agreement_needs_repeats():
    res = _result({0: [("=", 0.9, None)], 1: [("=", 0.9, None)]})
    assert res.agreement("server") is None and "agreement" not in res.format_text()
    again = _result({0: [("=", 0.9, None), ("=", 0.8, None)], 1: [("=", 0.9, None), ("=", 0.9, None)]})
    assert again.agreement("client-only") == {"draws": 2, "agree": 2, "share": 1.0, "void": 0}
    # a draw with a run not as designed (void) has no verdict to agree with: left out, counted
    again.results[0].truths = ["void", again.results[0].draw.expected]
    again.results[0].accounting = [{"client_loop_stall_frac": 0.4}, {}]
    assert again.agreement("server") == {"draws": 1, "agree": 1, "share": 1.0, "void": 1}
    assert "; 1 with a void run left out" in again.format_text()


def test_a_real_diagnosis_carries_its_leading_candidate():
    """The comm sample's client half: inconclusive under the floor with comm leading (the contract)."""
    run = ScenarioRun(get("comm"), SAMPLES / "comm", SAMPLES / "comm" / "client",
                      [SAMPLES / "comm" / "server-0", SAMPLES / "comm" / "server-1"])
    client = diagnose_run(run, "client-only")
    assert client.category == "inconclusive" and client.leading == "comm"
    assert 0 < client.leading_confidence < 0.7 and client.named == "comm"
    assert outcome(client, "comm", "client-only") == LEADING_RIGHT
    server = diagnose_run(run, "server")
    assert server.category == "comm" and server.leading is None and server.named == "comm"


def test_client_only_may_decline_only_where_the_client_cannot_see_the_cause() -> None:
    """inconclusive (its first check the server's view) is right client-only for a truth the client
    cannot observe, and nowhere else: not for a cause the client sees, not with the server's spans."""
    from diag.analysis.scenarios.random_truth import CLIENT_ONLY_ALSO, scored_right

    for truth in ("engine_overhead", "kv_cache", "kv_reservation", "pipeline_bubble", "pd_transfer", "frontend"):
        assert truth in CLIENT_ONLY_ALSO and scored_right("inconclusive", truth, "client-only")
        assert not scored_right("inconclusive", truth, "server")
    for truth in ("network", "queue", "prefill_compute", "head_of_line", "tokenize", "healthy"):
        assert not scored_right("inconclusive", truth, "client-only")
    assert not scored_right("healthy", "kv_cache", "client-only")  # a KV limit makes requests wait
