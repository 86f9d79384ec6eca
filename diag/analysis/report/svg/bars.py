"""Stacked horizontal bars (the stage waterfall) and vertical bars (the TTFT histogram) as inline SVG.

Every piece of text is XML-escaped here; numbers go through the caller's ``Fmt``. Pure functions, any thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from diag.analysis.report.svg.frame import (
    CHAR_W, PALETTE, Fmt, Frame, esc, fmt_num, nice_ticks, svg_empty, svg_open,
)


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
    legend_rows = legend_layout([(s, colors[s]) for s in seg_names], width - 16)
    top = 28 + 16 * len(legend_rows)
    height = top + bar_h * len(clean) + (len(clean) - 1) * 6 + 34
    if not clean or max(totals, default=0) <= 0:
        return svg_empty(width, max(height, 80), title, "no data")
    parts = svg_open(width, height, title)
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
            if w > len(text) * CHAR_W + 8:
                fg = "#000" if color.upper() in ("#F0E442", "#E69F00", "#56B4E9", "#999999") else "#fff"
                parts.append(f'<text x="{x + w / 2:.1f}" y="{y + bar_h / 2 + 4:.1f}" text-anchor="middle" fill="{fg}">{esc(text)}</text>')
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + bar_h / 2 + 4:.1f}" fill="#222" font-weight="600">{esc(value_fmt(total))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def legend_layout(items: Sequence[tuple[str, str]], max_w: float) -> list[list[tuple[float, str, str]]]:
    rows: list[list[tuple[float, str, str]]] = [[]]
    x = 8.0
    for label, color in items:
        w = 14 + len(label) * CHAR_W + 14
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
        return svg_empty(width, height, title, "no data")
    f = Frame(width, height)
    f.y_lo = min(0.0, min(v for _, v in pairs))
    f.y_hi = max(v for _, v in pairs) * 1.12 or 1.0
    f.parts = svg_open(width, height, title)
    p = f.parts
    for t in nice_ticks(f.y_lo, f.y_hi, 4):
        y = f.py(t)
        p.append(f'<line x1="{f.left}" y1="{y:.1f}" x2="{width - f.right}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        p.append(f'<text x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{esc(value_fmt(t))}</text>')
    n = len(pairs)
    slot = f.plot_w / n
    bw = max(1.0, slot * 0.72)
    label_px = max(len(lab) for lab, _ in pairs) * CHAR_W + 10
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
