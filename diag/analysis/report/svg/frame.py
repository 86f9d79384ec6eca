"""The pieces every SVG chart shares: text escaping, tick values, the data series, the plot
frame (viewBox pixels <-> data units), axes, legends and thinning of large inputs.

Pure functions, any thread; coordinates are pixels of the viewBox, data values the caller's units.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from diag.ground.units import Unit, fmt_value

Fmt = Callable[[float], str]

#: A colour-blind-friendly qualitative palette (Okabe-Ito, plus greys).
PALETTE: tuple[str, ...] = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000", "#999999",
)
FONT = "system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif"
CHAR_W = 6.2  # approximate px per character at font-size 11


def esc(text: object) -> str:
    """Escape any value for SVG/HTML text and attribute positions."""
    return html.escape(str(text), quote=True)


def fmt_num(v: float) -> str:
    """An axis or bar number, as :func:`diag.ground.units.fmt_value` writes a dimensionless one."""
    return fmt_value(v, Unit.NONE)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) if lo else 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            step = m * mag
            break
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9 and len(ticks) < 50:
        if t >= lo - step * 1e-9:
            ticks.append(round(t, 12))
        t += step
    return ticks or [lo]


@dataclass
class Series:
    """One line or point group: x and y values in data units, a legend label, a colour."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str | None = None
    tips: Sequence[str] | None = None  # per-point tooltip text (scatter only)


@dataclass
class Fit:
    """A straight line y = slope * x + intercept drawn over the x range, with its label."""

    slope: float
    intercept: float
    label: str
    color: str = "#D55E00"


@dataclass
class Frame:
    width: int
    height: int
    left: int = 64
    right: int = 16
    top: int = 34
    bottom: int = 40
    x_lo: float = 0.0
    x_hi: float = 1.0
    y_lo: float = 0.0
    y_hi: float = 1.0
    parts: list[str] = field(default_factory=list)

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom

    def px(self, x: float) -> float:
        span = self.x_hi - self.x_lo or 1.0
        return self.left + (x - self.x_lo) / span * self.plot_w

    def py(self, y: float) -> float:
        span = self.y_hi - self.y_lo or 1.0
        return self.top + self.plot_h - (y - self.y_lo) / span * self.plot_h


def svg_open(width: int, height: int, title: str) -> list[str]:
    return [
        f'<svg viewBox="0 0 {width} {height}" width="100%" '
        f'style="max-width:{width}px;height:auto" role="img" aria-label="{esc(title)}" '
        f'font-family="{esc(FONT)}" font-size="11">',
        f"<title>{esc(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="8" y="16" font-size="13" font-weight="600" fill="#222">{esc(title)}</text>',
    ]


def svg_empty(width: int, height: int, title: str, message: str) -> str:
    parts = svg_open(width, height, title)
    parts.append(
        f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" fill="#777">{esc(message)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def finite_pairs(xs: Sequence[float], ys: Sequence[float]) -> list[tuple[float, float]]:
    out = []
    for x, y in zip(xs, ys):
        try:
            fx, fy = float(x), float(y)
        except (TypeError, ValueError):
            continue
        if math.isfinite(fx) and math.isfinite(fy):
            out.append((fx, fy))
    return out


def thin(pairs: list[tuple[float, float]], max_points: int) -> list[int]:
    """Indices to keep: every k-th point, plus each stride's maximum (spikes stay visible)."""
    n = len(pairs)
    if n <= max_points:
        return list(range(n))
    k = math.ceil(n / max_points)
    keep = []
    for s in range(0, n, k):
        block = range(s, min(s + k, n))
        keep.append(max(block, key=lambda i: pairs[i][1]))
    return keep


def draw_axes(f: Frame, x_label: str, y_label: str, x_fmt: Fmt, y_fmt: Fmt) -> None:
    p = f.parts
    for t in nice_ticks(f.y_lo, f.y_hi, 4):
        y = f.py(t)
        p.append(f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.width - f.right}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        p.append(f'<text x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{esc(y_fmt(t))}</text>')
    for t in nice_ticks(f.x_lo, f.x_hi, 6):
        x = f.px(t)
        p.append(f'<line x1="{x:.1f}" y1="{f.top + f.plot_h}" x2="{x:.1f}" y2="{f.top + f.plot_h + 4}" stroke="#999"/>')
        p.append(f'<text x="{x:.1f}" y="{f.top + f.plot_h + 16}" text-anchor="middle" fill="#555">{esc(x_fmt(t))}</text>')
    p.append(
        f'<line x1="{f.left}" y1="{f.top + f.plot_h}" x2="{f.width - f.right}" y2="{f.top + f.plot_h}" stroke="#999"/>'
    )
    p.append(f'<line x1="{f.left}" y1="{f.top}" x2="{f.left}" y2="{f.top + f.plot_h}" stroke="#999"/>')
    if x_label:
        p.append(
            f'<text x="{f.left + f.plot_w / 2:.1f}" y="{f.height - 6}" text-anchor="middle" fill="#333">{esc(x_label)}</text>'
        )
    if y_label:
        cy = f.top + f.plot_h / 2
        p.append(
            f'<text x="12" y="{cy:.1f}" text-anchor="middle" fill="#333" transform="rotate(-90 12 {cy:.1f})">{esc(y_label)}</text>'
        )


def draw_legend(parts: list[str], items: Sequence[tuple[str, str]], x_left: float, y: float, shape: str = "rect") -> None:
    """Legend items on one line starting at ``x_left`` (under the title)."""
    if not items:
        return
    widths = [14 + len(label) * CHAR_W + 12 for label, _ in items]
    x = x_left
    for (label, color), w in zip(items, widths):
        if shape == "line":
            parts.append(f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x + 10:.1f}" y2="{y - 4:.1f}" stroke="{esc(color)}" stroke-width="2.5"/>')
        else:
            parts.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{esc(color)}"/>')
        parts.append(f'<text x="{x + 14:.1f}" y="{y:.1f}" fill="#333">{esc(label)}</text>')
        x += w


def ranges(pairs_all: list[list[tuple[float, float]]], y_min: float | None, y_max: float | None,
            x_min: float | None = None, x_range: tuple[float, float] | None = None) -> tuple[float, float, float, float]:
    xs = [x for pairs in pairs_all for x, _ in pairs]
    ys = [y for pairs in pairs_all for _, y in pairs]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_min is not None:
        x_lo = min(x_lo, x_min)
    if x_range is not None:
        x_lo, x_hi = x_range
    y_lo = min(ys) if ys else 0.0
    y_hi = max(ys) if ys else 1.0
    y_lo = min(0.0, y_lo) if y_min is None else y_min
    if y_max is not None:
        y_hi = y_max
    if y_hi <= y_lo:
        y_hi = y_lo + (abs(y_lo) if y_lo else 1.0)
    else:
        y_hi = y_hi + (y_hi - y_lo) * 0.05
    if x_hi <= x_lo:
        x_hi = x_lo + 1.0
    return x_lo, x_hi, y_lo, y_hi
