"""Hand-built inline SVG charts for reports: line, scatter (with a fitted line), stacked
horizontal bars and vertical bars, plus a text sparkline for Markdown.

Every function returns one self-contained ``<svg>`` element as a string, meant to be inlined
in HTML5 (so it carries no ``xmlns``); it uses no scripts, no external fonts and no links, so
a report opens with no network. Every piece of text that goes into the SVG (titles, labels,
legends, tooltips) is XML-escaped here, so callers may pass strings that came from a trace.
Numbers on axes and tooltips are formatted by the caller's ``Fmt`` (a :mod:`diag.units` formatter).
Charts scale with their container (``viewBox`` + ``width: 100%``). Large inputs are thinned
before drawing (``max_points``), so a chart stays a few hundred kilobytes at most.
Coordinates are pixels of the viewBox; data values are in the caller's units.
"""

from __future__ import annotations

import html
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from diag.units import Unit, fmt_value

Fmt = Callable[[float], str]

#: A colour-blind-friendly qualitative palette (Okabe-Ito, plus greys).
PALETTE: tuple[str, ...] = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000", "#999999",
)
FONT = "system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif"
_CHAR_W = 6.2  # approximate px per character at font-size 11


def esc(text: object) -> str:
    """Escape any value for SVG/HTML text and attribute positions."""
    return html.escape(str(text), quote=True)


def fmt_num(v: float) -> str:
    """An axis or bar number, as :func:`diag.units.fmt_value` writes a dimensionless one."""
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
class _Frame:
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


def _open(width: int, height: int, title: str) -> list[str]:
    return [
        f'<svg viewBox="0 0 {width} {height}" width="100%" '
        f'style="max-width:{width}px;height:auto" role="img" aria-label="{esc(title)}" '
        f'font-family="{esc(FONT)}" font-size="11">',
        f"<title>{esc(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="8" y="16" font-size="13" font-weight="600" fill="#222">{esc(title)}</text>',
    ]


def _empty(width: int, height: int, title: str, message: str) -> str:
    parts = _open(width, height, title)
    parts.append(
        f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" fill="#777">{esc(message)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _finite_pairs(xs: Sequence[float], ys: Sequence[float]) -> list[tuple[float, float]]:
    out = []
    for x, y in zip(xs, ys):
        try:
            fx, fy = float(x), float(y)
        except (TypeError, ValueError):
            continue
        if math.isfinite(fx) and math.isfinite(fy):
            out.append((fx, fy))
    return out


def _thin(pairs: list[tuple[float, float]], max_points: int) -> list[int]:
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


def _axes(f: _Frame, x_label: str, y_label: str, x_fmt: Fmt, y_fmt: Fmt) -> None:
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


def _legend(parts: list[str], items: Sequence[tuple[str, str]], x_left: float, y: float, shape: str = "rect") -> None:
    """Legend items on one line starting at ``x_left`` (under the title)."""
    if not items:
        return
    widths = [14 + len(label) * _CHAR_W + 12 for label, _ in items]
    x = x_left
    for (label, color), w in zip(items, widths):
        if shape == "line":
            parts.append(f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x + 10:.1f}" y2="{y - 4:.1f}" stroke="{esc(color)}" stroke-width="2.5"/>')
        else:
            parts.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{esc(color)}"/>')
        parts.append(f'<text x="{x + 14:.1f}" y="{y:.1f}" fill="#333">{esc(label)}</text>')
        x += w


def _ranges(pairs_all: list[list[tuple[float, float]]], y_min: float | None, y_max: float | None,
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


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str = "",
    y_label: str = "",
    x_fmt: Fmt = fmt_num,
    y_fmt: Fmt = fmt_num,
    width: int = 720,
    height: int = 220,
    y_min: float | None = None,
    y_max: float | None = None,
    x_range: tuple[float, float] | None = None,
    max_points: int = 800,
) -> str:
    """Lines over a shared x axis; ``y_max`` pins the top (e.g. 1.0 for a ratio) and
    ``x_range`` the x axis (so that stacked timelines line up)."""
    pairs_all = [_finite_pairs(s.xs, s.ys) for s in series]
    if not any(pairs_all):
        return _empty(width, height, title, "no data")
    has_legend = len(series) > 1 or any(s.label for s in series)
    f = _Frame(width, height, top=46 if has_legend else 30)
    f.x_lo, f.x_hi, f.y_lo, f.y_hi = _ranges(pairs_all, y_min, y_max, x_range=x_range)
    f.parts = _open(width, height, title)
    _axes(f, x_label, y_label, x_fmt, y_fmt)
    legend = []
    for i, (s, pairs) in enumerate(zip(series, pairs_all)):
        if not pairs:
            continue
        color = s.color or PALETTE[i % len(PALETTE)]
        pts = [pairs[j] for j in _thin(pairs, max_points)]
        path = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in pts)
        if len(pts) == 1:
            x, y = pts[0]
            f.parts.append(f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="3" fill="{esc(color)}"/>')
        else:
            f.parts.append(f'<polyline points="{path}" fill="none" stroke="{esc(color)}" stroke-width="1.6" stroke-linejoin="round"/>')
        legend.append((s.label, color))
    if has_legend:
        _legend(f.parts, legend, f.left, 32, shape="line")
    f.parts.append("</svg>")
    return "".join(f.parts)


def scatter_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str = "",
    y_label: str = "",
    x_fmt: Fmt = fmt_num,
    y_fmt: Fmt = fmt_num,
    fit: Fit | None = None,
    lines: Sequence[Series] = (),
    width: int = 720,
    height: int = 260,
    x_range: tuple[float, float] | None = None,
    max_points: int = 1500,
) -> str:
    """Points (optionally with per-point tooltips), an optional fitted line and extra lines."""
    pairs_all = [_finite_pairs(s.xs, s.ys) for s in series]
    line_pairs = [_finite_pairs(s.xs, s.ys) for s in lines]
    if not any(pairs_all):
        return _empty(width, height, title, "no data")
    has_legend = any(s.label for s in series) or bool(lines) or fit is not None
    f = _Frame(width, height, top=46 if has_legend else 30)
    f.x_lo, f.x_hi, f.y_lo, f.y_hi = _ranges(pairs_all + line_pairs, None, None, x_min=0.0, x_range=x_range)
    f.parts = _open(width, height, title)
    _axes(f, x_label, y_label, x_fmt, y_fmt)
    legend = []
    for i, (s, pairs) in enumerate(zip(series, pairs_all)):
        if not pairs:
            continue
        color = s.color or PALETTE[i % len(PALETTE)]
        tips = list(s.tips) if s.tips is not None else None
        # keep tooltips aligned with the finite pairs
        if tips is not None and len(tips) != len(pairs):
            tips = None
        keep = _thin(pairs, max_points)
        f.parts.append(f'<g fill="{esc(color)}" fill-opacity="0.55">')
        for j in keep:
            x, y = pairs[j]
            tip = f"<title>{esc(tips[j])}</title>" if tips is not None else ""
            f.parts.append(f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="2.6">{tip}</circle>')
        f.parts.append("</g>")
        if s.label:
            legend.append((s.label, color))
    for i, (s, pairs) in enumerate(zip(lines, line_pairs)):
        if len(pairs) < 2:
            continue
        color = s.color or PALETTE[(i + 1) % len(PALETTE)]
        path = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in sorted(pairs))
        f.parts.append(f'<polyline points="{path}" fill="none" stroke="{esc(color)}" stroke-width="2"/>')
        legend.append((s.label, color))
    if fit is not None and math.isfinite(fit.slope) and math.isfinite(fit.intercept):
        x0, x1 = f.x_lo, f.x_hi
        y0, y1 = fit.slope * x0 + fit.intercept, fit.slope * x1 + fit.intercept
        # clip the line to the plot's y range; the id is derived from the title (unique per report)
        clip_id = f"clip{zlib.crc32(title.encode('utf-8')):08x}"
        f.parts.append(f'<clipPath id="{clip_id}"><rect x="{f.left}" y="{f.top}" width="{f.plot_w:.1f}" height="{f.plot_h:.1f}"/></clipPath>')
        f.parts.append(
            f'<line x1="{f.px(x0):.1f}" y1="{f.py(y0):.1f}" x2="{f.px(x1):.1f}" y2="{f.py(y1):.1f}" '
            f'stroke="{esc(fit.color)}" stroke-width="2" stroke-dasharray="6 4" clip-path="url(#{clip_id})"/>'
        )
        legend.append((fit.label, fit.color))
    _legend(f.parts, legend, f.left, 32, shape="line")
    f.parts.append("</svg>")
    return "".join(f.parts)


def stacked_hbar(
    rows: Sequence[tuple[str, Sequence[tuple[str, float]]]],
    *,
    title: str,
    colors: Mapping[str, str] | None = None,
    value_fmt: Fmt = fmt_num,
    width: int = 720,
    bar_h: int = 22,
    label_w: int = 150,
    x_label: str = "",
) -> str:
    """One horizontal bar per row, split into labelled segments (e.g. stages of TTFT).

    Segments are drawn in the given order; each has a tooltip with its label and value, and
    wide segments show their value inside. The x scale is shared by all rows.
    """
    clean = [(label, [(s, float(v)) for s, v in segs if v is not None and math.isfinite(float(v)) and float(v) > 0])
             for label, segs in rows]
    totals = [sum(v for _, v in segs) for _, segs in clean]
    seg_names: list[str] = []
    for _, segs in clean:
        for s, _ in segs:
            if s not in seg_names:
                seg_names.append(s)
    colors = dict(colors or {})
    for i, s in enumerate(seg_names):
        colors.setdefault(s, PALETTE[i % len(PALETTE)])
    legend_rows = _legend_layout([(s, colors[s]) for s in seg_names], width - 16)
    top = 28 + 16 * len(legend_rows)
    height = top + bar_h * len(clean) + (len(clean) - 1) * 6 + 34
    if not clean or max(totals, default=0) <= 0:
        return _empty(width, max(height, 80), title, "no data")
    parts = _open(width, height, title)
    for r, items in enumerate(legend_rows):
        for x, label, color in items:
            parts.append(f'<rect x="{x:.1f}" y="{26 + 16 * r:.1f}" width="10" height="10" fill="{esc(color)}"/>')
            parts.append(f'<text x="{x + 14:.1f}" y="{35 + 16 * r:.1f}" fill="#333">{esc(label)}</text>')
    x0 = label_w
    plot_w = width - label_w - 70
    scale = plot_w / max(totals)
    for t in nice_ticks(0, max(totals), 5):
        x = x0 + t * scale
        if x > x0 + plot_w + 1:
            continue
        y_end = top + bar_h * len(clean) + (len(clean) - 1) * 6
        parts.append(f'<line x1="{x:.1f}" y1="{top - 2}" x2="{x:.1f}" y2="{y_end + 2}" stroke="#eee"/>')
        parts.append(f'<text x="{x:.1f}" y="{y_end + 14}" text-anchor="middle" fill="#555">{esc(value_fmt(t))}</text>')
    if x_label:
        parts.append(f'<text x="{x0 + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle" fill="#333">{esc(x_label)}</text>')
    for i, ((label, segs), total) in enumerate(zip(clean, totals)):
        y = top + i * (bar_h + 6)
        shown = label if len(label) <= 24 else label[:23] + "…"
        parts.append(f'<text x="{x0 - 6}" y="{y + bar_h / 2 + 4:.1f}" text-anchor="end" fill="#333">{esc(shown)}<title>{esc(label)}</title></text>')
        x = float(x0)
        for s, v in segs:
            w = v * scale
            color = colors[s]
            parts.append(
                f'<rect x="{x:.2f}" y="{y}" width="{max(w, 0.5):.2f}" height="{bar_h}" fill="{esc(color)}">'
                f"<title>{esc(label)}: {esc(s)} {esc(value_fmt(v))}</title></rect>"
            )
            text = value_fmt(v)
            if w > len(text) * _CHAR_W + 8:
                fg = "#000" if color.upper() in ("#F0E442", "#E69F00", "#56B4E9", "#999999") else "#fff"
                parts.append(f'<text x="{x + w / 2:.1f}" y="{y + bar_h / 2 + 4:.1f}" text-anchor="middle" fill="{fg}">{esc(text)}</text>')
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + bar_h / 2 + 4:.1f}" fill="#222" font-weight="600">{esc(value_fmt(total))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _legend_layout(items: Sequence[tuple[str, str]], max_w: float) -> list[list[tuple[float, str, str]]]:
    rows: list[list[tuple[float, str, str]]] = [[]]
    x = 8.0
    for label, color in items:
        w = 14 + len(label) * _CHAR_W + 14
        if x + w > max_w and rows[-1]:
            rows.append([])
            x = 8.0
        rows[-1].append((x, label, color))
        x += w
    return rows if rows[0] else []


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    y_label: str = "",
    value_fmt: Fmt = fmt_num,
    colors: Sequence[str] | None = None,
    width: int = 720,
    height: int = 220,
    x_label: str = "",
) -> str:
    """Vertical bars with their value on top (e.g. a histogram or percentiles)."""
    pairs = [(str(lab), float(v)) for lab, v in zip(labels, values) if v is not None and math.isfinite(float(v))]
    if not pairs:
        return _empty(width, height, title, "no data")
    f = _Frame(width, height)
    f.y_lo = min(0.0, min(v for _, v in pairs))
    f.y_hi = max(v for _, v in pairs) * 1.12 or 1.0
    f.parts = _open(width, height, title)
    p = f.parts
    for t in nice_ticks(f.y_lo, f.y_hi, 4):
        y = f.py(t)
        p.append(f'<line x1="{f.left}" y1="{y:.1f}" x2="{width - f.right}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        p.append(f'<text x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{esc(value_fmt(t))}</text>')
    n = len(pairs)
    slot = f.plot_w / n
    bw = max(1.0, slot * 0.72)
    label_px = max(len(lab) for lab, _ in pairs) * _CHAR_W + 10
    every = max(1, math.ceil(label_px / slot))
    for i, (lab, v) in enumerate(pairs):
        x = f.left + i * slot + (slot - bw) / 2
        y0, y1 = f.py(0), f.py(v)
        color = colors[i % len(colors)] if colors else PALETTE[0]
        p.append(
            f'<rect x="{x:.1f}" y="{min(y0, y1):.1f}" width="{bw:.1f}" height="{abs(y0 - y1):.1f}" fill="{esc(color)}">'
            f"<title>{esc(lab)}: {esc(value_fmt(v))}</title></rect>"
        )
        if n <= 16:
            p.append(f'<text x="{x + bw / 2:.1f}" y="{min(y0, y1) - 4:.1f}" text-anchor="middle" fill="#222">{esc(value_fmt(v))}</text>')
        if i % every == 0:
            p.append(f'<text x="{x + bw / 2:.1f}" y="{f.top + f.plot_h + 16}" text-anchor="middle" fill="#555">{esc(lab)}</text>')
    p.append(f'<line x1="{f.left}" y1="{f.py(0):.1f}" x2="{width - f.right}" y2="{f.py(0):.1f}" stroke="#999"/>')
    if x_label:
        p.append(f'<text x="{f.left + f.plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" fill="#333">{esc(x_label)}</text>')
    if y_label:
        cy = f.top + f.plot_h / 2
        p.append(f'<text x="12" y="{cy:.1f}" text-anchor="middle" fill="#333" transform="rotate(-90 12 {cy:.1f})">{esc(y_label)}</text>')
    p.append("</svg>")
    return "".join(p)


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
