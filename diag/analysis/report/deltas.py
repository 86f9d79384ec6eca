"""One metric, or one stage, in capture A and in capture B, and how the change reads.

``ttft diff`` (:mod:`diag.analysis.report.diff`) compares these; units: seconds (``s``), shares 0..1
(``share``), plain counts (``count``), counts per second (``per_s``). Pure, any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diag.ground.units import Unit, fmt_rate, fmt_value

#: A change smaller than both of these is noise, not a change (relative, absolute seconds).
MATERIAL_REL = 0.05
MATERIAL_ABS_S = 0.0005
#: Deltas below these print as "0" (clock rounding, float noise), per unit.
NOISE: dict[str, float] = {"s": 1e-6, "share": 1e-4, "count": 1e-9, "per_s": 1e-9}


@dataclass
class MetricDelta:
    """One metric in A and in B; ``unit`` is "s", "share" (0..1), "count" or "per_s" (a count per second)."""

    name: str
    unit: str
    a: float | None
    b: float | None
    #: +1 when higher is better (throughput), -1 when lower is (latency, errors), 0 context only
    better_when: int = 0

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def rel(self) -> float | None:
        d = self.delta
        if d is None or not self.a:
            return None
        return d / abs(self.a)

    def fmt(self, v: float | None) -> str:
        if self.unit == "per_s":
            return fmt_rate(v, Unit.COUNT)
        return fmt_value(v, self.unit)

    def fmt_delta(self) -> str:
        d = self.delta
        if d is None:
            return "-"
        if abs(d) < NOISE.get(self.unit, 0.0):
            return "0"
        if self.unit == "share":
            body = f"{d * 100:+.3g} pts"
        else:
            body = ("+" if d >= 0 else "-") + self.fmt(abs(d))
        rel = self.rel
        return body + (f" ({rel * 100:+.0f}%)" if rel is not None and self.unit != "share" else "")

    @property
    def key(self) -> str:
        """The name as ``--fail-on`` spells it: ``TTFT p99`` -> ``ttft_p99``."""
        return metric_key(self.name)

    @property
    def judgement(self) -> str | None:
        """"better" or "worse" in B when the change is material and the metric has a good
        direction; None for no material change or a context metric (KV usage, device busy)."""
        if not self.better_when or not material(self) or self.delta is None:
            return None
        return "better" if self.delta * self.better_when > 0 else "worse"

    def fmt_change(self) -> str:
        """``TTFT p50 110.1 ms -> 375.8 ms (+241%)``: name, both sides and the change."""
        rel = self.rel
        tail = f"{rel * 100:+.0f}%" if rel is not None and self.unit != "share" else self.fmt_delta()
        return f"{self.name} {self.fmt(self.a)} -> {self.fmt(self.b)} ({tail})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "a": self.a, "b": self.b, "delta": self.delta, "rel": self.rel,
                "better_when": self.better_when, "judgement": self.judgement}


def metric_key(name: str) -> str:
    """A metric's display name as a key: lower case, words joined by ``_``."""
    return "_".join(name.lower().split())


@dataclass
class StageDelta:
    """A stage's p50, mean and share of TTFT in A and in B (seconds; share 0..1)."""

    stage: str
    p50_a: float | None
    p50_b: float | None
    mean_a: float | None
    mean_b: float | None
    share_a: float | None
    share_b: float | None

    @property
    def mean_delta_s(self) -> float | None:
        if self.mean_a is None and self.mean_b is None:
            return None
        return (self.mean_b or 0.0) - (self.mean_a or 0.0)

    @property
    def p50_delta_s(self) -> float | None:
        if self.p50_a is None and self.p50_b is None:
            return None
        return (self.p50_b or 0.0) - (self.p50_a or 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "p50_a_s": self.p50_a, "p50_b_s": self.p50_b, "p50_delta_s": self.p50_delta_s,
                "mean_a_s": self.mean_a, "mean_b_s": self.mean_b, "mean_delta_s": self.mean_delta_s,
                "share_a": self.share_a, "share_b": self.share_b}


def material(m: MetricDelta | None) -> bool:
    """A real change: above both MATERIAL_ABS_S and MATERIAL_REL (a missing side is none)."""
    if m is None or m.delta is None:
        return False
    return abs(m.delta) > MATERIAL_ABS_S and (m.rel is None or abs(m.rel) > MATERIAL_REL)
