"""The evaluation of the ground floor's metric sources (:mod:`diag.ground.metric_sources`).

:func:`evaluate` gives one source's entity -> value over a scrape pair (counters -> per-second
rates from deltas, histograms -> windowed mean Δsum/Δcount, gauges -> as they are, each times the
source's ``scale``); :func:`promql` says the same value in PromQL, so the /metrics scraper and the
Prometheus-server reader share one table (:func:`series_promql` joins a series' sources).
Both dispatch on the source's type (``functools.singledispatch``, one function per type below);
a type without one raises TypeError. :func:`deltas` (a counter's increase), :func:`quantiles` and
:func:`promql_quantile` (a histogram's percentiles) read one type each. Pure code; any thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import singledispatch

from collectors.adapters.core import (PERCENTILES, EvalContext, Snapshot, _delta, _fmt_scale, _group, _le, _sel,
                                      bucket_quantile)
from diag.ground.metric_sources import (Combine, CounterRate, CounterRatio, CounterSumRatio, CounterValue, Gauge,
                                        GaugeRatio, Histogram, Labels, SeriesMap, Source)


@singledispatch
def evaluate(src: Source, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
    """entity -> value of ``src`` over the scrape pair (empty when the metric is absent or the window has no data)."""
    raise TypeError(f"evaluate: no evaluation for {type(src).__name__} (collectors.adapters.evaluation has one "
                    "per source type of diag.ground.metric_sources)")


@singledispatch
def promql(src: Source, window: str, by: str = "instance") -> str:
    """``src``'s value as a PromQL expression over ``window`` (e.g. "30s"), one result per ``by`` label value."""
    raise TypeError(f"promql: no PromQL for {type(src).__name__} (collectors.adapters.evaluation has one "
                    "per source type of diag.ground.metric_sources)")


def first_present(exprs: Sequence[str]) -> str:
    """PromQL expressions joined with ``or``: the first present wins, per label set."""
    return exprs[0] if len(exprs) == 1 else " or ".join(f"({e})" for e in exprs)


def series_promql(m: SeriesMap, window: str, by: str = "instance") -> str:
    """All of a series' sources joined with ``or`` (first present wins, per ``by`` value)."""
    return first_present([promql(s, window, by) for s in m.sources])


def _require(src: Source, cls: type, what: str) -> None:
    if not isinstance(src, cls):
        raise TypeError(f"{what} reads a {cls.__name__}, not a {type(src).__name__}")


def _window_deltas(name: str, match: Labels, prev: Snapshot, cur: Snapshot, ctx: EvalContext,
                   extra_key: str | None = None, max_over: tuple[str, ...] = ()) -> dict[tuple[str, str], float]:
    """(entity, ``extra_key`` label value) -> the increase of counter sample ``name`` between two
    scrapes (reset-aware, :func:`collectors.adapters.core._delta`)."""
    c = _group(cur.get(name), match, ctx, extra_key, max_over=max_over)
    p = _group(prev.get(name), match, ctx, extra_key, max_over=max_over)
    return {key: _delta(v, p.get(key)) for key, v in c.items()}


def _agg(by: str, expr: str, max_over: tuple[str, ...]) -> str:
    """``sum by (by)`` of ``expr``; with ``max_over``, the largest per-rank sum instead."""
    if not max_over:
        return f"sum by ({by}) ({expr})"
    return f"max by ({by}) (sum by ({by}, {', '.join(max_over)}) ({expr}))"


# --- Gauge, CounterValue ------------------------------------------------------------------------


@evaluate.register(Gauge)
def _evaluate_gauge(src: Gauge, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
    grouped = _group(cur.get(src.name), src.match, ctx, max_over=src.max_over)
    return {ent: v * src.scale for (ent, _), v in grouped.items()}


@promql.register(Gauge)
def _promql_gauge(src: Gauge, window: str, by: str = "instance") -> str:
    return _fmt_scale(_agg(by, _sel(src.name, src.match), src.max_over), src.scale)


@evaluate.register(CounterValue)
def _evaluate_counter_value(src: CounterValue, prev: Snapshot | None, cur: Snapshot,
                            ctx: EvalContext) -> dict[str, float]:
    return {ent: v for (ent, _), v in _group(cur.get(src.name), src.match, ctx, max_over=src.max_over).items()}


@promql.register(CounterValue)
def _promql_counter_value(src: CounterValue, window: str, by: str = "instance") -> str:
    return _agg(by, _sel(src.name, src.match), src.max_over)


# --- CounterRate --------------------------------------------------------------------------------


def deltas(src: CounterRate, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
    """entity -> Δcounter between the two scrapes (reset-aware, ``scale`` not applied); {} without ``prev``."""
    _require(src, CounterRate, "deltas")
    if prev is None:
        return {}
    return {key[0]: d for key, d in _window_deltas(src.name, src.match, prev, cur, ctx,
                                                   max_over=src.max_over).items()}


@evaluate.register(CounterRate)
def _evaluate_counter_rate(src: CounterRate, prev: Snapshot | None, cur: Snapshot,
                           ctx: EvalContext) -> dict[str, float]:
    if prev is None or cur.ts_s <= prev.ts_s:
        return {}
    dt = cur.ts_s - prev.ts_s
    return {ent: d / dt * src.scale for ent, d in deltas(src, prev, cur, ctx).items()}


@promql.register(CounterRate)
def _promql_counter_rate(src: CounterRate, window: str, by: str = "instance") -> str:
    return _fmt_scale(_agg(by, f"rate({_sel(src.name, src.match)}[{window}])", src.max_over), src.scale)


# --- Histogram ----------------------------------------------------------------------------------


@evaluate.register(Histogram)
def _evaluate_histogram(src: Histogram, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
    if prev is None:
        return {}
    sums = _window_deltas(src.base + "_sum", src.match, prev, cur, ctx)
    counts = _window_deltas(src.base + "_count", src.match, prev, cur, ctx)
    out = {}
    for key, n in counts.items():
        if n > 0 and key in sums:
            out[key[0]] = sums[key] / n * src.scale
    return out


def quantiles(src: Histogram, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext,
              qs: Sequence[float] = PERCENTILES) -> dict[float, dict[str, float]]:
    """q -> entity -> windowed percentile × ``scale`` (only entities with observations in the window)."""
    _require(src, Histogram, "quantiles")
    out: dict[float, dict[str, float]] = {q: {} for q in qs}
    if prev is None:
        return out
    d = _window_deltas(src.base + "_bucket", src.match, prev, cur, ctx, extra_key="le")
    per_entity: dict[str, list[tuple[float, float]]] = {}
    for (ent, le), v in d.items():
        try:
            per_entity.setdefault(ent, []).append((_le(le), v))
        except ValueError:
            continue
    for ent, buckets in per_entity.items():
        # cumulative deltas can lose monotonicity after a partial reset; enforce it
        buckets.sort()
        mono, running = [], 0.0
        for bound, count in buckets:
            running = max(running, count)
            mono.append((bound, running))
        for q in qs:
            val = bucket_quantile(q, mono)
            if not math.isnan(val):
                out[q][ent] = val * src.scale
    return out


@promql.register(Histogram)
def _promql_histogram(src: Histogram, window: str, by: str = "instance") -> str:
    num = f"sum by ({by}) (rate({_sel(src.base + '_sum', src.match)}[{window}]))"
    den = f"sum by ({by}) (rate({_sel(src.base + '_count', src.match)}[{window}]))"
    return _fmt_scale(f"{num} / {den}", src.scale)


def promql_quantile(src: Histogram, q: float, window: str, by: str = "instance") -> str:
    """The ``q`` percentile of ``src`` over ``window`` in PromQL (``histogram_quantile``), × ``scale``."""
    _require(src, Histogram, "promql_quantile")
    inner = f"sum by ({by}, le) (rate({_sel(src.base + '_bucket', src.match)}[{window}]))"
    return _fmt_scale(f"histogram_quantile({q:g}, {inner})", src.scale)


# --- ratios and combinations ----------------------------------------------------------------------


@evaluate.register(CounterRatio)
def _evaluate_counter_ratio(src: CounterRatio, prev: Snapshot | None, cur: Snapshot,
                            ctx: EvalContext) -> dict[str, float]:
    n = deltas(src.num, prev, cur, ctx)
    d = deltas(src.den, prev, cur, ctx)
    return {e: n[e] / d[e] * src.scale for e in n if d.get(e, 0) > 0}


@promql.register(CounterRatio)
def _promql_counter_ratio(src: CounterRatio, window: str, by: str = "instance") -> str:
    a = promql(CounterRate(src.num.name, src.num.match), window, by)
    b = promql(CounterRate(src.den.name, src.den.match), window, by)
    return _fmt_scale(f"{a} / {b}", src.scale)


@evaluate.register(CounterSumRatio)
def _evaluate_counter_sum_ratio(src: CounterSumRatio, prev: Snapshot | None, cur: Snapshot,
                                ctx: EvalContext) -> dict[str, float]:
    n = deltas(src.num, prev, cur, ctx)
    parts = [deltas(d, prev, cur, ctx) for d in src.den]
    out = {}
    for e, v in n.items():
        total = sum(p[e] for p in parts if e in p)
        if total > 0:
            out[e] = v / total
    return out


@promql.register(CounterSumRatio)
def _promql_counter_sum_ratio(src: CounterSumRatio, window: str, by: str = "instance") -> str:
    den = " + ".join(f"({promql(d, window, by)})" for d in src.den)
    return f"({promql(src.num, window, by)}) / ({den})"


@evaluate.register(GaugeRatio)
def _evaluate_gauge_ratio(src: GaugeRatio, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
    n = evaluate(src.num, prev, cur, ctx)
    d = evaluate(src.den, prev, cur, ctx)
    return {e: n[e] / d[e] for e in n if d.get(e, 0) > 0}


@promql.register(GaugeRatio)
def _promql_gauge_ratio(src: GaugeRatio, window: str, by: str = "instance") -> str:
    return f"{promql(src.num, window, by)} / {promql(src.den, window, by)}"


@evaluate.register(Combine)
def _evaluate_combine(src: Combine, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
    vals = [(sign, evaluate(part, prev, cur, ctx)) for sign, part in src.parts]
    if not vals:
        return {}
    common = set(vals[0][1])
    for _, v in vals[1:]:
        common &= set(v)
    return {e: sum(sign * v[e] for sign, v in vals) for e in common}


@promql.register(Combine)
def _promql_combine(src: Combine, window: str, by: str = "instance") -> str:
    out = ""
    for i, (sign, part) in enumerate(src.parts):
        term = f"({promql(part, window, by)})"
        if i == 0:
            out = term if sign > 0 else f"-{term}"
        else:
            out += f" {'+' if sign > 0 else '-'} {term}"
    return out
