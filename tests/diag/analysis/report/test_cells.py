"""diag.analysis.report.cells: how one evidence row and a finding's headline read in every renderer."""

from __future__ import annotations

from diag.analysis.report.cells import EvidenceCells, evidence_cells, fmt_confidence, fmt_explained
from rules import Evidence
from support.report_workload import finding


def test_evidence_cells_use_the_units_formatter_and_the_crossed_mark() -> None:
    assert evidence_cells(Evidence("queue share", 0.6, 0.3, "share", "waiting", ">=", True)) == \
        EvidenceCells("queue share", "60%", "≥ 30%", "✓ crossed", "waiting")
    assert evidence_cells(Evidence("busy", 0.41, 0.5, "share", "idle", "<", False)) == \
        EvidenceCells("busy", "41%", "< 50%", "✗ not crossed", "idle")
    assert evidence_cells(Evidence("p50", 150.0, None, "s", "")) == EvidenceCells("p50", "2m30s", "", "", "")
    # a legacy text threshold is shown as it is
    assert evidence_cells(Evidence("x", 2.0, ">= 1.5x", "x", "m")).threshold == ">= 1.5x"


def test_explained_and_confidence() -> None:
    f = finding("queue", "t", 0.82, explained_s=0.0099, explained_pct=41.0)
    assert fmt_explained(f) == "9.9 ms (41% of TTFT p95)"
    assert fmt_explained(f, 0.024) == "9.9 ms (41% of TTFT p95 24.0 ms)"
    assert fmt_explained(finding("decode", "t", explained_s=None, explained_pct=None)) == "-"
    assert fmt_explained(finding("queue", "t", explained_s=None, explained_pct=5.0)) == "5.0% of TTFT p95"
    assert fmt_confidence(0.82) == "82%" and fmt_confidence(0.05) == "5.0%"
