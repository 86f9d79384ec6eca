"""What a report shows, gathered once from an analysis: :func:`build_report` -> :class:`ReportData`.

The writers (:mod:`diag.analysis.report.html`, :mod:`~diag.analysis.report.markdown`, :mod:`~diag.analysis.report.jsondoc`)
only lay this out. The verdict and findings are the rule engine's own :class:`rules.Finding`
objects; durations are seconds (``_s``), shares 0..1, timestamps Unix ns (``_ns``). Worker code:
pandas/numpy, no shared state, any thread.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.analysis import Analysis
from diag.analysis.report.cells import fmt_confidence, leading_line
from diag.ground.units import as_float
from diag.analysis.report.summary import (
    SLOResult,
    evaluate_slo,
    inflight_at_arrival,
    latency_percentiles,
    ok_requests,
    resource_summary,
    time_origin_ns,
    warmup_rows,
)
from diag.analysis.report.timelines import Timeline, busy_timeline, kv_timeline, queue_timelines
from diag.ground.tables import describe
from diag.ground.units import Unit, fmt_s, fmt_value
from rules import Diagnosis, Finding, Passed, Skipped
from rules.features.populations import experiment_limit_rows


#: Rows of the slowest-requests table and chart.
SLOWEST_N = 10
#: Latency table rows: percentile key -> label.
LATENCY_LABELS: dict[str, str] = {
    "ttft_s": "TTFT", "server_ttft_s": "TTFT, server side", "client_ttft_s": "TTFT, client side",
    "itl_s": "ITL (every gap)", "tpot_s": "TPOT (per request)", "e2e_s": "E2E",
}


@dataclass
class ReportData:
    """Everything the writers lay out; built once by :func:`build_report`."""

    analysis: Analysis
    title: str
    generated: str
    diagnosis: Diagnosis | None
    verdict: Finding | None
    findings: list[Finding]  # the other findings, ranked
    skipped: list[Skipped]
    passed: list[Passed]
    notes: list[str]
    percentiles: dict[str, dict[str, Any]]
    slo: list[SLOResult]
    resources: dict[str, Any]
    stage_rows: dict[str, dict[str, float]]  # "p50"/"mean"/"slowest 5% (mean)" -> stage -> s
    slowest: pd.DataFrame
    ok: pd.DataFrame
    inflight: np.ndarray
    prompt_fit: tuple[float, float, str] | None  # slope s/token, intercept s, label
    timelines: dict[str, list[Timeline]]
    by_segment: list[dict[str, Any]]
    context: dict[str, Any]

    @property
    def verdict_line(self) -> str:
        """``verdict: queue - <title> (confidence 82%)``, or the largest stage when no rules ran."""
        v = self.verdict
        if v is None:
            top = top_stage(self.analysis.decomposition)
            hint = f"; largest stage: {top[0]} {fmt_value(top[1], Unit.SHARE)} of TTFT" if top else ""
            return f"no verdict (rule engine not run){hint}"
        line = f"verdict: {v.category} - {v.title} (confidence {fmt_confidence(v.confidence)})"
        lead = leading_line(self.diagnosis.leading if self.diagnosis is not None else None)
        return f"{line}; {lead}" if lead else line

    def feature(self, name: str) -> float | None:
        """A numeric feature of the diagnosis (None when absent, unavailable or not finite)."""
        if self.diagnosis is None:
            return None
        return as_float(self.diagnosis.features.value(name))

    def feature_table(self, name: str) -> dict[str, Any] | None:
        """A dict-valued feature (a small table), or None."""
        v = self.diagnosis.features.value(name) if self.diagnosis is not None else None
        return dict(v) if isinstance(v, Mapping) else None

    def feature_source(self, name: str) -> str | None:
        return self.diagnosis.features.get(name).source if self.diagnosis is not None else None

    def latency_rows(self) -> list[tuple[Any, ...]]:
        """metric, count, p50, p90, p95, p99, max, mean; a side's TTFT row only when both sides exist."""
        rows = []
        both = len(self.context["sides"]) == 2
        for key, label in LATENCY_LABELS.items():
            d = self.percentiles[key]
            if key in ("server_ttft_s", "client_ttft_s") and not both:
                continue
            if key != "ttft_s" and not d["count"]:
                continue
            rows.append((label, d["count"], *(fmt_s(d[k]) for k in ("p50", "p90", "p95", "p99", "max", "mean"))))
        return rows



def top_stage(dec: Mapping[str, Any]) -> tuple[str, float] | None:
    """The stage with the largest share of TTFT, and that share."""
    best = None
    for st, row in (dec.get("stages") or {}).items():
        share = row.get("share_of_ttft")
        if share is not None and (best is None or share > best[1]):
            best = (st, float(share))
    return best


def stage_cols(req: pd.DataFrame) -> list[str]:
    """The decomposition stages that have a value in some row of ``req``."""
    return [s for s in stages.DECOMPOSITION_STAGES
            if stages.stage_column(s) in req and req[stages.stage_column(s)].notna().any()]


def request_label(row: pd.Series) -> str:
    """A request's id, or the start of its trace id."""
    rid = row.get("request_id")
    if rid is not None and not (isinstance(rid, float) and math.isnan(rid)) and str(rid):
        return str(rid)
    return str(row.get("trace_id", ""))[:16]


def _prompt_fit(diagnosis: Diagnosis | None, ok: pd.DataFrame) -> tuple[float, float, str] | None:
    """The TTFT-vs-prompt-tokens line: the rules' feature when present, else a plain fit."""
    feats = diagnosis.features if diagnosis is not None else None
    slope_ms = as_float(feats.value("ttft_prompt_slope_ms_per_token")) if feats is not None else None
    icpt_ms = as_float(feats.value("ttft_prompt_intercept_ms")) if feats is not None else None
    r2 = as_float(feats.value("ttft_prompt_r2")) if feats is not None else None
    if slope_ms is not None and icpt_ms is not None:
        r2s = f", R\u00b2 {r2:.2f}" if r2 is not None else ""
        return slope_ms / 1e3, icpt_ms / 1e3, f"rules' fit: {slope_ms:.3g} ms/token{r2s}"
    if "input_tokens" not in ok:
        return None
    d = ok[["input_tokens", "ttft_s"]].apply(pd.to_numeric, errors="coerce").dropna()
    if len(d) < 3 or d["input_tokens"].nunique() < 2:
        return None
    x, y = d["input_tokens"].to_numpy(dtype="float64"), d["ttft_s"].to_numpy(dtype="float64")
    slope, icpt = np.polyfit(x, y, 1)
    pred = slope * x + icpt
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2v = 1 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    return float(slope), float(icpt), f"least-squares fit, all requests: {slope * 1e3:.3g} ms/token, R\u00b2 {r2v:.2f}"


def _stage_rows(ok: pd.DataFrame) -> dict[str, dict[str, float]]:
    cols = stage_cols(ok)
    if not cols or ok.empty:
        return {}
    rows: dict[str, dict[str, float]] = {"p50 of each stage": {}, "mean": {}}
    for st in cols:
        v = pd.to_numeric(ok[stages.stage_column(st)], errors="coerce").dropna()
        rows["p50 of each stage"][st] = float(v.median()) if len(v) else 0.0
        rows["mean"][st] = float(v.mean()) if len(v) else 0.0
    if len(ok) >= 5:
        cut = ok["ttft_s"].quantile(0.95)
        tail = ok.loc[ok["ttft_s"] >= cut]
        label = f"slowest 5% (n={len(tail)}, mean)"
        rows[label] = {st: float(pd.to_numeric(tail[stages.stage_column(st)], errors="coerce").fillna(0).mean()) for st in cols}
    return rows


def _context(analysis: Analysis) -> dict[str, Any]:
    t = analysis.tables
    req, spans = t.requests, t.spans
    services: list[str] = []
    for col in ("server_service", "client_service"):
        if col in req:
            services.extend(str(s) for s in req[col].dropna().unique())
    if t.steps is not None and not t.steps.empty:
        services.extend(str(s) for s in t.steps["service"].dropna().unique())
    models = []
    if spans is not None and stages.GEN_AI_REQUEST_MODEL in spans:
        models = [str(m) for m in spans[stages.GEN_AI_REQUEST_MODEL].dropna().unique()[:20]]
    engines = [str(e) for e in req["engine"].dropna().unique()] if "engine" in req else []
    errors: dict[str, int] = {}
    limit = experiment_limit_rows(req, t.meta)  # refused at the experiment's context limit: not failures
    if "error" in req:
        counted = ~limit & ~warmup_rows(req)  # the measured requests, as the rules count failures
        errors = {str(k): int(v) for k, v in req.loc[counted, "error"].dropna().astype(str).value_counts().head(20).items()}
    warmup = int(warmup_rows(req).sum())
    sides = []
    if "has_server" in req and bool(req["has_server"].any()):
        sides.append("server")
    if "has_client" in req and bool(req["has_client"].any()):
        sides.append("client")
    meta = t.meta or {}
    faults = meta.get("faults_injected") or {}
    cold = t.cold_starts if t.cold_starts is not None else pd.DataFrame()
    return {
        "captures": list(analysis.paths),
        "services": list(dict.fromkeys(services))[:20],
        "models": models,
        "engines": engines,
        "errors": errors,
        "over_context": int(limit.sum()),
        "warmup": warmup,
        "sides": sides,
        "faults": faults if isinstance(faults, Mapping) else {"faults": faults},
        "cold_starts": cold,
        "warnings": list(analysis.warnings)[:30],
        "lumped": dict(t.lumped_notes or {}),
        "clock_offsets": dict(t.clock_offsets or {}),
        "tool_version": meta.get("tool_version"),
        "ttft_side": "client" if "client" in sides else ("server" if sides else None),
    }


def _by_segment(ok: pd.DataFrame) -> list[dict[str, Any]]:
    if "segment" not in ok or ok["segment"].dropna().nunique() < 2:
        return []
    rows = []
    for seg, g in ok.groupby(ok["segment"].astype(str), sort=False):
        d = describe(g["ttft_s"])
        rows.append({"segment": seg, "requests": d["count"], "ttft_p50_s": d["p50"], "ttft_p95_s": d["p95"],
                     "itl_p50_s": as_float(pd.to_numeric(g.get("itl_p50_s"), errors="coerce").median()) if "itl_p50_s" in g else None,
                     "input_tokens_mean": as_float(pd.to_numeric(g.get("input_tokens"), errors="coerce").mean()) if "input_tokens" in g else None})
    return rows[:50]


def build_report(analysis: Analysis, slo: Mapping[str, float] | None = None, title: str | None = None) -> ReportData:
    """Gather the report's content from an :class:`diag.analysis.Analysis`."""
    tables = analysis.tables
    ok = ok_requests(tables.requests)
    d = analysis.diagnosis
    verdict = d.verdict if d is not None else None
    findings = [f for f in d.findings if not (f.rule_id == verdict.rule_id and f.title == verdict.title)] \
        if d is not None and verdict is not None else []
    notes = list(d.notes) if d is not None else []
    outliers = as_float(d.features.value("cold_start_outliers_n")) if d is not None else None
    if outliers:
        notes.append(f"{fmt_value(outliers, Unit.COUNT)} cold-start outlier request(s) (the first requests, far above the rest) are left out "
                     "of the rules' TTFT and the SLO checks; the latency table below counts them.")
    pct = latency_percentiles(tables)
    checks = d.features.value("slo_checks") if d is not None else None
    slo_results = evaluate_slo(pct, dict(slo), checks if isinstance(checks, Mapping) else None) if slo else []
    slowest = ok.nlargest(SLOWEST_N, "ttft_s") if not ok.empty else ok
    origin = time_origin_ns(tables)
    timelines: dict[str, list[Timeline]] = {"busy": [], "kv": [], "queue": []}
    if origin is not None:
        b = busy_timeline(tables, origin)
        timelines["busy"] = [b] if b is not None else []
        k = kv_timeline(tables, origin)
        timelines["kv"] = [k] if k is not None else []
        timelines["queue"] = queue_timelines(tables, origin)
    ctx = _context(analysis)
    ctx["origin_ns"] = origin
    names = ", ".join(Path(p).name or str(p) for p in analysis.paths)
    return ReportData(
        analysis=analysis,
        title=title or f"TTFT report: {names}",
        generated=_dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        diagnosis=d,
        verdict=verdict,
        findings=findings,
        skipped=list(d.skipped) if d is not None else [],
        passed=list(d.passed) if d is not None else [],
        notes=notes,
        percentiles=pct,
        slo=slo_results,
        resources=resource_summary(tables),
        stage_rows=_stage_rows(ok),
        slowest=slowest,
        ok=ok,
        inflight=inflight_at_arrival(ok),
        prompt_fit=_prompt_fit(d, ok),
        timelines=timelines,
        by_segment=_by_segment(ok),
        context=ctx,
    )


__all__ = ["ReportData", "build_report", "SLOWEST_N", "LATENCY_LABELS", "top_stage", "stage_cols",
           "request_label"]
