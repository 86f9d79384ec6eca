"""The report as Markdown: the same sections and numbers as the HTML, tables instead of charts
(text sparklines for the timelines).

Every string is escaped with :func:`md_esc`: Markdown's punctuation gets a backslash, so a trace
string can neither break a table nor become markup; no HTML entities are written. Pure
functions, any thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.analysis.report import svg
from diag.analysis.report.cells import evidence_cells, fmt_confidence, fmt_explained, leading_line
from diag.analysis.report.gather import ReportData, request_label, stage_cols, top_stage
from diag.ground.units import Unit, fmt_s, fmt_value

#: Characters that Markdown (CommonMark, GFM tables) may read as markup or entities.
_MD_SPECIAL = "\\|`*_[]<>&#!"


def md_esc(text: Any) -> str:
    """A string for a Markdown table cell or line: specials backslash-escaped, on one line."""
    s = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(text))
    return " ".join(s.splitlines())


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(md_esc(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        out.append("| " + " | ".join(md_esc(c) for c in row) + " |")
    out.append("")
    return out


def _verdict(r: ReportData) -> list[str]:
    v = r.verdict
    if v is None:
        L = ["## No verdict: stage decomposition only", "",
             "The rule engine did not run, so no bottleneck is named; the numbers below are the measured decomposition.", ""]
        top = top_stage(r.analysis.decomposition)
        if top:
            L += [f"Largest stage: **{md_esc(top[0])}**, {md_esc(fmt_value(top[1], Unit.SHARE))} of TTFT.", ""]
        return L
    rule = f" · rule {md_esc(v.rule_id)}" if v.rule_id and v.rule_id != v.category else ""
    L = [f"## Verdict: {md_esc(v.category)}: {md_esc(v.title)}", "",
         f"Confidence **{md_esc(fmt_confidence(v.confidence))}** · explains **{md_esc(fmt_explained(v))}**{rule}", ""]
    lead = leading_line(r.diagnosis.leading if r.diagnosis is not None else None)
    if lead:
        L += [f"_{md_esc(lead)}_", ""]
    if v.evidence:
        cells = [evidence_cells(e) for e in v.evidence]
        L += _table(["evidence", "value", "threshold", "crossed", "what it means"],
                    [(c.name, c.value, c.threshold or "-", c.mark, c.meaning) for c in cells])
    if v.next_checks:
        L += ["What to check next:", ""] + [f"- {md_esc(c)}" for c in v.next_checks] + [""]
    if v.note:
        L += [f"_{md_esc(v.note)}_", ""]
    return L


def _findings(r: ReportData) -> list[str]:
    L = ["## Other findings", ""]
    if r.findings:
        L += _table(["category", "finding", "confidence", "time explained"],
                    [(f.category, f.title, fmt_confidence(f.confidence), fmt_explained(f)) for f in r.findings])
    else:
        L += ["No other rule fired." if r.verdict is not None else "No rules ran.", ""]
    if r.notes:
        L += [f"- note: {md_esc(n)}" for n in r.notes] + [""]
    if r.skipped:
        L += ["Skipped rules:", ""] + _table(["rule", "skipped because"], [(s.rule_id, s.reason) for s in r.skipped])
    if r.passed:
        L += ["Rules that ran and did not fire:", ""] + _table(["rule", "why not"], [(p.rule_id, p.reason) for p in r.passed])
    return L


def _stages(r: ReportData) -> list[str]:
    L = ["## Where TTFT goes", ""]
    dec = r.analysis.decomposition
    if dec["stages"]:
        L += _table(["stage", "count", "p50", "p95", "p99", "share of TTFT"],
                    [(st, row["count"], fmt_s(row["p50"]), fmt_s(row["p95"]), fmt_s(row["p99"]),
                      fmt_value(row.get("share_of_ttft"), Unit.SHARE)) for st, row in dec["stages"].items()])
        for label, vals in r.stage_rows.items():
            total = sum(vals.values()) or 1.0
            bar = "".join(st[0].upper() * max(0, round(40 * val / total)) for st, val in vals.items())
            L.append(f"- {md_esc(label)}: `{bar}` " + ", ".join(f"{md_esc(st)} {fmt_s(val)}" for st, val in vals.items()))
        L += ["", "(bar letters: first letter of each stage, 40 characters = the row's total)", ""]
    else:
        L += ["No stage spans: a client-only capture or an uninstrumented server.", ""]
    if not r.slowest.empty:
        cols = stage_cols(r.slowest)
        L += [f"Slowest {len(r.slowest)} requests:", ""]
        L += _table(["request", "TTFT", "prompt tokens"] + cols,
                    [[request_label(row), fmt_s(row["ttft_s"]), fmt_value(row.get("input_tokens"), Unit.COUNT)]
                     + [fmt_s(row[stages.stage_column(s)]) for s in cols]
                     for _, row in r.slowest.iterrows()])
    return L


def _load(r: ReportData) -> list[str]:
    L = ["## TTFT against prompt length and load", ""]
    ok = r.ok
    if "input_tokens" in ok and ok["input_tokens"].notna().any():
        d = ok.loc[ok["input_tokens"].notna()]
        q = pd.qcut(d["input_tokens"].rank(method="first"), min(6, len(d)), labels=False) if len(d) >= 2 else pd.Series(0, index=d.index)
        rows = []
        for _, g in d.groupby(q):
            rows.append((f"{fmt_value(g['input_tokens'].min(), Unit.COUNT)}-{fmt_value(g['input_tokens'].max(), Unit.COUNT)}",
                         len(g), fmt_s(g["ttft_s"].median()), fmt_s(g["ttft_s"].quantile(0.95))))
        L += _table(["prompt tokens", "requests", "TTFT p50", "TTFT p95"], rows)
        if r.prompt_fit:
            L += [f"Fit: {md_esc(r.prompt_fit[2])}; intercept {fmt_s(r.prompt_fit[1])}.", ""]
    if len(ok) and r.inflight.size == len(ok):
        g = pd.Series(ok["ttft_s"].to_numpy()).groupby(r.inflight)
        rows = [(int(k), int(n), fmt_s(m), fmt_s(p)) for (k, n), m, p in zip(g.size().items(), g.median(), g.quantile(0.95))][:40]
        L += _table(["in flight at arrival", "requests", "TTFT p50", "TTFT p95"], rows)
    if r.by_segment:
        L += _table(["segment", "requests", "TTFT p50", "TTFT p95", "ITL p50"],
                    [(s["segment"], s["requests"], fmt_s(s["ttft_p50_s"]), fmt_s(s["ttft_p95_s"]), fmt_s(s["itl_p50_s"]))
                     for s in r.by_segment])
    return L


def _timelines(r: ReportData) -> list[str]:
    L = ["## Device, KV cache and queue over time", ""]
    rows = []
    for key, unit in (("busy", Unit.SHARE), ("kv", Unit.SHARE), ("queue", Unit.COUNT)):
        for tl in r.timelines[key]:
            vals = tl.values[np.isfinite(tl.values)]
            if not vals.size:
                continue
            hi = 1.0 if key != "queue" else None
            rows.append((tl.label, svg.sparkline(vals.tolist(), 48, 0.0, hi),
                         fmt_value(float(vals.mean()), unit), fmt_value(float(vals.max()), unit)))
    if rows:
        L += _table(["series", "over time", "mean", "max"], rows)
    else:
        L += ["No engine steps or sampled series in the capture.", ""]
    return L


def _capture(r: ReportData) -> list[str]:
    c = r.context
    L = ["## The capture", ""]
    rows = [("captures", ", ".join(c["captures"])), ("sides", " + ".join(c["sides"]) or "-")]
    if c["services"]:
        rows.append(("services", ", ".join(c["services"])))
    if c["models"]:
        rows.append(("models", ", ".join(c["models"])))
    if c["faults"]:
        rows.append(("faults injected", ", ".join(f"{k}={v}" for k, v in c["faults"].items())))
    rows.append(("requests", f"{r.resources['requests']} in all, {r.resources['ok_requests']} counted, "
                             f"{r.resources['errors']} failed, {c['warmup']} warm-up"))
    L += _table(["", ""], rows)
    if c["errors"]:
        L += _table(["error", "requests"], list(c["errors"].items()))
    if c["warnings"]:
        L += ["Warnings:", ""] + [f"- {md_esc(w)}" for w in c["warnings"]] + [""]
    return L


def render_markdown(r: ReportData) -> str:
    """The same content as the HTML, as Markdown tables (sparklines instead of plots)."""
    L: list[str] = [f"# {md_esc(r.title)}", "", f"{r.resources['ok_requests']} requests · generated {md_esc(r.generated)}", ""]
    L += _verdict(r)
    pct = r.percentiles
    L += [f"TTFT p50 **{fmt_s(pct['ttft_s']['p50'])}** · p95 **{fmt_s(pct['ttft_s']['p95'])}** · "
          f"p99 **{fmt_s(pct['ttft_s']['p99'])}** · ITL p50 {fmt_s(pct['itl_s']['p50'])} · {r.resources['errors']} failed", ""]
    if r.slo:
        broken = [s for s in r.slo if not s.passed]
        L += [f"## SLOs: {len(broken)} of {len(r.slo)} broken" if broken else f"## SLOs: all {len(r.slo)} met", ""]
        L += _table(["SLO", "target", "measured", "result", "detail"],
                    [(s.key, fmt_s(s.target_s), fmt_s(s.actual_s), "pass" if s.passed else "FAIL", s.detail) for s in r.slo])
    L += _findings(r)
    L += ["## Latency percentiles", ""]
    L += _table(["metric", "count", "p50", "p90", "p95", "p99", "max", "mean"], r.latency_rows())
    L += _stages(r) + _load(r) + _timelines(r) + _capture(r)
    return "\n".join(L) + "\n"


__all__ = ["render_markdown", "md_esc"]
