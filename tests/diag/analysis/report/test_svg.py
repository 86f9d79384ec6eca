"""diag.analysis.report.svg: hand-built charts are well-formed XML, escape their text and stay small."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from diag.analysis.report import svg
from diag.ground.units import fmt_s, fmt_value

EVIL = '<script>alert("x")</script> & co'


def _parse(text: str) -> ET.Element:
    root = ET.fromstring(text)  # raises on malformed XML (unescaped < or &)
    assert root.tag == "svg"
    return root


def _texts(root: ET.Element) -> str:
    return " ".join("".join(e.itertext()) for e in root.iter("text"))


def test_line_chart_well_formed_and_escaped() -> None:
    s = svg.line_chart([svg.Series(EVIL, [0, 1, 2, 3], [0.1, 0.5, 0.2, 0.9]), svg.Series("b", [0, 3], [0, 1])],
                       title=f"title {EVIL}", x_label="t", y_label=EVIL, y_fmt=lambda v: fmt_value(v, "share"), y_min=0, y_max=1)
    root = _parse(s)
    assert "<script" not in s and "&lt;script&gt;" in s
    assert EVIL in _texts(root)
    assert len(root.findall("polyline")) == 2
    assert "http" not in s and "href" not in s


def test_line_chart_x_range_pins_axis() -> None:
    s = svg.line_chart([svg.Series("a", [5, 6], [1, 2])], title="t", x_range=(0.0, 10.0))
    root = _parse(s)
    labels = [t.text for t in root.iter("text")]
    assert "0" in labels and "10" in labels


def test_scatter_with_fit_tooltips_and_thinning() -> None:
    xs = list(range(100_000))
    ys = [0.001 * x + (x % 7) * 1e-3 for x in xs]
    s = svg.scatter_chart([svg.Series("", xs, ys)], title="many", fit=svg.Fit(0.001, 0.0, f"fit {EVIL}"),
                          max_points=500)
    root = _parse(s)
    circles = list(root.iter("circle"))
    assert 0 < len(circles) <= 500
    assert len(s) < 120_000
    assert any(e.get("stroke-dasharray") for e in root.iter("line"))  # the fitted line
    tips = svg.scatter_chart([svg.Series("pts", [1, 2], [3, 4], tips=[EVIL, "b"])], title="t")
    r2 = _parse(tips)
    assert EVIL in "".join("".join(t.itertext()) for c in r2.iter("circle") for t in c)


def test_thinning_keeps_spikes() -> None:
    ys = [1.0] * 10_000
    ys[5_001] = 100.0
    s = svg.line_chart([svg.Series("a", list(range(10_000)), ys)], title="spike", max_points=100)
    root = _parse(s)
    pts = root.find("polyline").get("points").split()
    assert len(pts) <= 100
    ymin_px = min(float(p.split(",")[1]) for p in pts)
    assert ymin_px < 60  # the spike reaches the top of the plot (plot top is y=30..46)


def test_stacked_hbar_proportions_and_labels() -> None:
    rows = [("req <1>", [("queue", 0.03), ("prefill", 0.01)]), ("r2", [("queue", 0.01), ("prefill", 0.01), ("x", float("nan"))])]
    s = svg.stacked_hbar(rows, title="stages", colors={"queue": "#E69F00"}, value_fmt=fmt_s)
    root = _parse(s)
    bars = [r for r in root.iter("rect") if r.find("title") is not None]
    widths = {r.find("title").text: float(r.get("width")) for r in bars}
    assert widths["req <1>: queue 30.0 ms"] == pytest.approx(3 * widths["req <1>: prefill 10.0 ms"], rel=1e-3)
    assert widths["r2: queue 10.0 ms"] == pytest.approx(widths["req <1>: prefill 10.0 ms"], rel=1e-3)
    assert "req &lt;1&gt;" in s
    assert "40.0 ms" in _texts(root)  # row total
    assert any(r.get("fill") == "#E69F00" for r in bars)


def test_bar_chart_and_empty_inputs() -> None:
    s = svg.bar_chart(["a", "<b>"], [3, 5], title="bars")
    root = _parse(s)
    assert len([r for r in root.iter("rect") if r.find("title") is not None]) == 2
    for empty in (svg.line_chart([svg.Series("a", [], [])], title="e"),
                  svg.scatter_chart([svg.Series("a", [1], [float("nan")])], title="e"),
                  svg.stacked_hbar([], title="e"),
                  svg.bar_chart([], [], title="e")):
        assert "no data" in _texts(_parse(empty))


def test_formatters_and_ticks() -> None:
    # axis numbers are diag.ground.units' dimensionless numbers (durations and shares: tests/diag/ground/test_units.py)
    assert svg.fmt_num(12345) == "12345"
    assert svg.fmt_num(0.0123) == "0.0123"
    assert svg.fmt_num(float("nan")) == "-"
    ticks = svg.nice_ticks(0, 0.037, 4)
    assert ticks[0] == 0 and 0.02 < ticks[-1] <= 0.037 and all(b > a for a, b in zip(ticks, ticks[1:]))
    assert svg.nice_ticks(5, 5) and math.isfinite(svg.nice_ticks(5, 5)[0])


def test_sparkline() -> None:
    sp = svg.sparkline([0, 1, 2, 3, 4, 5, 6, 7])
    assert sp == "▁▂▃▄▅▆▇█"
    assert len(svg.sparkline(list(range(1000)), width=40)) == 40
    assert svg.sparkline([]) == ""
    assert svg.sparkline([2, 2, 2]) == "▁▁▁"
