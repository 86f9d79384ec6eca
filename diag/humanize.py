"""Human-readable numbers for text output (CLI tables, the TUI). Pure functions, any thread."""

from __future__ import annotations

import math


def is_num(v: object) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def fmt_s(v: float | None) -> str:
    """Seconds as a short human string: 850µs, 12.3ms, 1.52s, 3m05s ("-" when missing)."""
    if not is_num(v):
        return "-"
    assert v is not None
    a = abs(v)
    if a >= 120:
        return f"{int(v // 60)}m{int(v % 60):02d}s"
    if a >= 1:
        return f"{v:.2f}s"
    if a >= 1e-3:
        return f"{v * 1e3:.1f}ms"
    if a == 0:
        return "0"
    return f"{v * 1e6:.0f}µs"
