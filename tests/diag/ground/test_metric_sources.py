"""The metric source types are plain data: their fields, the sample names they read, and an engine
table's detection; nothing here evaluates (that is collectors.adapters.evaluation)."""

from __future__ import annotations

import dataclasses

import pytest

from diag.ground import metric_sources as ms

SOURCE_TYPES = (ms.Gauge, ms.CounterValue, ms.CounterRate, ms.Histogram, ms.CounterRatio, ms.CounterSumRatio,
                ms.GaugeRatio, ms.Combine)


def test_names_are_the_exposition_samples_read():
    assert ms.Gauge("g", (("a", "b"),), scale=2.0).names() == ("g",)
    assert ms.Histogram("h_seconds").names() == ("h_seconds_bucket", "h_seconds_sum", "h_seconds_count")
    ratio = ms.CounterRatio(ms.CounterRate("n_us"), ms.CounterRate("d"), 1e-6)
    assert ratio.names() == ("n_us", "d")
    share = ms.CounterSumRatio(ms.CounterRate("hit"), (ms.CounterRate("miss"), ms.CounterRate("hit")))
    assert share.names() == ("hit", "miss", "hit")
    assert ms.GaugeRatio(ms.Gauge("used"), ms.Gauge("max")).names() == ("used", "max")
    combo = ms.Combine(((1.0, ms.Histogram("e2e")), (-1.0, ms.CounterValue("c"))))
    assert combo.names() == ("e2e_bucket", "e2e_sum", "e2e_count", "c")
    with pytest.raises(NotImplementedError):
        ms.Source().names()


def test_an_engine_table_names_its_samples_and_claims_its_prefixes():
    table = ms.EngineAdapter(
        engine="x", prefixes=("x:",),
        maps=(ms.SeriesMap("ttft_s", (ms.Histogram("x:ttft"), ms.Histogram("ttft"))),
              ms.SeriesMap("waiting", (ms.Gauge("x:waiting"),), note="queued")),
        exact_names=frozenset({"ttft_count"}),
    )
    assert table.metric_names() == {"x:ttft_bucket", "x:ttft_sum", "x:ttft_count", "ttft_bucket", "ttft_sum",
                                    "ttft_count", "x:waiting"}
    assert table.claims("x:anything") and table.claims("ttft_count")
    assert not table.claims("ttft_sum") and not table.claims("y:waiting")


@pytest.mark.parametrize("cls", SOURCE_TYPES + (ms.SeriesMap, ms.EngineAdapter), ids=lambda c: c.__name__)
def test_types_are_frozen_data_without_evaluation(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    methods = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("__")}
    assert methods <= {"names", "metric_names", "claims"}, methods


def test_every_source_type_is_listed():
    assert {c for c in ms.Source.__subclasses__() if c.__module__ == ms.__name__} == set(SOURCE_TYPES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ms.Gauge("g").scale = 2.0  # type: ignore[misc]
