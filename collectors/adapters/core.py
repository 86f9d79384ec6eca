"""Scrape snapshots and the arithmetic every source shares: grouping, counter deltas, quantiles.

Pure code, no I/O; safe from any thread.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.ground.metric_sources import Labels

#: Percentiles emitted for every histogram-backed series, as extra series ``<series>_p<NN>``.
PERCENTILES: tuple[float, ...] = (0.5, 0.95, 0.99)


def percentile_series(series: str, q: float) -> str:
    """The series name of a windowed percentile: ``ttft_s`` and 0.99 → ``ttft_s_p99``."""
    pct = q * 100
    tag = f"{pct:g}".replace(".", "_")
    return f"{series}_p{tag}"


# --- snapshots ------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """One parsed scrape: sample name → list of (labels, value). ``ts_s`` is Unix seconds.

    Counter samples are indexed both with and without their ``_total`` suffix, because
    prometheus_client's parser adds ``_total`` to counters that were exposed without it (TGI).
    """

    ts_s: float
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def get(self, name: str) -> list[tuple[dict[str, str], float]]:
        return self.samples.get(name, [])

    def names(self) -> set[str]:
        return set(self.samples)


def snapshot_from_families(families: Iterable[Any], ts_s: float) -> Snapshot:
    """Build a Snapshot from ``prometheus_client`` metric families (``*_created`` dropped)."""
    snap = Snapshot(ts_s=ts_s)
    for fam in families:
        for s in fam.samples:
            name = s.name
            if name.endswith("_created"):
                continue
            value = float(s.value)
            entry = (dict(s.labels), value)
            snap.samples.setdefault(name, []).append(entry)
            if fam.type == "counter" and name.endswith("_total"):
                snap.samples.setdefault(name[: -len("_total")], []).append(entry)
    return snap


# --- evaluation helpers ---------------------------------------------------------------------


@dataclass(frozen=True)
class EvalContext:
    """How samples are grouped into entities for one scrape pair.

    ``entity_labels``: labels that name a replica/engine/model (kept apart when a family has
    more than one value of them, otherwise summed over). ``prefix``: prepended to the entity
    (e.g. the replica's URL), joined with "/".
    """

    entity_labels: tuple[str, ...] = ()
    prefix: str = ""


def _entity_of(labels: Mapping[str, str], keep: Sequence[str]) -> str:
    return ",".join(f"{k}={labels[k]}" for k in keep if k in labels)


def _matches(labels: Mapping[str, str], match: Labels) -> bool:
    return all(labels.get(k) == v for k, v in match)


def _group(samples: list[tuple[dict[str, str], float]], match: Labels, ctx: EvalContext,
           extra_key: str | None = None, max_over: tuple[str, ...] = ()) -> dict[tuple[str, str], float]:
    """Sum matching samples by (entity, extra label value).

    ``max_over``: labels that name replicas of one state (SGLang's ``tp_rank``, ``pp_rank``,
    ``moe_ep_rank``: every rank of a scheduler reports the same queue and KV pool). Samples are
    summed within one value of those labels and the largest sum is kept, so two ranks that each
    report 0.6 KV usage give 0.6, not 1.2.
    """
    chosen = [(lab, v) for lab, v in samples if _matches(lab, match)]
    keep = [k for k in ctx.entity_labels if len({lab.get(k) for lab, _ in chosen}) > 1]
    per_rank: dict[tuple[str, str, tuple[str, ...]], float] = {}
    for lab, v in chosen:
        ent = _entity_of(lab, keep)
        ek = lab.get(extra_key, "") if extra_key else ""
        rank = tuple(lab.get(k, "") for k in max_over)
        per_rank[(ent, ek, rank)] = per_rank.get((ent, ek, rank), 0.0) + v
    out: dict[tuple[str, str], float] = {}
    for (ent, ek, _), v in per_rank.items():
        out[(ent, ek)] = max(out[(ent, ek)], v) if (ent, ek) in out else v
    return out


def _delta(cur: float, prev: float | None) -> float:
    """Counter delta with Prometheus reset semantics (a drop means it restarted from 0).

    A label set absent from the previous scrape started from 0 (client libraries create
    labelled children on first use).
    """
    if prev is None:
        return cur
    d = cur - prev
    return cur if d < 0 else d


def _le(value: str) -> float:
    return math.inf if value in ("+Inf", "Inf", "inf") else float(value)


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` over (upper bound, cumulative count) pairs.

    Linear interpolation inside the bucket that holds rank q·total; the first bucket's lower
    bound is 0 (or its upper bound when that is ≤ 0); a rank in +Inf returns the highest
    finite bound. NaN when the window holds no observations.
    """
    if not buckets:
        return math.nan
    b = sorted(buckets)
    total = b[-1][1]
    if not (total > 0) or not math.isinf(b[-1][0]):
        return math.nan
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for i, (bound, count) in enumerate(b):
        if count >= rank:
            if math.isinf(bound):
                return b[-2][0] if len(b) > 1 else math.nan
            if i == 0 and bound <= 0:
                return bound
            in_bucket = count - prev_count
            if in_bucket <= 0:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / in_bucket
        prev_bound, prev_count = bound, count
    return b[-2][0] if len(b) > 1 else math.nan


def _sel(name: str, match: Labels) -> str:
    if not match:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in match)
    return f"{name}{{{inner}}}"


def _fmt_scale(expr: str, scale: float) -> str:
    return expr if scale == 1.0 else f"({expr}) * {scale:g}"

