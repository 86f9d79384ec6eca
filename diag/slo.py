"""SLO specs such as ``ttft_p99=2s,tpot_p99=100ms,e2e_p95=10s``."""

from __future__ import annotations

import re

from diag.capture import CaptureError

_METRICS = ("ttft", "tpot", "itl", "e2e")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_ITEM = re.compile(r"^(ttft|tpot|itl|e2e)_(p50|p90|p95|p99|max|mean)=([0-9]*\.?[0-9]+)(s|ms|us)?$")


class SLOError(CaptureError):
    """A malformed SLO spec (one line, naming the item)."""


def slo_option(spec: str | None) -> dict[str, float] | None:
    """A command's ``--slo`` value: None when it was not given, else :func:`parse_slo`."""
    return parse_slo(spec) if spec else None


def parse_slo(spec: str) -> dict[str, float]:
    """Parse a comma-separated SLO spec into {"ttft_p99": seconds, ...}."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        m = _ITEM.match(item)
        if not m:
            raise SLOError(
                f"bad SLO item {item!r}: expected METRIC_PCT=VALUE[s|ms|us] with METRIC in {'/'.join(_METRICS)} "
                "and PCT in p50/p90/p95/p99/max/mean, e.g. ttft_p99=2s"
            )
        metric, pct, value, unit = m.groups()
        out[f"{metric}_{pct}"] = float(value) * _UNITS[unit or "s"]
    if not out:
        raise SLOError("empty SLO spec")
    return out
