"""Text sparklines and gauges shared by the view model and the widgets.

Numbers are formatted by :mod:`diag.ground.units` (the one formatter). Pure functions, any thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from diag.ground.units import is_num

SPARK_CHARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int | None = None, lo: float | None = None,
              hi: float | None = None) -> str:
    """Block-character sparkline; NaN becomes a space. ``lo``/``hi`` fix the scale."""
    vals = list(values)
    if width is not None and len(vals) > width:
        vals = vals[-width:]
    elif width is not None and vals and len(vals) < width:  # stretch coarse buckets to the width
        k = width // len(vals)
        vals = [v for v in vals for _ in range(k)]
    finite = [v for v in vals if is_num(v)]
    if not finite:
        return " " * len(vals)
    vmin = min(finite) if lo is None else lo
    vmax = max(finite) if hi is None else hi
    span = vmax - vmin
    out = []
    for v in vals:
        if not is_num(v):
            out.append(" ")
        elif span <= 0:
            out.append(SPARK_CHARS[0] if vmax == 0 else SPARK_CHARS[3])
        else:
            k = int((min(max(v, vmin), vmax) - vmin) / span * (len(SPARK_CHARS) - 1) + 0.5)
            out.append(SPARK_CHARS[k])
    return "".join(out)


def gauge(ratio: float | None, width: int = 20) -> str:
    """A horizontal gauge like ``█████████░░░░``; empty when ratio is unknown."""
    if not is_num(ratio):
        return "·" * width
    assert ratio is not None
    r = min(max(ratio, 0.0), 1.0)
    full = int(round(r * width))
    return "█" * full + "░" * (width - full)
