"""How one evidence row and one finding's headline read, in every renderer.

``ttft analyze`` (:mod:`diag.analysis.report.text`), the Markdown and HTML reports and the TUI all lay
out these strings, so the same evidence reads the same everywhere. Numbers go through
:func:`diag.ground.units.fmt_value`. Pure functions, any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.ground.units import Unit, crossed_mark, fmt_threshold, fmt_value
from rules import Evidence, Finding


@dataclass(frozen=True)
class EvidenceCells:
    """An evidence row as text: name, value, threshold (``""`` for a context row), the crossed
    mark (``✓ crossed`` / ``✗ not crossed`` / ``""``) and what it means."""

    name: str
    value: str
    threshold: str
    mark: str
    meaning: str


def evidence_cells(e: Evidence) -> EvidenceCells:
    """The cells of ``e``: its value and threshold in its unit, and its crossed mark."""
    return EvidenceCells(e.name, fmt_value(e.value, e.unit), fmt_threshold(e.op, e.threshold, e.unit),
                         crossed_mark(e.crossed), e.meaning or "")


def fmt_confidence(confidence: float | None) -> str:
    """A confidence 0..1 as a percent (``82%``)."""
    return fmt_value(confidence, Unit.SHARE)


def fmt_explained(f: Finding, ttft_p95_s: float | None = None) -> str:
    """The TTFT time a finding explains: ``9.9 ms (41% of TTFT p95)``; ``-`` when it explains none.

    ``ttft_p95_s`` adds the p95 itself: ``9.9 ms (41% of TTFT p95 24.1 ms)``.
    """
    of = "of TTFT p95" + (f" {fmt_value(ttft_p95_s, Unit.S)}" if ttft_p95_s is not None else "")
    if f.explained_s is None:
        return f"{fmt_value(f.explained_pct, Unit.PCT)} {of}" if f.explained_pct is not None else "-"
    pct = f" ({fmt_value(f.explained_pct, Unit.PCT)} {of})" if f.explained_pct is not None else ""
    return fmt_value(f.explained_s, Unit.S) + pct


def leading_line(leading: Finding | None) -> str | None:
    """The leading candidate under the verdict (a cause below the verdict floor, ``rules.verdict``):
    ``leading candidate (not sure enough to be the verdict): queue (36%) - <title>``; None without one."""
    if leading is None:
        return None
    return (f"leading candidate (not sure enough to be the verdict): {leading.category} "
            f"({fmt_confidence(leading.confidence)}) - {leading.title}")


__all__ = ["EvidenceCells", "evidence_cells", "fmt_confidence", "fmt_explained", "leading_line"]
