"""Text and JSON for per-replica verdicts (``ttft analyze --by instance``)."""

from __future__ import annotations

from typing import Any

from diag.fleet import FleetAnalysis
from diag.report.cells import fmt_confidence, fmt_explained
from diag.report.jsondoc import envelope
from diag.report.text import format_diagnosis
from diag.units import fmt_s


def _row(name: str, category: str, confidence: str, p95: str, explains: str, width: int) -> str:
    return f"{name:<{width}}  {category:<16} {confidence:>10}  {p95:>9}  {explains}"


def format_fleet_table(f: FleetAnalysis) -> str:
    """The fleet's verdict line and one row per replica (the hot one marked)."""
    fleet_d = f.fleet.diagnosis
    out: list[str] = []
    if fleet_d is not None:
        v = fleet_d.verdict
        out.append(f"fleet ({len(f.replicas)} replicas by {f.by}): {v.category} "
                   f"(confidence {fmt_confidence(v.confidence)}) - {v.title}")
    width = max([len(f.by), *(len(r.name) for r in f.replicas)])
    out += ["", _row(f.by, "verdict", "confidence", "TTFT p95", "explains", width)]
    for r in f.replicas:
        d = r.analysis.diagnosis
        if d is None:
            continue
        out.append(_row(r.name, d.verdict.category, fmt_confidence(d.verdict.confidence), fmt_s(r.ttft_p95_s),
                        fmt_explained(d.verdict), width)
                   + ("   <- hot" if r.name == f.hot else ""))
    return "\n".join(out)


def format_fleet(f: FleetAnalysis, verbose: bool = False) -> str:
    """:func:`format_fleet_table`, then the hot replica's whole diagnosis."""
    out = [format_fleet_table(f), ""]
    hot = next((r for r in f.replicas if r.name == f.hot), None)
    if hot is None or hot.analysis.diagnosis is None:
        out.append("hot replica: none (no replica's own metrics name a bottleneck)")
    else:
        out.append(f"hot replica: {hot.name} (TTFT p95 {fmt_s(hot.ttft_p95_s)}, the highest of those with a bottleneck)")
        out.append("")
        out.append(format_diagnosis(hot.analysis.diagnosis, verbose))
    return "\n".join(out)


def fleet_document(f: FleetAnalysis) -> dict[str, Any]:
    """``ttft analyze --by LABEL --json``: the fleet's analysis, each replica's, and the hot one."""
    return envelope("fleet", f.to_dict())


__all__ = ["fleet_document", "format_fleet", "format_fleet_table"]
