"""diag.analysis.report.deltas: a metric in A and B, its change as text, and what counts as material."""

from __future__ import annotations

from diag.analysis.report.deltas import MetricDelta, StageDelta, material


def test_metric_delta_text_per_unit() -> None:
    t = MetricDelta("TTFT p50", "s", 0.083, 0.0112)
    assert (t.fmt(t.a), t.fmt(t.b), t.fmt_delta()) == ("83.0 ms", "11.2 ms", "-71.8 ms (-87%)")
    share = MetricDelta("device busy", "share", 0.96, 0.95)
    assert share.fmt(share.a) == "96%" and share.fmt_delta() == "-1 pts"
    assert MetricDelta("requests ok", "count", 32, 24).fmt_delta() == "-8 (-25%)"
    assert MetricDelta("requests", "per_s", 12.0, 26.4).fmt(26.4) == "26.4/s"
    assert MetricDelta("x", "s", None, 1.0).fmt_delta() == "-" and MetricDelta("x", "s", 1.0, 1.0 + 1e-9).fmt_delta() == "0"


def test_material_needs_both_the_absolute_and_the_relative_change() -> None:
    assert material(MetricDelta("TTFT p50", "s", 0.100, 0.120))
    assert not material(MetricDelta("TTFT p50", "s", 0.100, 0.1003))  # 0.3 ms: below 0.5 ms
    assert not material(MetricDelta("TTFT p50", "s", 10.0, 10.2))  # 2%: below 5%
    assert not material(None) and not material(MetricDelta("TTFT p50", "s", None, 1.0))


def test_stage_delta_treats_a_missing_side_as_zero() -> None:
    s = StageDelta("queue", None, 0.01, None, 0.02, None, 0.5)
    assert s.mean_delta_s == 0.02 and s.p50_delta_s == 0.01
    assert StageDelta("comm", None, None, None, None, None, None).mean_delta_s is None
