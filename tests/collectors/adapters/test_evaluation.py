"""Each metric source type evaluated over a hand-built scrape pair and written as PromQL; a type
without an evaluation is a TypeError, not an empty result."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from collectors.adapters import evaluation as ev
from collectors.adapters.core import EvalContext, Snapshot
from diag.ground import metric_sources as ms

CTX = EvalContext(entity_labels=("model",))


def _snap(ts: float, **samples: list[tuple[dict[str, str], float]]) -> Snapshot:
    return Snapshot(ts, {k.replace("__", ":"): v for k, v in samples.items()})


def test_every_source_type_has_an_evaluation_and_a_promql():
    for cls in (c for c in ms.Source.__subclasses__() if c.__module__ == ms.__name__):
        assert ev.evaluate.dispatch(cls) is not ev.evaluate.dispatch(object), cls
        assert ev.promql.dispatch(cls) is not ev.promql.dispatch(object), cls


@dataclass(frozen=True)
class _Unknown(ms.Source):
    name: str = "x"


def test_an_unknown_source_type_is_a_type_error():
    snap = _snap(1.0, x=[({}, 1.0)])
    with pytest.raises(TypeError, match="no evaluation for _Unknown"):
        ev.evaluate(_Unknown(), None, snap, CTX)
    with pytest.raises(TypeError, match="no PromQL for _Unknown"):
        ev.promql(_Unknown(), "30s")
    with pytest.raises(TypeError, match="deltas reads a CounterRate, not a Gauge"):
        ev.deltas(ms.Gauge("x"), None, snap, CTX)
    with pytest.raises(TypeError, match="quantiles reads a Histogram"):
        ev.quantiles(ms.Gauge("x"), None, snap, CTX)
    with pytest.raises(TypeError, match="promql_quantile reads a Histogram"):
        ev.promql_quantile(ms.CounterRate("x"), 0.5, "30s")


def test_counters_gauges_and_ratios_over_a_window():
    a, b = {"model": "a"}, {"model": "b"}
    prev = _snap(0.0, us=[(a, 1e6), (b, 0.0)], n=[(a, 10.0), (b, 3.0)], used=[({}, 30.0)], cap=[({}, 120.0)])
    cur = _snap(5.0, us=[(a, 3e6), (b, 5.0)], n=[(a, 14.0), (b, 3.0)], used=[({}, 60.0)], cap=[({}, 120.0)])
    assert ev.evaluate(ms.CounterRate("n", scale=2.0), prev, cur, CTX) == {"model=a": pytest.approx(4 / 5 * 2),
                                                                            "model=b": 0.0}
    assert ev.evaluate(ms.CounterRate("n"), None, cur, CTX) == {}
    assert ev.evaluate(ms.CounterValue("n"), None, cur, CTX) == {"model=a": 14.0, "model=b": 3.0}
    ratio = ms.CounterRatio(ms.CounterRate("us"), ms.CounterRate("n"), 1e-6)  # µs per request -> s
    assert ev.evaluate(ratio, prev, cur, CTX) == {"model=a": pytest.approx(0.5)}  # b: no request, no value
    assert ev.evaluate(ms.GaugeRatio(ms.Gauge("used"), ms.Gauge("cap")), prev, cur, CTX) == {"": 0.5}
    share = ms.CounterSumRatio(ms.CounterRate("n"), (ms.CounterRate("n"), ms.CounterRate("n")))
    assert ev.evaluate(share, prev, cur, CTX) == {"model=a": 0.5}


def test_histogram_mean_quantiles_and_combine():
    def h(ts: float, n: float, total: float, le: list[tuple[str, float]]) -> Snapshot:
        return _snap(ts, h_ms_count=[({}, n)], h_ms_sum=[({}, total)],
                     h_ms_bucket=[({"le": b}, c) for b, c in le])

    prev = h(0.0, 0.0, 0.0, [("100", 0.0), ("+Inf", 0.0)])
    cur = h(5.0, 4.0, 200.0, [("100", 4.0), ("+Inf", 4.0)])
    hist = ms.Histogram("h_ms", scale=1e-3)
    assert ev.evaluate(hist, prev, cur, CTX) == {"": pytest.approx(0.05)}
    assert ev.quantiles(hist, prev, cur, CTX, (0.5,)) == {0.5: {"": pytest.approx(0.05)}}
    combo = ms.Combine(((1.0, hist), (-1.0, ms.Gauge("h_ms_count", scale=1e-3))))
    assert ev.evaluate(combo, prev, cur, CTX) == {"": pytest.approx(0.05 - 0.004)}
    assert ev.promql(combo, "1m", "pod") == (
        "((sum by (pod) (rate(h_ms_sum[1m])) / sum by (pod) (rate(h_ms_count[1m]))) * 0.001) - "
        "((sum by (pod) (h_ms_count)) * 0.001)")
    assert ev.promql_quantile(hist, 0.5, "1m") == (
        "(histogram_quantile(0.5, sum by (instance, le) (rate(h_ms_bucket[1m])))) * 0.001")


def test_a_series_joins_its_sources_with_or():
    m = ms.SeriesMap("kv", (ms.Gauge("new", max_over=("tp_rank",)), ms.Gauge("old", (("k", "v"),))))
    assert ev.series_promql(m, "30s") == (
        '(max by (instance) (sum by (instance, tp_rank) (new))) or (sum by (instance) (old{k="v"}))')
