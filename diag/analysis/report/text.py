"""``ttft analyze``'s text: the verdict, its evidence and next checks, other findings, skipped rules,
then the per-stage decomposition.

Moved out of :class:`rules.Diagnosis` (the model holds data, renderers format it). Evidence
rows read as in every other renderer (:mod:`diag.analysis.report.cells`). Pure functions, any thread.
"""

from __future__ import annotations

from typing import Any

from diag.analysis import Analysis
from diag.analysis.report.cells import evidence_cells, fmt_confidence, fmt_explained, leading_line
from diag.ground.units import Unit, fmt_s, fmt_value
from rules import Diagnosis, Finding


def evidence_line(name: str, value: str, threshold: str, mark: str, meaning: str) -> str:
    """One aligned evidence line: name, value, ``(threshold ≥ 30%, ✓ crossed)``, meaning."""
    judged = ", ".join(x for x in (f"threshold {threshold}" if threshold else "", mark) if x)
    th = f"  ({judged})" if judged else ""
    return f"    {name:<34} {value:>12}{th}  {meaning}".rstrip()


def finding_body(f: Finding, ttft_p95_s: float | None, brief: bool = False) -> list[str]:
    """The lines under a finding's headline: time explained, note, evidence, next checks.

    ``brief`` (other findings) shows the first three evidence rows and no next checks.
    """
    lines: list[str] = []
    if f.explained_s is not None and f.explained_pct is not None:
        lines.append(f"  explains {fmt_explained(f, ttft_p95_s)}")
    if f.note:
        lines.append(f"  note: {f.note}")
    rows = f.evidence[:3] if brief else f.evidence
    if rows:
        if not brief:
            lines.append("  evidence:")
        for e in rows:
            c = evidence_cells(e)
            lines.append(evidence_line(c.name, c.value, c.threshold, c.mark, c.meaning))
    if f.next_checks and not brief:
        lines.append("  check next:")
        lines.extend(f"    - {c}" for c in f.next_checks)
    return lines


def format_diagnosis(d: Diagnosis, verbose: bool = False) -> str:
    """The whole diagnosis as text (what ``ttft analyze`` prints above the decomposition).

    ``verbose`` lists each rule that could not run with what it needed (feature names: for
    engineers); otherwise one line names them and says ``-v`` shows why."""
    out: list[str] = []
    v = d.verdict
    p95 = d.features.value("ttft_p95_s")
    out.append(f"verdict: {v.category} (confidence {fmt_confidence(v.confidence)}) - {v.title}")
    lead = leading_line(d.leading)
    if lead:
        out.append(lead)
    out.extend(finding_body(v, p95))
    others = [f for f in d.findings if f is not v]
    if others:
        out.append("")
        out.append("other findings (ranked; explained times overlap and are never added up):")
        for i, f in enumerate(others, 2):
            out.append(f"  {i}. {f.category} (confidence {fmt_confidence(f.confidence)}) - {f.title}")
            out.extend("  " + line for line in finding_body(f, p95, brief=True))
    if d.notes:
        out.append("")
        out.extend(f"note: {n}" for n in d.notes)
    if d.skipped and verbose:
        out.append("")
        out.append("skipped rules:")
        out.extend(f"  {s.rule_id:<16} {s.reason}" for s in d.skipped)
    elif d.skipped:
        out.append("")
        n = len(d.skipped)
        out.append(f"{n} rule{'s' if n > 1 else ''} could not run on this capture "
                   f"({', '.join(s.rule_id for s in d.skipped)}): -v lists what each needs")
    return "\n".join(out)


def format_decomposition(dec: dict[str, Any]) -> str:
    """The per-stage TTFT decomposition as an aligned text table."""
    if not dec["requests"]:
        return "no request completed: no TTFT to decompose"
    lines = []
    t = dec["ttft_s"]
    lines.append(
        f"TTFT over {dec['requests']} requests: p50 {fmt_s(t['p50'])}  p95 {fmt_s(t['p95'])}  p99 {fmt_s(t['p99'])}"
    )
    for side in ("server_ttft_s", "client_ttft_s"):
        s = dec.get(side)
        if s and s.get("count"):
            lines.append(f"  {side[:-7]:6s} TTFT: p50 {fmt_s(s['p50'])}  p95 {fmt_s(s['p95'])}  p99 {fmt_s(s['p99'])}  (n={s['count']})")
    lines.append("")
    lines.append(f"{'stage':<11} {'count':>7} {'p50':>9} {'p95':>9} {'p99':>9} {'share':>7}")
    for st, row in dec["stages"].items():
        share = row.get("share_of_ttft")
        share_s = f"{fmt_value(share, Unit.SHARE):>7}"
        lines.append(f"{st:<11} {row['count']:>7} {fmt_s(row['p50']):>9} {fmt_s(row['p95']):>9} {fmt_s(row['p99']):>9} {share_s}")
    if not dec["stages"]:
        lines.append("(no stage spans: a client-only capture, or no server instrumentation)")
    return "\n".join(lines)


def format_metrics_only(a: Analysis) -> str:
    """The footer of a capture with engine series and no request: what its numbers come from."""
    series = a.tables.series
    f = a.diagnosis.features if a.diagnosis is not None else None
    pct = {q: f.value(f"ttft_p{q}_s") if f is not None else None for q in (50, 95, 99)}
    ts = series["ts_s"].astype(float)
    ents = sorted(e for e in series["entity"].astype(str).unique() if e)
    sources = ", ".join(sorted(series["source"].astype(str).unique()))
    lines = [f"engine metrics only ({sources}): {ts.nunique()} scrapes over {fmt_s(ts.max() - ts.min())}"
             + (f" from {len(ents)} replicas (ttft analyze --by instance judges each)" if len(ents) > 1 else "")]
    if any(v is not None for v in pct.values()):
        lines.append(f"TTFT from the engine's histograms (windowed): p50 {fmt_s(pct[50])}  p95 {fmt_s(pct[95])}  "
                     f"p99 {fmt_s(pct[99])}")
    lines.append("no per-request spans: for every stage of each request, join a client capture (ttft probe) "
                 "and a server one (ttft instrument, --otlp, ttft receive)")
    return "\n".join(lines)


def format_analysis(a: Analysis, verbose: bool = False) -> str:
    """What ``ttft analyze`` prints: the diagnosis, the decomposition (or, for a capture of engine
    metrics alone, what its numbers come from), notes, clock offsets, warnings; ``verbose`` as
    for :func:`format_diagnosis`."""
    parts = []
    if a.diagnosis is not None:
        parts.append(format_diagnosis(a.diagnosis, verbose))
        parts.append("")
    if not len(a.tables.requests) and len(a.tables.series):
        parts.append(format_metrics_only(a))
    else:
        parts.append(format_decomposition(a.decomposition))
    if a.tables.lumped_notes:
        parts.append("")
        for eng, note in a.tables.lumped_notes.items():
            parts.append(f"note ({eng}): {note}")
    if a.tables.clock_offsets:
        parts.append("")
        parts.append("clock offsets (server - client, estimated): " + ", ".join(
            f"{k} {v * 1e3:+.3f} ms" for k, v in a.tables.clock_offsets.items()))
    for w in a.warnings[:20]:
        parts.append(f"warning: {w}")
    return "\n".join(parts)


__all__ = ["format_analysis", "format_decomposition", "format_diagnosis", "format_metrics_only", "finding_body",
           "evidence_line"]
