"""Sources (where one canonical series comes from) and the per-engine table types.

A source evaluates itself over two scrapes (:meth:`Source.evaluate`: counters -> per-second
rates from deltas, histograms -> windowed mean Δsum/Δcount and percentiles from bucket deltas,
gauges -> as they are) and says the same thing in PromQL (:meth:`Source.promql`), so the
/metrics scraper and the Prometheus-server reader share one table. Pure code; any thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from collectors.adapters.core import (PERCENTILES, EvalContext, Labels, Snapshot, _delta, _fmt_scale, _group, _le,
                                      _sel, bucket_quantile)

class Source:
    """Where one canonical series comes from. Subclasses evaluate over a scrape pair."""

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        """entity → value (empty when the metric is absent or the window has no data)."""
        raise NotImplementedError

    def promql(self, window: str, by: str = "instance") -> str:
        """The same value as a PromQL expression, one result per ``by`` label value."""
        raise NotImplementedError

    def names(self) -> tuple[str, ...]:
        """The exposition sample names this source reads (for engine detection)."""
        raise NotImplementedError


def _agg(by: str, expr: str, max_over: tuple[str, ...]) -> str:
    """``sum by (by)`` of ``expr``; with ``max_over``, the largest per-rank sum instead."""
    if not max_over:
        return f"sum by ({by}) ({expr})"
    return f"max by ({by}) (sum by ({by}, {', '.join(max_over)}) ({expr}))"


@dataclass(frozen=True)
class Gauge(Source):
    """A gauge as it is (summed over non-entity labels, max over ``max_over``), times ``scale``."""

    name: str
    match: Labels = ()
    scale: float = 1.0
    max_over: tuple[str, ...] = ()

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        grouped = _group(cur.get(self.name), self.match, ctx, max_over=self.max_over)
        return {ent: v * self.scale for (ent, _), v in grouped.items()}

    def promql(self, window: str, by: str = "instance") -> str:
        return _fmt_scale(_agg(by, _sel(self.name, self.match), self.max_over), self.scale)

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class CounterValue(Source):
    """A counter's cumulative value (e.g. preemptions so far); max over ``max_over`` labels."""

    name: str
    match: Labels = ()
    max_over: tuple[str, ...] = ()

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        return {ent: v for (ent, _), v in _group(cur.get(self.name), self.match, ctx, max_over=self.max_over).items()}

    def promql(self, window: str, by: str = "instance") -> str:
        return _agg(by, _sel(self.name, self.match), self.max_over)

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class CounterRate(Source):
    """Δcounter / Δt between two scrapes (per second), times ``scale``; max over ``max_over``."""

    name: str
    match: Labels = ()
    scale: float = 1.0
    max_over: tuple[str, ...] = ()

    def deltas(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        """entity -> Δcounter between the two scrapes (reset-aware); {} without ``prev``."""
        if prev is None:
            return {}
        c = _group(cur.get(self.name), self.match, ctx, max_over=self.max_over)
        p = _group(prev.get(self.name), self.match, ctx, max_over=self.max_over)
        return {key[0]: _delta(v, p.get(key)) for key, v in c.items()}

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        if prev is None or cur.ts_s <= prev.ts_s:
            return {}
        dt = cur.ts_s - prev.ts_s
        return {ent: d / dt * self.scale for ent, d in self.deltas(prev, cur, ctx).items()}

    def promql(self, window: str, by: str = "instance") -> str:
        return _fmt_scale(_agg(by, f"rate({_sel(self.name, self.match)}[{window}])", self.max_over), self.scale)

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class Histogram(Source):
    """A histogram ``<base>_bucket/_sum/_count``: windowed mean Δsum/Δcount × scale.

    :meth:`quantiles` gives percentiles from the bucket deltas (``le`` bounds × scale too).
    """

    base: str
    match: Labels = ()
    scale: float = 1.0

    def _deltas(self, suffix: str, prev: Snapshot, cur: Snapshot, ctx: EvalContext,
                extra_key: str | None = None) -> dict[tuple[str, str], float]:
        c = _group(cur.get(self.base + suffix), self.match, ctx, extra_key)
        p = _group(prev.get(self.base + suffix), self.match, ctx, extra_key)
        return {key: _delta(v, p.get(key)) for key, v in c.items()}

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        if prev is None:
            return {}
        sums = self._deltas("_sum", prev, cur, ctx)
        counts = self._deltas("_count", prev, cur, ctx)
        out = {}
        for key, n in counts.items():
            if n > 0 and key in sums:
                out[key[0]] = sums[key] / n * self.scale
        return out

    def quantiles(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext,
                  qs: Sequence[float] = PERCENTILES) -> dict[float, dict[str, float]]:
        """q → entity → windowed percentile (only entities with observations in the window)."""
        out: dict[float, dict[str, float]] = {q: {} for q in qs}
        if prev is None:
            return out
        d = self._deltas("_bucket", prev, cur, ctx, extra_key="le")
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
                    out[q][ent] = val * self.scale
        return out

    def promql(self, window: str, by: str = "instance") -> str:
        num = f"sum by ({by}) (rate({_sel(self.base + '_sum', self.match)}[{window}]))"
        den = f"sum by ({by}) (rate({_sel(self.base + '_count', self.match)}[{window}]))"
        return _fmt_scale(f"{num} / {den}", self.scale)

    def promql_quantile(self, q: float, window: str, by: str = "instance") -> str:
        inner = f"sum by ({by}, le) (rate({_sel(self.base + '_bucket', self.match)}[{window}]))"
        return _fmt_scale(f"histogram_quantile({q:g}, {inner})", self.scale)

    def names(self) -> tuple[str, ...]:
        return (self.base + "_bucket", self.base + "_sum", self.base + "_count")


@dataclass(frozen=True)
class CounterRatio(Source):
    """Δnum / Δden over the window × scale (e.g. Triton's cumulative µs per request)."""

    num: CounterRate
    den: CounterRate
    scale: float = 1.0

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        n = self.num.deltas(prev, cur, ctx)
        d = self.den.deltas(prev, cur, ctx)
        return {e: n[e] / d[e] * self.scale for e in n if d.get(e, 0) > 0}

    def promql(self, window: str, by: str = "instance") -> str:
        a = CounterRate(self.num.name, self.num.match).promql(window, by)
        b = CounterRate(self.den.name, self.den.match).promql(window, by)
        return _fmt_scale(f"{a} / {b}", self.scale)

    def names(self) -> tuple[str, ...]:
        return self.num.names() + self.den.names()


@dataclass(frozen=True)
class CounterSumRatio(Source):
    """Δnum / Σ Δden over the window (e.g. cache-hit tokens / all prompt tokens by source)."""

    num: CounterRate
    den: tuple[CounterRate, ...]

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        n = self.num.deltas(prev, cur, ctx)
        parts = [d.deltas(prev, cur, ctx) for d in self.den]
        out = {}
        for e, v in n.items():
            total = sum(p[e] for p in parts if e in p)
            if total > 0:
                out[e] = v / total
        return out

    def promql(self, window: str, by: str = "instance") -> str:
        den = " + ".join(f"({d.promql(window, by)})" for d in self.den)
        return f"({self.num.promql(window, by)}) / ({den})"

    def names(self) -> tuple[str, ...]:
        return self.num.names() + tuple(n for d in self.den for n in d.names())


@dataclass(frozen=True)
class GaugeRatio(Source):
    """num / den of two gauges (e.g. used / max KV blocks)."""

    num: Gauge
    den: Gauge

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        n = self.num.evaluate(prev, cur, ctx)
        d = self.den.evaluate(prev, cur, ctx)
        return {e: n[e] / d[e] for e in n if d.get(e, 0) > 0}

    def promql(self, window: str, by: str = "instance") -> str:
        return f"{self.num.promql(window, by)} / {self.den.promql(window, by)}"

    def names(self) -> tuple[str, ...]:
        return self.num.names() + self.den.names()


@dataclass(frozen=True)
class Combine(Source):
    """Σ sign·source over entities present in all parts (e.g. e2e − ttft ≈ decode)."""

    parts: tuple[tuple[float, Source], ...]

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        vals = [(sign, src.evaluate(prev, cur, ctx)) for sign, src in self.parts]
        if not vals:
            return {}
        common = set(vals[0][1])
        for _, v in vals[1:]:
            common &= set(v)
        return {e: sum(sign * v[e] for sign, v in vals) for e in common}

    def promql(self, window: str, by: str = "instance") -> str:
        out = ""
        for i, (sign, src) in enumerate(self.parts):
            term = f"({src.promql(window, by)})"
            if i == 0:
                out = term if sign > 0 else f"-{term}"
            else:
                out += f" {'+' if sign > 0 else '-'} {term}"
        return out

    def names(self) -> tuple[str, ...]:
        return tuple(n for _, s in self.parts for n in s.names())


@dataclass(frozen=True)
class SeriesMap:
    """A canonical series and its sources, tried in order; ``note`` says what it approximates."""

    series: str
    sources: tuple[Source, ...]
    note: str = ""

    def promql(self, window: str, by: str = "instance") -> str:
        """All sources joined with ``or`` (first present wins, per ``by`` value)."""
        exprs = [s.promql(window, by) for s in self.sources]
        return exprs[0] if len(exprs) == 1 else " or ".join(f"({e})" for e in exprs)


@dataclass(frozen=True)
class EngineAdapter:
    """One engine's table.

    ``prefixes`` (and ``exact_names``, for engines whose older releases export unprefixed
    names) detect it; ``entity_labels`` name replicas/engines. ``activity``: counters that
    advance whenever the engine works; when set, a window in which none of them advanced and
    every gauge kept its value is *stale* (SGLang sets its gauges only while logging stats, so
    they freeze when it is idle): its gauge rows are left out and ``gauges_stale`` is 1.
    ``source``: where the names were read, file @ commit (docs/engines.md has the table).
    """

    engine: str
    prefixes: tuple[str, ...]
    maps: tuple[SeriesMap, ...]
    entity_labels: tuple[str, ...] = ()
    note: str = ""
    exact_names: frozenset[str] = frozenset()
    activity: tuple[Source, ...] = ()
    source: str = ""

    def metric_names(self) -> set[str]:
        return {n for m in self.maps for s in m.sources for n in s.names()}

    def claims(self, name: str) -> bool:
        """Whether an exposition sample name belongs to this engine (for detection)."""
        return name.startswith(self.prefixes) or name in self.exact_names
