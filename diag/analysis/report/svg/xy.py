"""Line and scatter charts (with a fitted line and median curves) as inline SVG.

Every piece of text is XML-escaped here; numbers go through the caller's ``Fmt``. Pure functions, any thread.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

from diag.analysis.report.svg.frame import (
    PALETTE, Fit, Fmt, Frame, Series, draw_axes, draw_legend, esc, finite_pairs, fmt_num, ranges, svg_empty,
    svg_open, thin,
)


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
    pairs_all = [finite_pairs(s.xs, s.ys) for s in series]
    if not any(pairs_all):
        return svg_empty(width, height, title, "no data")
    has_legend = len(series) > 1 or any(s.label for s in series)
    f = Frame(width, height, top=46 if has_legend else 30)
    f.x_lo, f.x_hi, f.y_lo, f.y_hi = ranges(pairs_all, y_min, y_max, x_range=x_range)
    f.parts = svg_open(width, height, title)
    draw_axes(f, x_label, y_label, x_fmt, y_fmt)
    legend = []
    for i, (s, pairs) in enumerate(zip(series, pairs_all)):
        if not pairs:
            continue
        color = s.color or PALETTE[i % len(PALETTE)]
        pts = [pairs[j] for j in thin(pairs, max_points)]
        path = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in pts)
        if len(pts) == 1:
            x, y = pts[0]
            f.parts.append(f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="3" fill="{esc(color)}"/>')
        else:
            f.parts.append(f'<polyline points="{path}" fill="none" stroke="{esc(color)}" stroke-width="1.6" stroke-linejoin="round"/>')
        legend.append((s.label, color))
    if has_legend:
        draw_legend(f.parts, legend, f.left, 32, shape="line")
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
    pairs_all = [finite_pairs(s.xs, s.ys) for s in series]
    line_pairs = [finite_pairs(s.xs, s.ys) for s in lines]
    if not any(pairs_all):
        return svg_empty(width, height, title, "no data")
    has_legend = any(s.label for s in series) or bool(lines) or fit is not None
    f = Frame(width, height, top=46 if has_legend else 30)
    f.x_lo, f.x_hi, f.y_lo, f.y_hi = ranges(pairs_all + line_pairs, None, None, x_min=0.0, x_range=x_range)
    f.parts = svg_open(width, height, title)
    draw_axes(f, x_label, y_label, x_fmt, y_fmt)
    legend = []
    for i, (s, pairs) in enumerate(zip(series, pairs_all)):
        if not pairs:
            continue
        color = s.color or PALETTE[i % len(PALETTE)]
        tips = list(s.tips) if s.tips is not None else None
        # keep tooltips aligned with the finite pairs
        if tips is not None and len(tips) != len(pairs):
            tips = None
        keep = thin(pairs, max_points)
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
    draw_legend(f.parts, legend, f.left, 32, shape="line")
    f.parts.append("</svg>")
    return "".join(f.parts)
