"""Hand-built inline SVG charts for reports: line, scatter (with a fitted line), stacked
horizontal bars and vertical bars, plus a text sparkline for Markdown.

Every function returns one self-contained ``<svg>`` element as a string, meant to be inlined
in HTML5 (so it carries no ``xmlns``); it uses no scripts, no external fonts and no links, so
a report opens with no network. Every piece of text that goes into the SVG (titles, labels,
legends, tooltips) is XML-escaped here, so callers may pass strings that came from a trace.
Numbers on axes and tooltips are formatted by the caller's ``Fmt`` (a :mod:`diag.ground.units` formatter).
Charts scale with their container (``viewBox`` + ``width: 100%``). Large inputs are thinned
before drawing (``max_points``), so a chart stays a few hundred kilobytes at most.
Coordinates are pixels of the viewBox; data values are in the caller's units.

Front door: the chart functions live in :mod:`~diag.analysis.report.svg.xy` (line, scatter) and
:mod:`~diag.analysis.report.svg.bars` (stacked and vertical bars) over :mod:`~diag.analysis.report.svg.frame`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from diag.analysis.report.svg.bars import bar_chart, stacked_hbar
from diag.analysis.report.svg.frame import PALETTE, Fit, Fmt, Series, esc, fmt_num, nice_ticks
from diag.analysis.report.svg.xy import line_chart, scatter_chart

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 48, lo: float | None = None, hi: float | None = None) -> str:
    """A one-line text sparkline (block characters), values averaged into ``width`` bins."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return ""
    if len(vals) > width:
        k = len(vals) / width
        vals = [
            sum(vals[int(i * k): max(int((i + 1) * k), int(i * k) + 1)]) / len(vals[int(i * k): max(int((i + 1) * k), int(i * k) + 1)])
            for i in range(width)
        ]
    a = min(vals) if lo is None else lo
    b = max(vals) if hi is None else hi
    if b <= a:
        return _SPARK[0] * len(vals)
    return "".join(_SPARK[min(len(_SPARK) - 1, max(0, int((v - a) / (b - a) * (len(_SPARK) - 1) + 0.5)))] for v in vals)


__all__ = ["PALETTE", "Fit", "Fmt", "Series", "bar_chart", "esc", "fmt_num", "line_chart", "nice_ticks",
           "scatter_chart", "sparkline", "stacked_hbar"]
