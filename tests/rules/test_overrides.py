"""rules.overrides: which finding demotes which, as a table applied by one loop."""

from __future__ import annotations

import pytest

from rules import evidence
from rules.model import Finding
from rules.overrides import OVERRIDES, Override, apply_overrides, rank_after_winners, winner

GENERAL = {"demote_factor": 0.5, "strong_confidence": 0.5}


def _f(category: str, confidence: float = 0.8, tier: int = 2) -> Finding:
    return Finding(category, category, f"{category} title", confidence, None, None, [], [], tier=tier)


def test_the_table_names_known_winners_and_categories() -> None:
    for row in OVERRIDES:
        winner(row.winner, [], None, None, 0.5)  # raises on an unknown winner
        assert row.losers and row.why


def test_a_finding_winner_demotes_its_losers_only_when_it_fired() -> None:
    q, kv, dec = _f("queue"), _f("kv_cache"), _f("decode")
    apply_overrides([q, kv, dec], None, None, GENERAL)
    assert q.confidence == pytest.approx(0.4) and q.demoted_by == ["kv_cache"]
    assert "waiting for KV-cache space" in q.note
    assert kv.confidence == 0.8 and kv.demoted_by == []
    q2 = _f("queue")
    apply_overrides([q2], None, None, GENERAL)
    assert q2.demoted_by == []


def test_a_loser_never_ranks_above_the_finding_that_demoted_it() -> None:
    """Prefill demoted by head-of-line (the short prompts' wait is the long ones' prefill seen from
    behind) ranks after it although a lower tier put it first; the rest keep their order."""
    pre, hol, dec = _f("prefill_compute", 0.42, tier=1), _f("head_of_line", 0.67, tier=2), _f("decode", 0.3, tier=3)
    pre.demoted_by = ["head_of_line"]
    fs = [pre, dec, hol]
    rank_after_winners(fs)
    assert [f.category for f in fs] == ["decode", "head_of_line", "prefill_compute"]
    fs = [hol, dec, pre]  # already after it: unchanged
    rank_after_winners(fs)
    assert [f.category for f in fs] == ["head_of_line", "decode", "prefill_compute"]


def test_the_load_generator_demotes_every_server_finding_read_from_client_timing() -> None:
    client_queue, network = _f("queue"), _f("network")
    client_queue.black_box = True
    fs = [_f("loadgen"), client_queue, network, _f("queue"), _f("interference"), _f("cold_start")]
    apply_overrides(fs, None, None, GENERAL)
    # client timing (a black-box queue, the client-server gap) is demoted; what the server measured stands
    assert [f.demoted_by for f in fs] == [[], ["loadgen"], ["loadgen"], [], [], []]


def test_a_long_ramps_stream_count_stands_under_the_load_generator() -> None:
    kv = _f("kv_cache")
    kv.black_box = True
    kv.evidence.append(evidence.row(evidence.LONG_RAMP_CAP, 2.0, None, "requests", "counted, not timed"))
    apply_overrides([_f("loadgen"), kv], None, None, GENERAL)
    assert kv.demoted_by == []


def test_ttft_met_other_slo_broken_pushes_ttft_findings_down() -> None:
    q, inter = _f("queue"), _f("interference")
    apply_overrides([q, inter], all_met=False, ttft_met=True, general=GENERAL)
    assert q.demoted_by == ["slo"] and q.tier == 3
    assert inter.demoted_by == [] and inter.tier == 2


def test_a_strong_ttft_finding_demotes_decode_and_ranks_itl_after_it() -> None:
    pre, dec = _f("prefill_compute", 0.9), _f("decode", 0.6)
    apply_overrides([pre, dec], None, None, GENERAL)
    assert dec.demoted_by == ["prefill_compute"] and dec.tier == 3
    assert pre.demoted_by == []
    # a broken TTFT SLO without a strong finding: "slo" wins, and the ITL findings keep their tier
    dec = _f("decode")
    apply_overrides([_f("queue", 0.3), dec], all_met=False, ttft_met=False, general=GENERAL)
    assert dec.demoted_by == ["slo"] and dec.tier == 2


def test_every_slo_met_demotes_all_server_findings_and_rows_see_earlier_demotions() -> None:
    q, dec = _f("queue", 0.9), _f("decode")
    apply_overrides([q, dec], all_met=True, ttft_met=None, general=GENERAL)
    assert q.demoted_by == ["slo"]
    assert dec.demoted_by == ["queue", "slo"]  # TTFT not fine (judged before the SLO row), then every SLO met
    assert dec.confidence == pytest.approx(0.2)


def test_a_custom_table_is_applied_in_order() -> None:
    a, b = _f("network"), _f("tokenize")
    table = (Override("network", frozenset({"tokenize"}), "why", demote=False, tier=4),)
    apply_overrides([a, b], None, None, GENERAL, table)
    assert b.tier == 4 and b.demoted_by == [] and b.confidence == 0.8


def test_a_slow_tokenizer_demotes_only_a_queue_inferred_from_the_client() -> None:
    tok = _f("tokenize", 0.39)
    inferred, measured = _f("queue", 0.48), _f("queue", 0.9)
    inferred.black_box = True
    apply_overrides([tok, inferred], None, None, GENERAL)
    assert inferred.confidence == pytest.approx(0.24) and inferred.demoted_by == ["tokenize"]
    apply_overrides([_f("tokenize", 0.8), measured], None, None, GENERAL)
    assert measured.confidence == 0.9 and measured.demoted_by == []  # the engine's own queue stands


def test_a_conditional_finding_overrides_nothing() -> None:
    own, prefill = _f("prefix_cache", 0.5), _f("prefill_compute", 0.45)
    own.conditional = True
    apply_overrides([own, prefill], None, None, GENERAL)
    assert prefill.confidence == 0.45 and prefill.demoted_by == []
    users = _f("prefix_cache", 0.5)
    apply_overrides([users, prefill], None, None, GENERAL)
    assert prefill.demoted_by == ["prefix_cache"]


def test_a_kv_limit_from_the_long_ramp_demotes_a_black_box_prefill_finding_only() -> None:
    def bb_prefill() -> Finding:
        f = _f("prefill_compute")
        f.black_box = True
        return f

    measured, inferred = _f("prefill_compute"), bb_prefill()
    kv = _f("kv_cache")
    kv.evidence = [evidence.row(evidence.LONG_RAMP_SHIFT, 1.0, 0.5, "x", "moved as the tokens")]
    apply_overrides([kv, measured, inferred], None, None, GENERAL)
    assert inferred.demoted_by == ["kv_cache"] and measured.demoted_by == []
    # a kv_cache finding without the long ramp's row (a knee alone) demotes no prefill finding
    other = bb_prefill()
    apply_overrides([_f("kv_cache"), other], None, None, GENERAL)
    assert other.demoted_by == []


def test_requests_parked_for_their_grammar_are_not_a_kv_reservation() -> None:
    # the grammar_compile scenario with its fresh schemas sent by two probe workers at once (two
    # compiles in line on one compile thread): requests wait with KV low and batch slots free, which
    # kv_reservation read as reservations (0.84, ranked over grammar_compile 0.90)
    gc, kvr, q = _f("grammar_compile", 0.9, tier=1), _f("kv_reservation", 0.84, tier=1), _f("queue", 0.5, tier=1)
    fs = [kvr, gc, q]
    apply_overrides(fs, None, None, GENERAL)
    rank_after_winners(fs)
    assert kvr.demoted_by == ["grammar_compile"] and kvr.confidence == pytest.approx(0.42)
    assert fs.index(gc) < fs.index(kvr)
