"""SLO specs such as ``ttft_p99=2s,tpot_p99=100ms,e2e_p95=10s``.

Every value carries its unit (``s``, ``ms`` or ``us``): a bare number is refused, because
``vllm bench serve --goodput`` reads milliseconds where a bare number here once meant seconds.
Pure functions, any thread.
"""

from __future__ import annotations

import re

from diag.ground.capture import CaptureError

_METRICS = ("ttft", "tpot", "itl", "e2e")
_PCTS = ("p50", "p90", "p95", "p99", "max", "mean")
#: accepted units -> seconds per unit
UNITS_S: dict[str, float] = {"ms": 1e-3, "s": 1.0, "us": 1e-6}
_UNIT_NAMES = "ms, s or us"
_ITEM = re.compile(r"^(?P<key>[a-z0-9]+_[a-z0-9]+)=(?P<value>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?P<unit>[a-zA-Zµ]*)$")


class SLOError(CaptureError):
    """A malformed SLO spec (one line, naming the item)."""


def slo_option(spec: str | None) -> dict[str, float] | None:
    """A command's ``--slo`` value: None when it was not given, else :func:`parse_slo`."""
    return parse_slo(spec) if spec else None


def parse_slo(spec: str) -> dict[str, float]:
    """Parse a comma-separated SLO spec into {"ttft_p99": seconds, ...}; SLOError on any bad item."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        m = _ITEM.match(item)
        key = m.group("key") if m else ""
        metric, _, pct = key.partition("_")
        if not m or metric not in _METRICS or pct not in _PCTS:
            raise SLOError(
                f"bad SLO item {item!r}: expected METRIC_PCT=VALUE{{ms|s|us}} with METRIC in {'/'.join(_METRICS)} "
                f"and PCT in {'/'.join(_PCTS)}, e.g. ttft_p99=200ms"
            )
        unit = m.group("unit")
        if not unit:
            raise SLOError(f"SLO item {item!r} has no unit: write it in {_UNIT_NAMES} "
                           f"(e.g. {key}={m.group('value')}ms)")
        if unit not in UNITS_S:
            raise SLOError(f"SLO item {item!r}: unknown unit {unit!r}; use {_UNIT_NAMES}")
        out[key] = float(m.group("value")) * UNITS_S[unit]
    if not out:
        raise SLOError("empty SLO spec")
    return out
