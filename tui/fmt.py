"""Number formatting and text sparklines/bars shared by the view model and the widgets.

Pure functions, safe on any thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from diag.humanize import fmt_s, is_num  # noqa: F401  (re-exported for the widgets)

SPARK_CHARS = "▁▂▃▄▅▆▇█"


def fmt_bytes(v: float | None) -> str:
    """Bytes with binary prefixes (GiB etc.)."""
    if not is_num(v):
        return "-"
    assert v is not None
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:.1f}{unit}"
    return f"{v:.0f}B"


def fmt_rate(v: float | None, unit: str = "/s") -> str:
    """A per-second rate with k/M suffix."""
    if not is_num(v):
        return "-"
    assert v is not None
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.1f}M{unit}"
    if a >= 1e3:
        return f"{v / 1e3:.1f}k{unit}"
    if a >= 10:
        return f"{v:.0f}{unit}"
    return f"{v:.2f}{unit}"


def fmt_pct(v: float | None, digits: int = 0) -> str:
    """A percentage given in percent (not a ratio)."""
    if not is_num(v):
        return "-"
    return f"{v:.{digits}f}%"


def fmt_value(value: object, unit: str | None) -> str:
    """An evidence value with its unit, formatted by the unit's kind."""
    if value is None:
        return "-"
    if not is_num(value):
        return str(value)
    v = float(value)  # type: ignore[arg-type]
    u = (unit or "").strip()
    if u in ("s", "seconds"):
        return fmt_s(v)
    if u == "ms":
        return fmt_s(v / 1e3)
    if u in ("%", "pct", "percent"):
        return fmt_pct(v, 1 if abs(v) < 10 else 0)
    if u in ("x", "×"):
        return f"{v:.1f}x"
    if u in ("ratio", "fraction", "share") or u.startswith("ratio") or u.startswith("share"):
        return fmt_pct(v * 100, 1 if abs(v) < 0.1 else 0)
    if u in ("bytes", "B"):
        return fmt_bytes(v)
    if u.endswith("/s"):
        return fmt_rate(v, " " + u)
    text = f"{v:.3g}"
    return f"{text} {u}" if u else text


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
