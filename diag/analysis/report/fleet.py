"""Text and JSON for per-replica verdicts (``ttft analyze --by instance``)."""

from __future__ import annotations

from typing import Any

from diag.analysis.fleet import FleetAnalysis
from diag.analysis.report.cells import fmt_confidence, fmt_explained
from diag.analysis.report.jsondoc import envelope
from diag.analysis.report.text import format_diagnosis
from diag.ground.units import fmt_s, fmt_value


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


def _top_stage(stages: dict[str, Any]) -> str:
    shares = [(v.get("share_of_ttft") or 0.0, k) for k, v in stages.items() if isinstance(v, dict)]
    if not shares:
        return "-"
    share, name = max(shares)
    return f"{name} {fmt_value(share, 'share')}"


def format_store(store: dict[str, Any]) -> str:
    """What a trace store answered (``--from-clickhouse``): per replica, every request of the
    window as the database aggregated it, how many the rules judged, and the slowest requests."""
    span_s = (int(store["to_ns"]) - int(store["from_ns"])) / 1e9
    out = [f"from {store['where']}: the last {fmt_s(span_s)}"
           + (f", service {store['service']}" if store.get("service") else "")
           + f"; the rules judge each replica's {store['sample_per_replica']} most recent requests", ""]
    reps = store.get("replicas") or {}
    width = max([len(store.get("by") or ""), *(len(n) for n in reps)])
    out.append(f"{store.get('by') or '':<{width}}  {'requests':>8} {'judged':>7} {'errors':>6}  {'TTFT p50':>9}  "
               f"{'p95':>9}  {'p99':>9}  largest stage")
    for name, r in reps.items():
        t = r["ttft_s"]
        out.append(f"{name:<{width}}  {r['requests']:>8} {r['judged_requests']:>7} {r['errors']:>6}  {fmt_s(t['p50']):>9}  "
                   f"{fmt_s(t['p95']):>9}  {fmt_s(t['p99']):>9}  {_top_stage(r['stages'])}")
    slow = store.get("slowest") or {}
    if slow:
        out += ["", "slowest requests (trace ids to open in the trace store):"]
        for name, rows in slow.items():
            for r in rows[:3]:
                st = {k[:-2]: {"share_of_ttft": (v / r["ttft_s"]) if v is not None and r["ttft_s"] else None}
                      for k, v in r.items() if k.endswith("_s") and k not in ("ttft_s", "server_ttft_s")}
                out.append(f"  {name:<{width}}  {r['trace_id']}  TTFT {fmt_s(r['ttft_s'])}  {_top_stage(st)}")
    return "\n".join(out)


def format_fleet(f: FleetAnalysis, verbose: bool = False) -> str:
    """:func:`format_fleet_table`, what a trace store answered (when it was one), then the hot
    replica's whole diagnosis."""
    out = [format_fleet_table(f), ""]
    if f.store is not None:
        out += [format_store(f.store), ""]
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


__all__ = ["fleet_document", "format_fleet", "format_fleet_table", "format_store"]
