"""Per-engine tables that map /metrics names onto the canonical series of ``diag.ground.stages``: the front door.

One table per engine, each the ``METRICS`` of its ground-floor module :mod:`diag.ground.external.<engine>`
with the file and commit its names were read from (vLLM, our bundled engine's ``ttft_engine:``
names, SGLang, TGI, llama.cpp, trtllm-serve, Triton + TensorRT-LLM backend (``TRITON_METRICS``
of ``trtllm``), NVIDIA Dynamo); the reference table is ``docs/engines.md``. A table is a list of
:class:`SeriesMap`: a canonical series and the *sources* it may come from, tried in order (the
first one with data wins — that is how renamed metrics such as ``vllm:gpu_cache_usage_perc`` →
``vllm:kv_cache_usage_perc`` or trtllm's unprefixed names before 1.2 are handled).

The tables are plain data (:mod:`diag.ground.metric_sources`); :mod:`collectors.adapters.evaluation`
evaluates a source over two scrapes and says the same thing in PromQL, so the /metrics scraper
and the Prometheus-server reader share one table. Names are the *exposition* names (what a
scrape shows and what PromQL queries).

To add a metric: append a :class:`SeriesMap` to the engine's table (or a source to an
existing one); to add an engine: a ``METRICS`` table in its module under ``diag/ground/external/``
and an entry in :data:`ADAPTERS`. Pure code, no I/O; safe from any thread.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from collectors.adapters.core import (PERCENTILES, EvalContext, Labels, Snapshot, bucket_quantile,  # noqa: F401
                                      percentile_series, snapshot_from_families)
from collectors.adapters.evaluation import (deltas, evaluate, first_present, promql_quantile, quantiles,
                                           series_promql)
from diag.ground import stages
from diag.ground.external import bundled, dynamo, llamacpp, sglang, tgi, trtllm, vllm
from diag.ground.metric_sources import CounterRate, EngineAdapter, Gauge, Histogram, SeriesMap

SERIES_PREEMPTIONS_PER_S = stages.SERIES_PREEMPTIONS_PER_S
SERIES_PAUSED = stages.SERIES_PAUSED

#: Every adapter, in detection priority order. Append new engines here.
ADAPTERS: tuple[EngineAdapter, ...] = (bundled.METRICS, vllm.METRICS, sglang.METRICS, tgi.METRICS, llamacpp.METRICS,
                                        trtllm.METRICS, trtllm.TRITON_METRICS, dynamo.METRICS)
ADAPTERS_BY_ENGINE: dict[str, EngineAdapter] = {a.engine: a for a in ADAPTERS}


def detect_engines(metric_names: Iterable[str]) -> list[str]:
    """Engines whose prefixes (or exact names) appear among the names, most names first (ties: table order)."""
    counts = {a.engine: 0 for a in ADAPTERS}
    for name in metric_names:
        for a in ADAPTERS:
            if a.claims(name):
                counts[a.engine] += 1
                break
    order = {a.engine: i for i, a in enumerate(ADAPTERS)}
    found = [e for e, c in counts.items() if c > 0]
    return sorted(found, key=lambda e: (-counts[e], order[e]))


def detect_engine(metric_names: Iterable[str]) -> str | None:
    """The engine that exposed these metric names, or None when none is recognised."""
    found = detect_engines(metric_names)
    return found[0] if found else None


@dataclass(frozen=True)
class Row:
    """One canonical value: series, entity, value (the unit the series name states)."""

    series: str
    entity: str
    value: float


def _gauge_only(m: SeriesMap) -> bool:
    return bool(m.sources) and all(isinstance(s, (Gauge,)) for s in m.sources)


def stale_entities(adapter: EngineAdapter, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, bool]:
    """entity -> whether its gauges are stale in this window (only for adapters with ``activity``).

    Stale: no activity counter advanced between the two scrapes *and* every gauge of the table
    kept its value. An entity with no activity counter at all is not judged.
    """
    if not adapter.activity or prev is None:
        return {}
    moved: dict[str, bool] = {}
    for src in adapter.activity:
        if isinstance(src, CounterRate):
            for e, d in deltas(src, prev, cur, ctx).items():
                moved[e] = moved.get(e, False) or d > 0
    for m in adapter.maps:
        if not _gauge_only(m):
            continue
        for src in m.sources:
            now, before = evaluate(src, None, cur, ctx), evaluate(src, None, prev, ctx)
            for e, v in now.items():
                if e in moved and before.get(e) != v:
                    moved[e] = True
    return {e: not m for e, m in moved.items()}


def adapt(adapter: EngineAdapter, prev: Snapshot | None, cur: Snapshot, prefix: str = "",
          percentiles: Sequence[float] = PERCENTILES) -> list[Row]:
    """Canonical rows for one scrape pair (``prev`` None: gauges and cumulative values only).

    For adapters whose gauges freeze when idle (``activity`` set), a stale window gives no
    gauge rows for that entity and a ``gauges_stale`` row of 1 (0 when fresh).
    """
    ctx = EvalContext(entity_labels=adapter.entity_labels, prefix=prefix)
    rows: list[Row] = []

    def ent(e: str) -> str:
        if prefix and e:
            return f"{prefix}/{e}"
        return prefix or e

    stale = stale_entities(adapter, prev, cur, ctx)
    for e, is_stale in sorted(stale.items()):
        rows.append(Row(stages.SERIES_GAUGES_STALE, ent(e), 1.0 if is_stale else 0.0))
    for m in adapter.maps:
        skip = {e for e, s in stale.items() if s} if _gauge_only(m) else set()
        for src in m.sources:
            vals = evaluate(src, prev, cur, ctx)
            if not vals:
                continue
            for e, v in sorted(vals.items()):
                if math.isfinite(v) and e not in skip:
                    rows.append(Row(m.series, ent(e), v))
            if isinstance(src, Histogram):
                for q, per in quantiles(src, prev, cur, ctx, percentiles).items():
                    for e, v in sorted(per.items()):
                        rows.append(Row(percentile_series(m.series, q), ent(e), v))
            break
    return rows


def promql_queries(adapter: EngineAdapter, window: str = "30s", by: str = "instance",
                   percentiles: Sequence[float] = PERCENTILES) -> dict[str, str]:
    """Canonical series → PromQL over a Prometheus server (one result per ``by`` value).

    Histogram-backed series also get ``<series>_pNN`` via ``histogram_quantile``.
    """
    out: dict[str, str] = {}
    for m in adapter.maps:
        out[m.series] = series_promql(m, window, by)
        hists = [s for s in m.sources if isinstance(s, Histogram)]
        if hists and len(hists) == len(m.sources):
            for q in percentiles:
                out[percentile_series(m.series, q)] = first_present([promql_quantile(h, q, window, by) for h in hists])
    return out
