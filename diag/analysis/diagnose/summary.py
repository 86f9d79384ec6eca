"""What ``ttft diagnose`` prints: the steps run and why, the start-up reported apart, the load
the server holds within the SLO (goodput), then the verdict as ``ttft analyze`` gives it. Pure
formatting over a :class:`~diag.analysis.diagnose.result.DiagnoseResult`.
"""

from __future__ import annotations

from typing import Any

from diag.analysis.diagnose.design import segment_of
from diag.analysis.diagnose.points import Point
from diag.analysis.diagnose.result import DiagnoseResult
from diag.ground.units import fmt_s


def _point_line(p: Point) -> str:
    err = f", {p.failed} failed ({', '.join(p.errors)})" if p.failed else ""
    if p.over_context:
        err += f", {p.over_context} refused as longer than the server's context (the experiment's limit, not failed)"
    slo = "" if p.slo_met is None else (", SLO met" if p.slo_met else ", SLO broken")
    return (f"{p.ok}/{p.requests} ok in {p.wall_s:.1f} s: TTFT p50 {fmt_s(p.ttft_p50_s)} p99 {fmt_s(p.ttft_p99_s)}, "
            f"ITL p50 {fmt_s(p.itl_p50_s)}, {p.rps:.2f} req/s{err}{slo}")


def format_result(res: DiagnoseResult, analysis_text: str | None = None) -> str:
    """The run as text: steps and why, stop, start-up, goodput, then ``analysis_text`` (the
    ``ttft analyze`` text of the final verdict)."""
    lines = [f"ttft diagnose {res.url} ({res.api or '?'}, model {res.model or '-'})"]
    for n in res.notes:
        lines.append(f"  note: {n}")
    lines.append("")
    lines.append("steps:")
    for r in res.records:
        lines.append(f"  {r.index}. {r.step.stage} {segment_of(r.step.kind, r.step.value)} (at {r.started_s:.1f} s) "
                     f"— why: {r.step.reason}")
        if r.point is not None:
            lines.append(f"     {_point_line(r.point)}")
        if r.verdict:
            lines.append(f"     running verdict: {r.verdict} ({r.confidence:.2f})")
    lines.append(f"stopped: {res.stopped}")
    su = res.startup
    if su.get("not_serving_s"):
        lines.append(f"start-up: the server was not serving for {fmt_s(su['not_serving_s'])} at first contact "
                     f"({', then '.join(su.get('not_serving') or [])}) — waited for (--wait-ready), reported apart")
    if su.get("startup_s") is not None:
        wait = su.get("waited_before_first_s", 0.0)
        lines.append(f"start-up ≈ {fmt_s(su['startup_s'])}: the first answered request was sent {fmt_s(wait)} after the "
                     f"first contact and took {fmt_s(su['first_ttft_s'])} to its first token, a warm one "
                     f"{fmt_s(su['warm_ttft_s'])} ({su['warm_from']}) — reported apart, not TTFT")
    g = res.goodput()
    if g.get("held"):
        if g.get("slo"):
            lines.append(f"goodput: {g['goodput_rps']:.2f} req/s within the SLO, at {g['held']} ({g['why']})")
        else:
            lines.append(f"load held: {g['rps']:.2f} req/s at {g['held']} ({g['why']})")
    else:
        lines.append(f"goodput: none ({g['why']})")
    lines.append(f"probing: {res.probing_s:.1f} s, {res.requests_sent} requests; time to verdict "
                 + (f"{res.time_to_verdict_s:.1f} s" if res.time_to_verdict_s is not None else "-"))
    cert = res.certainty()
    if cert is not None:
        lines.extend(cert.lines())
    if analysis_text:
        lines.append("")
        lines.append(analysis_text)
    lines.append("")
    lines.append(f"capture: {res.capture}  (ttft analyze {res.capture} · ttft report {res.capture} -o report.html · "
                 f"ttft view {res.capture})")
    return "\n".join(lines)


__all__ = ["format_result"]
