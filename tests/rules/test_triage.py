"""rules.base: a rule's triage row in one call per check (Triage), and the finding the engine completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.analysis import recorded_slo
from diag.ground.capture import load_capture
from diag.ground.tables import build_tables
from rules import REGISTRY, evidence, run_rules
from rules.base import RuleContext, Triage, finding, strength
from rules.features import Feature, Features
from rules.model import Evidence


def _ctx(th: dict[str, float], requests_n: float = 100.0) -> RuleContext:
    feats = Features()
    feats.add(Feature("requests_n", requests_n, "requests", True))
    return RuleContext(feats, th, {"min_requests": 20, "black_box_scale": 0.6}, {}, False)


def test_a_crossed_row_has_its_number_op_and_strength() -> None:
    t = Triage(_ctx({"share_min": 0.3}))
    assert t.crossed(evidence.QUEUE_SHARE_TAIL, 0.6, "share_min", "share", "waits for the scheduler")
    assert t.evidence == [Evidence("queue share of TTFT (slowest 5%)", 0.6, 0.3, "share", "waits for the scheduler",
                                   op=">=", crossed=True, key=evidence.QUEUE_SHARE_TAIL)]
    assert t.strengths == [pytest.approx(1.0)]  # 2x the threshold
    assert t.pass_reason("nothing") == "nothing"


def test_a_check_that_does_not_cross_adds_no_row_and_says_why() -> None:
    t = Triage(_ctx({"share_min": 0.3, "ratio_min": 1.2}))
    assert not t.crossed(evidence.COMM_SHARE_PREFILL, 0.1, "share_min", "share", "", miss="comm share {value:.0%} (< {threshold:.0%})")
    assert not t.crossed(evidence.TP_SLOPE_X, None, "ratio_min", "x", "", miss="TP ratio {value:.2f}")  # unknown: no reason
    assert not t.crossed(evidence.TP_SLOPE_X, 1.1, "ratio_min", "x", "", miss="TP ratio {value:.2f} (< {threshold:g})")
    assert t.evidence == [] and t.strengths == []
    assert t.pass_reason() == "comm share 10% (< 30%); TP ratio 1.10 (< 1.2)"


def test_a_below_row_is_stronger_the_lower_the_value() -> None:
    t = Triage(_ctx({"hold_max": 0.5}))
    assert t.below(evidence.DECODE_HOLD, 0.25, "hold_max", "x", "streams slow down")
    row = t.evidence[0]
    assert (row.op, row.threshold, row.crossed) == ("<=", 0.5, True)
    assert t.strengths == [pytest.approx(strength(0.25, 0.5, higher_is_worse=False))] == [pytest.approx(1.0)]
    assert not t.below(evidence.DECODE_HOLD, 0.9, "hold_max", "x", "")
    assert len(t.evidence) == 1


def test_a_judged_row_is_shown_either_way_and_weighs_only_when_asked() -> None:
    t = Triage(_ctx({"idle_max": 0.5, "r2_min": 0.6}))
    assert not t.judged(evidence.DEVICE_BUSY_QUEUED, 0.8, "idle_max", "share", "working", op="<")
    assert t.judged(evidence.PROMPT_FIT_R2, 0.9, "r2_min", "", "linear", weigh=True)
    assert [(e.key, e.op, e.threshold, e.crossed) for e in t.evidence] == [
        (evidence.DEVICE_BUSY_QUEUED, "<", 0.5, False), (evidence.PROMPT_FIT_R2, ">=", 0.6, True)]
    assert t.strengths == [pytest.approx(strength(0.9, 0.6))]


def test_a_bounded_measure_reaches_full_strength_at_its_bound_not_at_twice_a_threshold_past_it() -> None:
    # an R² of 1 or a share of 100% is as strong as such evidence gets, whatever the threshold
    assert strength(1.0, 0.6, bound=1.0) == pytest.approx(1.0)
    assert strength(0.8, 0.6, bound=1.0) == pytest.approx(0.75)  # halfway from the threshold to the bound
    assert strength(0.6, 0.6, bound=1.0) == pytest.approx(0.5) and strength(0.59, 0.6, bound=1.0) == 0.0
    assert strength(0.8, 0.6) < 0.75  # unbounded: 1.0 only at 1.2, a value the measure never takes
    # a low threshold saturates at 2x as before: the bound changes nothing there
    assert strength(0.3, 0.15, bound=1.0) == strength(0.3, 0.15) == pytest.approx(1.0)
    # a share row is bounded without saying; an R² row says so
    t = Triage(_ctx({"share_min": 0.8, "r2_min": 0.6}))
    t.crossed(evidence.PREFILL_SHARE_TAIL, 0.9, "share_min", "share", "")
    t.judged(evidence.PROMPT_FIT_R2, 0.8, "r2_min", "", "", weigh=True, bound=1.0)
    t.judged(evidence.PROMPT_FIT_R2, 0.8, "r2_min", "", "", weigh=True)
    assert t.strengths == [pytest.approx(0.75), pytest.approx(0.75), pytest.approx(strength(0.8, 0.6))]


def test_a_context_row_has_no_threshold_and_no_strength() -> None:
    t = Triage(_ctx({}))
    t.context(evidence.DEVICE_BUSY, 0.42, "share", "utilisation alone says little")
    assert t.evidence == [Evidence("device busy fraction", 0.42, None, "share", "utilisation alone says little",
                                   key=evidence.DEVICE_BUSY)]
    assert t.evidence[0].op is None and t.evidence[0].crossed is None and t.strengths == []


def test_an_explicit_threshold_replaces_the_key() -> None:
    t = Triage(_ctx({}))
    assert t.crossed(evidence.slo("itl_p99"), 0.3, None, "s", "", threshold=0.1)
    assert (t.evidence[0].name, t.evidence[0].threshold) == ("SLO itl_p99", 0.1)
    with pytest.raises(ValueError):
        t.crossed(evidence.TTFT_P50, 1.0, None, "", "")
    with pytest.raises(KeyError):  # a row is declared in the catalogue before a rule shows it
        t.crossed("a row nobody declared", 1.0, None, "", "", threshold=0.5)


def test_confidence_is_directness_times_mean_strength_times_sample_size() -> None:
    t = Triage(_ctx({"a": 1.0}, requests_n=5))
    t.crossed(evidence.TTFT_RISE_X, 2.0, "a", "x", "")
    t.add_strength(0.5)
    f = (5 / 20) ** 0.5  # the sample factor, for evidence at its thresholds ...
    weight = f + (1 - f) * f * 0.5  # ... eased halfway to f (2 - f): the mean strength 0.75 is half-way past
    assert t.confidence(0.8) == pytest.approx(round(0.8 * 0.75 * weight, 3))
    assert t.confidence(0.8, black_box=True) == pytest.approx(round(0.8 * 0.75 * weight * 0.6, 3))


def test_a_few_requests_weigh_less_at_the_threshold_than_far_past_it() -> None:
    at, far = Triage(_ctx({"a": 1.0}, requests_n=5)), Triage(_ctx({"a": 1.0}, requests_n=5))
    at.crossed(evidence.TTFT_RISE_X, 1.0, "a", "x", "")
    far.crossed(evidence.TTFT_RISE_X, 4.0, "a", "x", "")
    assert at.confidence(1.0) == pytest.approx(0.5 * 0.5)  # strength 0.5 x the sample factor
    assert far.confidence(1.0) == pytest.approx(1.0 * (0.5 + 0.5 * 0.5))  # f (2 - f)
    many = Triage(_ctx({"a": 1.0}, requests_n=40))
    many.crossed(evidence.TTFT_RISE_X, 4.0, "a", "x", "")
    assert far.confidence(1.0) < many.confidence(1.0) == 1.0


def test_finding_leaves_id_and_category_to_the_engine() -> None:
    f = finding("a title", 0.5, 1.0, 50.0, [], ["check"], note="n")
    assert (f.rule_id, f.category, f.title, f.note) == ("", "", "a title", "n")


@pytest.mark.parametrize("sample", ["queue", "kv_cache", "interference", "loadgen"])
def test_the_engine_fills_id_and_category_from_the_decorator(sample: str) -> None:
    root = Path(__file__).resolve().parents[2] / "samples" / sample
    caps = [load_capture(p) for p in sorted(root.iterdir()) if p.is_dir()]
    d = run_rules(build_tables(caps), slo=recorded_slo(caps))  # interference: its users' ITL target
    rule_findings = [f for f in d.findings if f.rule_id in REGISTRY]
    assert rule_findings and d.verdict.rule_id == d.verdict.category == sample
    for f in rule_findings:
        assert f.category == REGISTRY[f.rule_id].category


def test_beyond_chance_holds_at_any_base_rate_and_weighs_the_sample() -> None:
    from rules.base import beyond_chance

    # 88% against a 47% chance over 16 waiting requests: far beyond chance, though not 2x it
    assert beyond_chance(0.88, 0.47, 16, 0.01) and beyond_chance(0.88, 0.47, 16.0, 0.01)  # a count as a float
    # the same shares over 3 requests prove nothing
    assert not beyond_chance(1.0, 0.47, 3, 0.01)
    # what chance gives is not beyond it, however many requests
    assert not beyond_chance(0.50, 0.47, 200, 0.01)
    # no chance at all: any hit is beyond it; no hit never is
    assert beyond_chance(0.2, 0.0, 10, 0.01) and not beyond_chance(0.0, 0.0, 10, 0.01)
    assert not beyond_chance(None, 0.3, 10, 0.01) and not beyond_chance(0.9, 0.3, 0, 0.01)


def test_more_often_p_weighs_the_other_groups_own_count() -> None:
    from math import comb

    from rules.base import more_often_p

    # 2 of 5 against 0 of 51: both hits in group A by chance is C(5,2) of C(56,2) ways
    assert more_often_p(2, 5, 0, 51) == pytest.approx(comb(5, 2) / comb(56, 2))
    # the same 2 of 5 against 0 of 3: three trials cannot set a rate
    assert more_often_p(2, 5, 0, 3) > 0.3
    # a group no more often hit than the other is no evidence; every split counted is 1
    assert more_often_p(1, 10, 10, 100) > 0.5 and more_often_p(0, 4, 2, 4) == pytest.approx(1.0)
    assert more_often_p(1, 0, 0, 5) is None and more_often_p(1, 5, 0, 0) is None
