"""``ttft diff A B --fail-on KEY=BOUND,...``: a regression gate for CI.

A bound is ``[+|-]N%`` (relative to A), ``[+|-]N{ms|s|us}`` (latency metrics), ``[+|-]Npts``
(shares, percentage points) or ``[+|-]N`` (counts and rates). ``+`` fails when B exceeds A by
more than the bound, ``-`` when B falls short of A by more; without a sign the metric's bad
direction is meant (latency and errors up, throughput down). A metric missing on either side
fails: a gate must not pass blind. Keys are the diff's metric names in lower case joined by
``_`` (:data:`METRIC_KEYS`). Pure, any thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diag.ground.capture import CaptureError
from diag.analysis.report.deltas import MetricDelta, metric_key
from diag.analysis.report.diff import METRIC_NAMES, RESOURCE_METRICS
from diag.ground.slo import UNITS_S

if TYPE_CHECKING:
    from diag.analysis.report.diff import DiffResult

#: key -> (display name, unit, better_when)
METRIC_KEYS: dict[str, tuple[str, str, int]] = {}
for _name in METRIC_NAMES:
    _res = next((r for r in RESOURCE_METRICS if r[0] == _name), None)
    if _res is not None:
        METRIC_KEYS[metric_key(_name)] = (_name, _res[1], _res[3])
    elif _name in ("requests ok", "errors"):
        METRIC_KEYS[metric_key(_name)] = (_name, "count", 1 if _name == "requests ok" else -1)
    else:
        METRIC_KEYS[metric_key(_name)] = (_name, "s", -1)

_ITEM = re.compile(r"^(?P<key>[a-z0-9_]+)=(?P<sign>[-+]?)(?P<num>[0-9]*\.?[0-9]+)(?P<unit>%|pts|ms|s|us|)$")


class FailOnError(CaptureError):
    """A malformed ``--fail-on`` spec (one line, naming the item)."""


@dataclass(frozen=True)
class Bound:
    """One bound: fail when ``sign * (B - A)`` is beyond ``rel`` (fraction of A) or ``abs``
    (the metric's unit: seconds, share 0..1, count, per second)."""

    spec: str
    key: str
    name: str
    sign: int
    rel: float | None
    abs: float | None


@dataclass(frozen=True)
class BoundResult:
    bound: Bound
    failed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        b = self.bound
        return {"key": b.key, "spec": b.spec, "direction": "+" if b.sign > 0 else "-", "rel": b.rel,
                "abs": b.abs, "failed": self.failed, "detail": self.detail}


def parse_fail_on(spec: str) -> list[Bound]:
    """``ttft_p99=+10%,requests=-5%`` -> bounds; FailOnError (one line) on a bad item."""
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        m = _ITEM.match(item)
        if not m:
            raise FailOnError(f"bad --fail-on item {item!r}: expected METRIC=[+|-]N% (or N ms/s/us, N pts, N), "
                              "e.g. ttft_p99=+10%")
        key, unit = m.group("key"), m.group("unit")
        if key not in METRIC_KEYS:
            raise FailOnError(f"--fail-on {item!r}: unknown metric {key!r}; known: {', '.join(METRIC_KEYS)}")
        name, munit, better = METRIC_KEYS[key]
        num = float(m.group("num"))
        sign = {"+": 1, "-": -1}.get(m.group("sign"), -better or 1)
        allowed = {"s": ("%", "ms", "s", "us"), "share": ("%", "pts"), "count": ("%", ""), "per_s": ("%", "")}[munit]
        if unit not in allowed:
            shown = " or ".join(u or "a plain number" for u in allowed)
            raise FailOnError(f"--fail-on {item!r}: {name} takes a unit of {shown}")
        rel = num / 100 if unit == "%" else None
        absolute = None if unit == "%" else num * (UNITS_S[unit] if unit in UNITS_S else 0.01 if unit == "pts" else 1.0)
        out.append(Bound(item, key, name, sign, rel, absolute))
    if not out:
        raise FailOnError("empty --fail-on spec")
    return out


def check_fail_on(bounds: list[Bound], r: DiffResult) -> list[BoundResult]:
    """Judge each bound on the diff's metrics."""
    return [_check(b, r.metric(b.name)) for b in bounds]


def _check(b: Bound, m: MetricDelta | None) -> BoundResult:
    if m is None or m.delta is None:
        return BoundResult(b, True, f"{b.key}: no data on both sides, cannot show it held")
    moved = b.sign * m.delta
    if b.rel is not None:
        rel = m.rel
        failed = moved > 0 and (rel is None or abs(rel) > b.rel)  # growth from 0 is beyond any share
    else:
        failed = moved > (b.abs or 0.0)
    verb = "beyond" if failed else "within"
    return BoundResult(b, failed, f"{b.key}: {m.fmt_change()} {verb} {b.spec.partition('=')[2]}")


__all__ = ["Bound", "BoundResult", "FailOnError", "METRIC_KEYS", "check_fail_on", "parse_fail_on"]
