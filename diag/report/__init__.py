"""``ttft report``: one self-contained file a person takes in within a minute.

Front door: :func:`write_report` picks the format from the output suffix (``.html``, ``.md``,
``.json``). :func:`build_report` gathers everything the three writers show into a
:class:`ReportData`; the writers only lay it out.

Order of the HTML (and Markdown): the verdict with its evidence, confidence, time explained
and what to check next; the SLO table when SLOs were given; the other findings and the
skipped rules; latency percentiles; the stage waterfall (per-stage p50, mean and slowest-5%
rows, then the slowest requests); TTFT against prompt length and against in-flight
requests; the device-busy / KV-usage / queue timelines; what the capture holds.

Security: every string that came from a trace or a capture (request ids, services, models,
segment labels, error kinds, attribute values, evidence text, warnings, meta) is escaped
where it is written (:func:`diag.report.svg.esc` for HTML/SVG, :func:`md_esc` for Markdown). The
HTML carries a Content-Security-Policy that forbids scripts and any network load, and has
no external references: it opens offline.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag import stages
from diag.report import svg
from diag.capture import CaptureError
from diag.report.summary import (
    SLOResult,
    Timeline,
    busy_timeline,
    evaluate_slo,
    inflight_at_arrival,
    kv_timeline,
    latency_percentiles,
    ok_requests,
    queue_timelines,
    resource_summary,
    time_origin_ns,
)
from diag.tables import describe
from diag.units import json_safe
from diag.report.svg import esc, fmt_duration_s, fmt_num, fmt_pct

FORMATS: dict[str, str] = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown", ".json": "json"}
SLOWEST_N = 10
#: Stage colours, shared by every chart (and by the diff).
STAGE_COLORS: dict[str, str] = {
    stages.TOKENIZE: "#56B4E9",
    stages.QUEUE: "#E69F00",
    stages.PREFILL: "#0072B2",
    stages.COMM: "#CC79A7",
    stages.SAMPLE: "#009E73",
    stages.DETOKENIZE: "#F0E442",
    stages.LUMPED: "#999999",
    stages.NETWORK: "#D55E00",
    "unattributed": "#DDDDDD",
}
CATEGORY_COLORS: dict[str, str] = {
    "healthy": "#009E73",
    "loadgen": "#999999",
    "cold_start": "#56B4E9",
}


class ReportError(CaptureError):
    """A report that cannot be written (bad suffix, unwritable path): one line, exit code 2."""


@dataclass
class ReportResult:
    """Where the report went, in which format, the one-line verdict and the SLO results."""

    path: Path
    format: str
    verdict_line: str
    slo: list[SLOResult] = field(default_factory=list)

    @property
    def slo_ok(self) -> bool:
        """True when every SLO passed (or none was given)."""
        return all(r.passed for r in self.slo)


def report_format(path: str | os.PathLike[str]) -> str:
    """The format for an output path, from its suffix; ReportError for anything else."""
    suffix = Path(path).suffix.lower()
    fmt = FORMATS.get(suffix)
    if fmt is None:
        raise ReportError(f"{path}: unknown report format {suffix or '(no suffix)'!r}; use .html, .md or .json")
    return fmt


# --- gathering ------------------------------------------------------------------------------


def rule_field(obj: Any, name: str, default: Any = None) -> Any:
    """An attribute of a rules object, or a key of its dict form."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


@dataclass
class FindingView:
    """A rules Finding, flattened for display (units: seconds, percent of TTFT p95)."""

    rule_id: str
    category: str
    title: str
    confidence: float | None
    explained_s: float | None
    explained_pct: float | None
    evidence: list[dict[str, Any]]
    next_checks: list[str]
    note: str

    @classmethod
    def of(cls, f: Any) -> FindingView:
        ev = []
        for e in rule_field(f, "evidence", None) or []:
            ev.append({k: rule_field(e, k) for k in ("name", "value", "threshold", "unit", "meaning")})
        return cls(
            rule_id=str(rule_field(f, "rule_id", "") or ""),
            category=str(rule_field(f, "category", "") or ""),
            title=str(rule_field(f, "title", "") or ""),
            confidence=_float(rule_field(f, "confidence")),
            explained_s=_float(rule_field(f, "explained_s")),
            explained_pct=_float(rule_field(f, "explained_pct")),
            evidence=ev,
            next_checks=[str(x) for x in (rule_field(f, "next_checks", None) or [])],
            note=str(rule_field(f, "note", "") or ""),
        )


def _float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


@dataclass
class ReportData:
    """Everything the writers lay out; built once by :func:`build_report`."""

    analysis: Any
    title: str
    generated: str
    verdict: FindingView | None
    findings: list[FindingView]
    skipped: list[tuple[str, str]]
    passed: list[tuple[str, str]]
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
        v = self.verdict
        if v is None:
            top = _top_stage(self.analysis.decomposition)
            hint = f"; largest stage: {top[0]} {fmt_pct(top[1])} of TTFT" if top else ""
            return f"no verdict (rule engine not run){hint}"
        conf = f" (confidence {v.confidence:.0%})" if v.confidence is not None else ""
        return f"verdict: {v.category} - {v.title}{conf}"


def _top_stage(dec: Mapping[str, Any]) -> tuple[str, float] | None:
    best = None
    for st, row in (dec.get("stages") or {}).items():
        share = row.get("share_of_ttft")
        if share is not None and (best is None or share > best[1]):
            best = (st, float(share))
    return best


def _stage_cols(req: pd.DataFrame) -> list[str]:
    return [s for s in stages.DECOMPOSITION_STAGES if stages.stage_column(s) in req and req[stages.stage_column(s)].notna().any()]


def _feature(diagnosis: Any, *names: str) -> float | None:
    """The value of the first available feature among ``names`` (None when absent)."""
    feats = rule_field(diagnosis, "features")
    if feats is None:
        return None
    for name in names:
        try:
            f = feats.get(name) if hasattr(feats, "get") else None
        except Exception:
            f = None
        if f is None:
            continue
        if isinstance(f, Mapping):
            avail, value = f.get("available", True), f.get("value")
        elif hasattr(f, "value"):
            avail, value = getattr(f, "available", True), f.value
        else:
            avail, value = True, f
        v = _float(value)
        if avail and v is not None:
            return v
    return None


def _feature_table(diagnosis: Any, name: str) -> dict[str, Any] | None:
    """A dict-valued feature (a small table), or None when absent or unavailable."""
    feats = rule_field(diagnosis, "features")
    if feats is None or not hasattr(feats, "get"):
        return None
    try:
        f = feats.get(name)
    except Exception:
        return None
    value = f.get("value") if isinstance(f, Mapping) else getattr(f, "value", None)
    avail = f.get("available", True) if isinstance(f, Mapping) else getattr(f, "available", True)
    return dict(value) if avail and isinstance(value, Mapping) else None


def _feature_source(diagnosis: Any, name: str) -> str | None:
    feats = rule_field(diagnosis, "features")
    try:
        f = feats.get(name) if feats is not None and hasattr(feats, "get") else None
    except Exception:
        return None
    return rule_field(f, "source") if f is not None else None


def _prompt_fit(diagnosis: Any, ok: pd.DataFrame) -> tuple[float, float, str] | None:
    """The TTFT-vs-prompt-tokens line: the rules' feature when present, else a plain fit."""
    slope_ms = _feature(diagnosis, "ttft_prompt_slope_ms_per_token", "prompt_slope_ms_per_token", "ttft_vs_prompt_slope_ms_per_token")
    icpt_ms = _feature(diagnosis, "ttft_prompt_intercept_ms", "prompt_intercept_ms", "ttft_vs_prompt_intercept_ms")
    r2 = _feature(diagnosis, "ttft_prompt_r2", "prompt_r2", "ttft_vs_prompt_r2")
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
    cols = _stage_cols(ok)
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


def _context(analysis: Any, ok: pd.DataFrame) -> dict[str, Any]:
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
    if "error" in req:
        errors = {str(k): int(v) for k, v in req["error"].dropna().astype(str).value_counts().head(20).items()}
    warmup = int(req["warmup"].fillna(False).astype(bool).sum()) if "warmup" in req else 0
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
                     "itl_p50_s": _float(pd.to_numeric(g.get("itl_p50_s"), errors="coerce").median()) if "itl_p50_s" in g else None,
                     "input_tokens_mean": _float(pd.to_numeric(g.get("input_tokens"), errors="coerce").mean()) if "input_tokens" in g else None})
    return rows[:50]


def build_report(analysis: Any, slo: Mapping[str, float] | None = None, title: str | None = None) -> ReportData:
    """Gather the report's content from an :class:`diag.analysis.Analysis`."""
    tables = analysis.tables
    ok = ok_requests(tables.requests)
    diag_ = analysis.diagnosis
    verdict = FindingView.of(rule_field(diag_, "verdict")) if diag_ is not None and rule_field(diag_, "verdict") is not None else None
    findings = [FindingView.of(f) for f in (rule_field(diag_, "findings", None) or [])] if diag_ is not None else []
    if verdict is not None:
        findings = [f for f in findings if not (f.rule_id == verdict.rule_id and f.title == verdict.title)]
    skipped = []
    for s in (rule_field(diag_, "skipped", None) or []) if diag_ is not None else []:
        skipped.append((str(rule_field(s, "rule_id", "") or ""), str(rule_field(s, "reason", "") or "")))
    passed = [(str(rule_field(p, "rule_id", "") or ""), str(rule_field(p, "reason", "") or ""))
              for p in ((rule_field(diag_, "passed", None) or []) if diag_ is not None else [])]
    notes = [str(n) for n in ((rule_field(diag_, "notes", None) or []) if diag_ is not None else [])]
    outliers = _feature(diag_, "cold_start_outliers_n")
    if outliers:
        notes.append(f"{outliers:g} cold-start outlier request(s) (the first requests, far above the rest) are left out "
                     "of the rules' TTFT and the SLO checks; the latency table below counts them.")
    pct = latency_percentiles(tables)
    checks = _feature_table(diag_, "slo_checks")
    slo_results = evaluate_slo(pct, dict(slo), checks) if slo else []
    slowest = ok.nlargest(SLOWEST_N, "ttft_s") if not ok.empty else ok
    origin = time_origin_ns(tables)
    timelines: dict[str, list[Timeline]] = {"busy": [], "kv": [], "queue": []}
    if origin is not None:
        b = busy_timeline(tables, origin)
        timelines["busy"] = [b] if b is not None else []
        k = kv_timeline(tables, origin)
        timelines["kv"] = [k] if k is not None else []
        timelines["queue"] = queue_timelines(tables, origin)
    ctx = _context(analysis, ok)
    ctx["origin_ns"] = origin
    names = ", ".join(Path(p).name or str(p) for p in analysis.paths)
    return ReportData(
        analysis=analysis,
        title=title or f"TTFT report: {names}",
        generated=_dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        verdict=verdict,
        findings=findings,
        skipped=skipped,
        passed=passed,
        notes=notes,
        percentiles=pct,
        slo=slo_results,
        resources=resource_summary(tables),
        stage_rows=_stage_rows(ok),
        slowest=slowest,
        ok=ok,
        inflight=inflight_at_arrival(ok),
        prompt_fit=_prompt_fit(diag_, ok),
        timelines=timelines,
        by_segment=_by_segment(ok),
        context=ctx,
    )


# --- formatting helpers ---------------------------------------------------------------------

_RATIO_UNITS = {"ratio", "fraction", "frac", "share", "0..1"}
_PCT_UNITS = {"%", "pct", "percent"}


def fmt_value(v: Any, unit: str | None = None) -> str:
    """An evidence value with its unit: seconds as durations, ratios as percentages."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    u = (unit or "").strip()
    if isinstance(v, (int, float, np.integer, np.floating)):
        f = float(v)
        if not math.isfinite(f):
            return "-"
        lu = u.lower()
        if lu in ("s", "sec", "seconds"):
            return fmt_duration_s(f)
        if lu == "ms":
            return fmt_duration_s(f / 1e3)
        if lu in _RATIO_UNITS:
            return fmt_pct(f)
        if lu in _PCT_UNITS:
            return f"{f:.3g}%"
        if lu == "x":
            return f"{f:.3g}x"
        num = f"{f:.3g}" if f != int(f) or abs(f) >= 1e6 else f"{int(f)}"
        return f"{num} {u}".strip()
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt_value(x, unit) for x in v)
    return f"{v} {u}".strip() if u and not str(v).endswith(u) else str(v)


def fmt_threshold(t: Any, unit: str | None = None) -> str:
    """A threshold: numbers formatted like values, strings (e.g. ``">= 0.5"``) as given."""
    if t is None or t == "":
        return "-"
    if isinstance(t, str):
        return t
    return fmt_value(t, unit)


def fmt_explained(f: FindingView) -> str:
    """``12.3ms (45% of TTFT p95)``."""
    parts = []
    if f.explained_s is not None:
        parts.append(fmt_duration_s(f.explained_s))
    if f.explained_pct is not None:  # percent of TTFT p95 (0..100), per the rules' contract
        pct = f.explained_pct
        parts.append(f"({pct:.3g}% of TTFT p95)" if parts else f"{pct:.3g}% of TTFT p95")
    return " ".join(parts) or "-"


def _d(v: Any) -> str:
    return fmt_duration_s(v) if v is not None else "-"


class Raw(str):
    """Markup that is already safe (built here from escaped parts)."""


def _cell(x: Any) -> str:
    return str(x) if isinstance(x, Raw) else esc(x)


def _table(headers: Sequence[str] | None, rows: Iterable[Sequence[Any]], cls: str = "",
           num: Iterable[int] = ()) -> str:
    """An HTML table; every cell is escaped unless it is :class:`Raw`. Columns in ``num`` align
    right (numbers); ``headers=None`` gives a key-value table without a header row."""
    nums = set(num)
    out = [f'<table class="{esc(cls)}">']
    if headers is not None:
        out.append("<thead><tr>")
        out += [f'<th{" class=num" if i in nums else ""}>{esc(h)}</th>' for i, h in enumerate(headers)]
        out.append("</tr></thead>")
    out.append("<tbody>")
    for row in rows:
        out.append("<tr>" + "".join(f'<td{" class=num" if i in nums else ""}>{_cell(c)}</td>' for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _request_label(row: pd.Series) -> str:
    rid = row.get("request_id")
    if rid is not None and not (isinstance(rid, float) and math.isnan(rid)) and str(rid):
        return str(rid)
    return str(row.get("trace_id", ""))[:16]


# --- HTML -----------------------------------------------------------------------------------

_CSS = """
:root{--fg:#1d1d1f;--muted:#5f6368;--line:#e3e3e3;--bg:#fafafa;--ok:#0a7d3c;--bad:#b3261e}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif}
main{max-width:1080px;margin:0 auto;padding:20px 24px 48px}
h1{font-size:20px;margin:0 0 2px}
h2{font-size:16px;margin:28px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:16px 0 6px}
.sub{color:var(--muted);margin:0 0 16px;overflow-wrap:anywhere}
.card{background:#fff;border:1px solid var(--line);border-left:6px solid #0072B2;border-radius:6px;padding:14px 18px;margin:12px 0}
.card h2{border:0;margin:0 0 8px;padding:0}
.verdict h2{margin:0 0 4px;font-size:19px}
table.ctx td:first-child{width:220px;color:var(--muted)}
.verdict .cat{display:inline-block;font:600 12px/1 ui-monospace,SFMono-Regular,Menlo,monospace;background:#eef3f8;color:#0b4f7d;padding:4px 7px;border-radius:4px;margin-right:8px;vertical-align:3px}
.kv{display:flex;flex-wrap:wrap;gap:8px 26px;margin:8px 0 10px}
.kv div{min-width:90px}.kv b{display:block;font-size:18px}.kv span{color:var(--muted);font-size:12px}
.bar{display:inline-block;width:90px;height:8px;background:#e8e8e8;border-radius:4px;vertical-align:middle;margin-left:6px}
.bar i{display:block;height:8px;border-radius:4px;background:#0072B2}
table{border-collapse:collapse;width:100%;background:#fff;margin:6px 0 10px;font-size:13px}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f3f4f6;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.pass{color:var(--ok);font-weight:600}.fail{color:var(--bad);font-weight:600}
.slo-bad{border-left-color:var(--bad)}.slo-ok{border-left-color:var(--ok)}
ul.checks{margin:4px 0 0;padding-left:20px}
.note{color:var(--muted);font-size:13px}
details{background:#fff;border:1px solid var(--line);border-radius:6px;padding:6px 12px;margin:6px 0}
summary{cursor:pointer;font-weight:600}
.chart{background:#fff;border:1px solid var(--line);border-radius:6px;padding:6px;margin:8px 0}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:10px}
@media (max-width:900px){.grid{grid-template-columns:1fr}}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#f1f1f1;padding:1px 4px;border-radius:3px}
footer{color:var(--muted);font-size:12px;margin-top:32px}
"""


def _conf_bar(c: float | None) -> str:
    if c is None:
        return "-"
    w = max(0.0, min(1.0, c)) * 100
    return f'{c:.0%}<span class="bar"><i style="width:{w:.0f}%"></i></span>'


def _evidence_table(f: FindingView) -> str:
    if not f.evidence:
        return '<p class="note">No evidence rows.</p>'
    rows = [
        (e.get("name") or "", fmt_value(e.get("value"), e.get("unit")), fmt_threshold(e.get("threshold"), e.get("unit")), e.get("meaning") or "")
        for e in f.evidence
    ]
    return _table(["evidence", "value", "threshold", "what it means"], rows, "evidence", num=(1, 2))


def _checks(f: FindingView) -> str:
    if not f.next_checks:
        return ""
    return "<h3>What to check next</h3><ul class=\"checks\">" + "".join(f"<li>{esc(c)}</li>" for c in f.next_checks) + "</ul>"


def _html_verdict(r: ReportData) -> str:
    pct = r.percentiles["ttft_s"]
    v = r.verdict
    glance = [
        ("TTFT p50", _d(pct["p50"])), ("TTFT p95", _d(pct["p95"])), ("TTFT p99", _d(pct["p99"])),
        ("ITL p50", _d(r.percentiles["itl_s"]["p50"])), ("requests", f"{r.resources['ok_requests']}"),
    ]
    if r.resources.get("errors"):
        glance.append(("errors", str(r.resources["errors"])))
    glance_html = '<div class="kv">' + "".join(f"<div><b>{esc(val)}</b><span>{esc(k)}</span></div>" for k, val in glance) + "</div>"
    if v is None:
        top = _top_stage(r.analysis.decomposition)
        hint = (f"<p>Largest stage: <b>{esc(top[0])}</b>, {esc(fmt_pct(top[1]))} of TTFT "
                f"({esc(stages.STAGE_DESCRIPTIONS.get(top[0], ''))}).</p>") if top else ""
        return (f'<section id="verdict" class="card verdict"><h2>No verdict: stage decomposition only</h2>'
                f'<p class="note">The rule engine did not run (not installed in this build), so no bottleneck is named; '
                f"the numbers below are the measured decomposition.</p>{glance_html}{hint}</section>")
    color = CATEGORY_COLORS.get(v.category, "#0072B2")
    head = (f'<section id="verdict" class="card verdict" style="border-left-color:{esc(color)}">'
            f'<h2><span class="cat">{esc(v.category)}</span>{esc(v.title)}</h2>')
    facts = (f'<div class="kv"><div><b>{_conf_bar(v.confidence)}</b><span>confidence</span></div>'
             f"<div><b>{esc(fmt_explained(v))}</b><span>time explained</span></div>"
             + (f"<div><b>{esc(v.rule_id)}</b><span>rule</span></div>" if v.rule_id and v.rule_id != v.category else "")
             + "</div>")
    note = f'<p class="note">{esc(v.note)}</p>' if v.note else ""
    return head + facts + _evidence_table(v) + _checks(v) + note + "<h3>At a glance</h3>" + glance_html + "</section>"


def _html_slo(r: ReportData) -> str:
    if not r.slo:
        return ""
    broken = [s for s in r.slo if not s.passed]
    cls = "slo-bad" if broken else "slo-ok"
    head = (f"{len(broken)} of {len(r.slo)} SLOs broken" if broken else f"all {len(r.slo)} SLOs met")
    rows = [(s.key, fmt_duration_s(s.target_s), _d(s.actual_s),
             Raw('<span class="pass">pass</span>' if s.passed else '<span class="fail">FAIL</span>'), s.detail) for s in r.slo]
    return (f'<section id="slo" class="card {cls}"><h2>SLOs: {esc(head)}</h2>'
            + _table(["SLO", "target", "measured", "result", "detail"], rows, "slo", num=(1, 2)) + "</section>")


def _html_findings(r: ReportData) -> str:
    parts = ['<section id="findings"><h2>Other findings</h2>']
    if r.verdict is None and not r.findings:
        parts.append('<p class="note">No rules ran.</p>')
    elif not r.findings:
        parts.append('<p class="note">No other rule fired.</p>')
    else:
        rows = [(f.category, f.title, Raw(_conf_bar(f.confidence)), fmt_explained(f)) for f in r.findings]
        parts.append(_table(["category", "finding", "confidence", "time explained"], rows, "findings", num=(2, 3)))
        for f in r.findings:
            parts.append(f"<details><summary>{esc(f.category)}: {esc(f.title)}</summary>{_evidence_table(f)}{_checks(f)}"
                         + (f'<p class="note">{esc(f.note)}</p>' if f.note else "") + "</details>")
    if r.notes:
        parts.append("<ul class=\"checks note\">" + "".join(f"<li>{esc(n)}</li>" for n in r.notes) + "</ul>")
    if r.skipped:
        parts.append(f"<details><summary>Skipped rules ({len(r.skipped)}): not enough data to decide</summary>")
        parts.append(_table(["rule", "skipped because"], r.skipped, "skipped"))
        parts.append("</details>")
    if r.passed:
        parts.append(f"<details><summary>Rules that ran and did not fire ({len(r.passed)})</summary>")
        parts.append(_table(["rule", "why not"], r.passed, "passed"))
        parts.append("</details>")
    parts.append("</section>")
    return "".join(parts)


_LATENCY_LABELS: dict[str, str] = {
    "ttft_s": "TTFT", "server_ttft_s": "TTFT, server side", "client_ttft_s": "TTFT, client side",
    "itl_s": "ITL (every gap)", "tpot_s": "TPOT (per request)", "e2e_s": "E2E",
}


def _latency_rows(r: ReportData) -> list[tuple[Any, ...]]:
    """metric, count, p50, p90, p95, p99, max, mean; a side's TTFT row only when both sides exist."""
    rows = []
    both = len(r.context["sides"]) == 2
    for key, label in _LATENCY_LABELS.items():
        d = r.percentiles[key]
        if key in ("server_ttft_s", "client_ttft_s") and not both:
            continue
        if key not in ("ttft_s",) and not d["count"]:
            continue
        rows.append((label, d["count"], _d(d["p50"]), _d(d["p90"]), _d(d["p95"]), _d(d["p99"]), _d(d["max"]), _d(d["mean"])))
    return rows


def _html_latency(r: ReportData) -> str:
    rows = _latency_rows(r)
    side = r.context.get("ttft_side")
    note = (f'<p class="note">TTFT is measured on the {esc(side)} side'
            + (" (client TTFT includes the network)" if side == "client" else "")
            + "; warm-up and failed requests are left out.</p>") if side else ""
    res = r.resources
    thr = []
    if res.get("requests_per_s") is not None:
        thr.append(f"{res['requests_per_s']:.3g} req/s")
    if res.get("output_tokens_per_s") is not None:
        thr.append(f"{res['output_tokens_per_s']:.4g} output tokens/s")
    if res.get("input_tokens_per_s") is not None:
        thr.append(f"{res['input_tokens_per_s']:.4g} input tokens/s")
    thr_html = f'<p class="note">Throughput over {esc(_d(res.get("window_s")))}: {esc(", ".join(thr))}.</p>' if thr else ""
    hist = _ttft_histogram(r)
    return ('<section id="latency"><h2>Latency percentiles</h2>'
            + _table(["metric", "count", "p50", "p90", "p95", "p99", "max", "mean"], rows, "pcts", num=range(1, 8)) + note + thr_html
            + (f'<div class="chart">{hist}</div>' if hist else "") + "</section>")


def _ttft_histogram(r: ReportData) -> str:
    v = pd.to_numeric(r.ok["ttft_s"], errors="coerce").dropna().to_numpy() if "ttft_s" in r.ok else np.empty(0)
    if v.size < 5:
        return ""
    hi = float(np.percentile(v, 99.5))
    lo = float(v.min())
    if hi <= lo:
        return ""
    edges = np.linspace(lo, hi, 25)
    counts, _ = np.histogram(np.clip(v, lo, hi), bins=edges)
    labels = [fmt_duration_s(e) for e in edges[:-1]]
    return svg.bar_chart(labels, counts.tolist(), title="TTFT distribution (requests per bin; bin start shown)",
                         value_fmt=fmt_num, height=200, width=1000, x_label="TTFT")


def _html_stages(r: ReportData) -> str:
    parts = ['<section id="stages"><h2>Where TTFT goes: stage waterfall</h2>']
    dec = r.analysis.decomposition
    if not r.stage_rows:
        parts.append('<p class="note">No stage spans: a client-only capture or an uninstrumented server. '
                     "Only end-to-end TTFT is known; see the prompt-length and concurrency sections for the black-box evidence.</p>")
    else:
        rows = [(label, list(vals.items())) for label, vals in r.stage_rows.items()]
        parts.append('<div class="chart">' + svg.stacked_hbar(
            rows, title="Per-stage time: median, mean, and the slowest 5% of requests", colors=STAGE_COLORS,
            value_fmt=fmt_duration_s, label_w=170, width=1000, x_label="seconds (stages in request order; comm is inside prefill)") + "</div>")
        parts.append(f'<p class="note">Stage medians need not add up to the TTFT median '
                     f'({esc(_d(dec["ttft_s"]["p50"]))}); the mean row does when every stage is instrumented.</p>')
        trows = []
        for st, row in dec["stages"].items():
            share = row.get("share_of_ttft")
            trows.append((Raw(f'<span style="color:{STAGE_COLORS.get(st, "#333")}">&#9632;</span> {esc(st)}'), row["count"],
                          _d(row["p50"]), _d(row["p95"]), _d(row["p99"]), fmt_pct(share) if share is not None else "-",
                          stages.STAGE_DESCRIPTIONS.get(st, "")))
        parts.append(_table(["stage", "count", "p50", "p95", "p99", "share of TTFT", "what it is"], trows, "stages", num=range(1, 6)))
    if not r.slowest.empty:
        cols = _stage_cols(r.slowest)
        rows2 = []
        for _, row in r.slowest.iterrows():
            segs = [(st, float(row[stages.stage_column(st)])) for st in cols if pd.notna(row[stages.stage_column(st)])]
            rest = float(row["ttft_s"]) - sum(v for _, v in segs)
            if rest > max(1e-4, 0.01 * float(row["ttft_s"])):
                segs.append(("unattributed", rest))
            rows2.append((_request_label(row), segs))
        parts.append(f"<h3>The {len(rows2)} slowest requests</h3>")
        parts.append('<div class="chart">' + svg.stacked_hbar(
            rows2, title="Slowest requests by TTFT, split by stage", colors=STAGE_COLORS, value_fmt=fmt_duration_s,
            label_w=170, width=1000, x_label="seconds") + "</div>")
        detail = []
        for _, row in r.slowest.iterrows():
            detail.append((_request_label(row), _d(row["ttft_s"]), fmt_value(row.get("input_tokens")),
                           fmt_value(row.get("output_tokens")), row.get("segment") if pd.notna(row.get("segment")) else "",
                           row.get("server_service") if pd.notna(row.get("server_service")) else (row.get("client_service") or "")))
        parts.append(_table(["request", "TTFT", "prompt tokens", "output tokens", "segment", "service"], detail, "slowest", num=(1, 2, 3)))
    parts.append("</section>")
    return "".join(parts)


def _tips(ok: pd.DataFrame, extra: str, extra_vals: Sequence[Any]) -> list[str]:
    labels = [_request_label(row) for _, row in ok.iterrows()] if len(ok) <= 3000 else None
    if labels is None:
        return []
    return [f"{lab}: TTFT {fmt_duration_s(t)}, {extra} {fmt_value(x)}" for lab, t, x in zip(labels, ok["ttft_s"], extra_vals)]


def _html_load(r: ReportData) -> str:
    ok = r.ok
    parts = ['<section id="load"><h2>TTFT against prompt length and load</h2><div class="grid">']
    if "input_tokens" in ok and ok["input_tokens"].notna().any():
        d = ok.loc[ok["input_tokens"].notna()]
        tips = _tips(d, "prompt tokens", d["input_tokens"].tolist())
        fit = svg.Fit(r.prompt_fit[0], r.prompt_fit[1], r.prompt_fit[2]) if r.prompt_fit else None
        chart = svg.scatter_chart([svg.Series("", d["input_tokens"].tolist(), d["ttft_s"].tolist(), "#0072B2", tips or None)],
                                  title="TTFT vs prompt tokens", x_label="prompt tokens", y_label="TTFT",
                                  y_fmt=fmt_duration_s, fit=fit, width=520, height=280)
        parts.append(f'<div class="chart">{chart}</div>')
    else:
        parts.append('<p class="note">No prompt token counts in the capture.</p>')
    if len(ok) and r.inflight.size == len(ok):
        infl = r.inflight
        tips = _tips(ok, "in flight", infl.tolist())
        curve = _feature_table(r.analysis.diagnosis, "ttft_by_inflight")
        if curve and _feature_source(r.analysis.diagnosis, "ttft_by_inflight") in (None, "measured"):
            pts = sorted((float(k), float(v)) for k, v in curve.items() if _float(k) is not None and _float(v) is not None)
            lines = [svg.Series("rules' median TTFT per level", [p[0] for p in pts], [p[1] for p in pts], "#D55E00")]
        else:
            med = pd.Series(ok["ttft_s"].to_numpy()).groupby(infl).median()
            lines = [svg.Series("median per level", med.index.tolist(), med.tolist(), "#D55E00")] if len(med) >= 2 else []
        chart = svg.scatter_chart([svg.Series("", infl.tolist(), ok["ttft_s"].tolist(), "#009E73", tips or None)],
                                  title="TTFT vs requests in flight at arrival", x_label="requests in flight (incl. itself)",
                                  y_label="TTFT", y_fmt=fmt_duration_s, lines=lines, width=520, height=280)
        parts.append(f'<div class="chart">{chart}</div>')
    parts.append("</div>")
    notes = []
    if r.prompt_fit:
        notes.append(f"Dashed line: {r.prompt_fit[2]}; intercept {fmt_duration_s(r.prompt_fit[1])}.")
    knee = _feature(r.analysis.diagnosis, "concurrency_knee")
    if knee is not None:
        src = _feature_source(r.analysis.diagnosis, "concurrency_knee")
        where = f"the sweep's concurrency {knee:g}" if src == "segments" else f"{knee:g} requests in flight"
        notes.append(f"The rules place the concurrency knee (where TTFT starts to climb) at {where}.")
    if notes:
        parts.append(f'<p class="note">{esc(" ".join(notes))}</p>')
    if r.by_segment:
        rows = [(s["segment"], s["requests"], _d(s["ttft_p50_s"]), _d(s["ttft_p95_s"]), _d(s["itl_p50_s"]),
                 fmt_value(s["input_tokens_mean"])) for s in r.by_segment]
        parts.append("<h3>By segment (sweep point)</h3>")
        parts.append(_table(["segment", "requests", "TTFT p50", "TTFT p95", "ITL p50", "mean prompt tokens"], rows, "segments", num=range(1, 6)))
    parts.append("</section>")
    return "".join(parts)


def _html_timelines(r: ReportData) -> str:
    parts = ['<section id="timelines"><h2>Device, KV cache and queue over time</h2>']
    origin = r.context.get("origin_ns")
    charts = []
    ok = r.ok
    tl = r.timelines
    # one x axis for every timeline so that a spike lines up across charts
    t_max = max([float(np.nanmax(x.t_s)) for k in tl for x in tl[k] if x.t_s.size] + [0.0])
    t_arr = np.empty(0)
    if origin is not None and len(ok):
        t_arr = (pd.to_numeric(ok["start_ns"], errors="coerce").to_numpy(dtype="float64") - origin) / 1e9
        if np.isfinite(t_arr).any():
            t_max = max(t_max, float(np.nanmax(t_arr)))
    xr = (0.0, t_max if t_max > 0 else 1.0)
    xl = "seconds since capture start"
    if t_arr.size:
        charts.append(svg.scatter_chart([svg.Series("", t_arr.tolist(), ok["ttft_s"].tolist(), "#0072B2")],
                                        title="TTFT by arrival time", x_label=xl, y_label="TTFT", y_fmt=fmt_duration_s,
                                        height=200, width=1000, x_range=xr))
    if tl["busy"]:
        b = tl["busy"][0]
        charts.append(svg.line_chart([svg.Series(b.label, b.t_s.tolist(), b.values.tolist(), "#0072B2")],
                                     title="Device busy", x_label=xl, y_fmt=fmt_pct, y_min=0.0, y_max=1.0,
                                     height=190, width=1000, x_range=xr))
    if tl["kv"]:
        k = tl["kv"][0]
        charts.append(svg.line_chart([svg.Series(k.label, k.t_s.tolist(), k.values.tolist(), "#CC79A7")],
                                     title="KV-cache usage", x_label=xl, y_fmt=fmt_pct, y_min=0.0, y_max=1.0,
                                     height=190, width=1000, x_range=xr))
    if tl["queue"]:
        colors = ["#E69F00", "#009E73"]
        charts.append(svg.line_chart(
            [svg.Series(q.label, q.t_s.tolist(), q.values.tolist(), colors[i % 2]) for i, q in enumerate(tl["queue"])],
            title="Sequences waiting and running", x_label=xl, y_min=0.0, height=190, width=1000, x_range=xr))
    if not charts:
        parts.append('<p class="note">No requests, engine steps or sampled series with timestamps.</p>')
    for c in charts:
        parts.append(f'<div class="chart">{c}</div>')
    missing = [n for n, key in (("device busy", "busy"), ("KV-cache usage", "kv"), ("queue depth", "queue")) if not tl[key]]
    if missing and charts:
        parts.append(f'<p class="note">Not in this capture: {esc(", ".join(missing))} '
                     "(needs engine-step spans, the engine's /metrics or NVML samples).</p>")
    res = r.resources
    facts = [("device busy", fmt_pct(res["device_busy_frac"]) if res.get("device_busy_frac") is not None else "-",
              res.get("device_busy_source") or ""),
             ("KV usage p95 / max", f"{fmt_pct(res['kv_usage_p95']) if res.get('kv_usage_p95') is not None else '-'} / "
              f"{fmt_pct(res['kv_usage_max']) if res.get('kv_usage_max') is not None else '-'}", ""),
             ("waiting sequences mean / max", f"{fmt_value(res.get('waiting_mean'))} / {fmt_value(res.get('waiting_max'))}", ""),
             ("preemptions", fmt_value(res.get("preemptions")), "")]
    parts.append(_table(["resource", "value", "source"], facts, "res", num=(1,)))
    parts.append("</section>")
    return "".join(parts)


def _html_capture(r: ReportData) -> str:
    c = r.context
    rows: list[tuple[str, Any]] = [("captures", ", ".join(c["captures"]))]
    rows.append(("sides", " + ".join(c["sides"]) or "-"))
    if c["services"]:
        rows.append(("services", ", ".join(c["services"])))
    if c["models"]:
        rows.append(("models", ", ".join(c["models"])))
    if c["engines"]:
        rows.append(("engines", ", ".join(c["engines"])))
    rows.append(("requests", f"{r.resources['requests']} in all, {r.resources['ok_requests']} counted, "
                             f"{r.resources['errors']} failed, {c['warmup']} warm-up"))
    if c["faults"]:
        rows.append(("faults injected", ", ".join(f"{k}={v}" for k, v in c["faults"].items())))
    if c["clock_offsets"]:
        rows.append(("clock offsets (server - client)", ", ".join(f"{k}: {v * 1e3:+.3f} ms" for k, v in c["clock_offsets"].items())))
    for eng, note in c["lumped"].items():
        rows.append((f"note ({eng})", note))
    if c.get("tool_version"):
        rows.append(("capture written by", f"ttft-diag {c['tool_version']}"))
    parts = ['<section id="capture"><h2>The capture</h2>', _table(None, rows, "ctx")]
    if c["errors"]:
        parts.append("<h3>Failed requests</h3>" + _table(["error", "requests"], list(c["errors"].items()), "errors", num=(1,)))
    cold = c["cold_starts"]
    if cold is not None and not cold.empty:
        crow = [(str(p) if p is not None else "-", s, _d(d)) for p, s, d in zip(cold["phase"], cold["service"], cold["duration_s"])][:30]
        parts.append("<h3>Cold start (reported apart, never counted as TTFT)</h3>"
                     + _table(["phase", "service", "duration"], crow, "cold", num=(2,)))
    if c["warnings"]:
        parts.append("<details><summary>Warnings while loading (" + str(len(c["warnings"])) + ")</summary><ul>"
                     + "".join(f"<li>{esc(w)}</li>" for w in c["warnings"]) + "</ul></details>")
    parts.append("</section>")
    return "".join(parts)


def render_html(r: ReportData) -> str:
    """The whole report as one HTML document (inline CSS and SVG; no script, no network)."""
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    sub = f"{r.resources['ok_requests']} requests · generated {r.generated}"
    body = [
        f"<header><h1>{esc(r.title)}</h1><p class=\"sub\">{esc(sub)}</p></header>",
        _html_verdict(r),
        _html_slo(r),
        _html_findings(r),
        _html_latency(r),
        _html_stages(r),
        _html_load(r),
        _html_timelines(r),
        _html_capture(r),
        "<footer>Made by ttft-diag. Opens offline: no scripts, no external resources.</footer>",
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{esc(csp)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(r.title)}</title><style>{_CSS}</style></head><body><main>"
        + "".join(body)
        + "</main></body></html>\n"
    )


# --- Markdown -------------------------------------------------------------------------------


def md_esc(text: Any) -> str:
    """Escape a string for a Markdown table cell or line: HTML-escaped, no pipes, one line."""
    s = esc(text)
    for ch in ("\\", "|", "`", "[", "]", "*", "_"):
        s = s.replace(ch, "\\" + ch)
    return " ".join(s.splitlines())


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(md_esc(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        out.append("| " + " | ".join(md_esc(c) for c in row) + " |")
    out.append("")
    return out


def render_markdown(r: ReportData) -> str:
    """The same content as the HTML, as Markdown tables (sparklines instead of plots)."""
    L: list[str] = [f"# {md_esc(r.title)}", "", f"{r.resources['ok_requests']} requests · generated {md_esc(r.generated)}", ""]
    v = r.verdict
    if v is None:
        L += ["## No verdict: stage decomposition only", "",
              "The rule engine did not run, so no bottleneck is named; the numbers below are the measured decomposition.", ""]
        top = _top_stage(r.analysis.decomposition)
        if top:
            L += [f"Largest stage: **{md_esc(top[0])}**, {fmt_pct(top[1])} of TTFT.", ""]
    else:
        conf = f"{v.confidence:.0%}" if v.confidence is not None else "-"
        rule = f" · rule {md_esc(v.rule_id)}" if v.rule_id and v.rule_id != v.category else ""
        L += [f"## Verdict: {md_esc(v.category)}: {md_esc(v.title)}", "",
              f"Confidence **{conf}** · explains **{md_esc(fmt_explained(v))}**{rule}", ""]
        if v.evidence:
            L += _md_table(["evidence", "value", "threshold", "what it means"],
                           [(e.get("name") or "", fmt_value(e.get("value"), e.get("unit")),
                             fmt_threshold(e.get("threshold"), e.get("unit")), e.get("meaning") or "") for e in v.evidence])
        if v.next_checks:
            L += ["What to check next:", ""] + [f"- {md_esc(c)}" for c in v.next_checks] + [""]
        if v.note:
            L += [f"_{md_esc(v.note)}_", ""]
    pct = r.percentiles
    L += [f"TTFT p50 **{_d(pct['ttft_s']['p50'])}** · p95 **{_d(pct['ttft_s']['p95'])}** · p99 **{_d(pct['ttft_s']['p99'])}**"
          f" · ITL p50 {_d(pct['itl_s']['p50'])} · {r.resources['errors']} failed", ""]
    if r.slo:
        broken = [s for s in r.slo if not s.passed]
        L += [f"## SLOs: {len(broken)} of {len(r.slo)} broken" if broken else f"## SLOs: all {len(r.slo)} met", ""]
        L += _md_table(["SLO", "target", "measured", "result", "detail"],
                       [(s.key, fmt_duration_s(s.target_s), _d(s.actual_s), "pass" if s.passed else "FAIL", s.detail) for s in r.slo])
    L += ["## Other findings", ""]
    if r.findings:
        L += _md_table(["category", "finding", "confidence", "time explained"],
                       [(f.category, f.title, f"{f.confidence:.0%}" if f.confidence is not None else "-", fmt_explained(f)) for f in r.findings])
    else:
        L += ["No other rule fired." if v is not None else "No rules ran.", ""]
    if r.notes:
        L += [f"- note: {md_esc(n)}" for n in r.notes] + [""]
    if r.skipped:
        L += ["Skipped rules:", ""] + _md_table(["rule", "skipped because"], r.skipped)
    if r.passed:
        L += ["Rules that ran and did not fire:", ""] + _md_table(["rule", "why not"], r.passed)
    L += ["## Latency percentiles", ""]
    L += _md_table(["metric", "count", "p50", "p90", "p95", "p99", "max", "mean"], _latency_rows(r))
    L += ["## Where TTFT goes", ""]
    dec = r.analysis.decomposition
    if dec["stages"]:
        L += _md_table(["stage", "count", "p50", "p95", "p99", "share of TTFT"],
                       [(st, row["count"], _d(row["p50"]), _d(row["p95"]), _d(row["p99"]),
                         fmt_pct(row["share_of_ttft"]) if row.get("share_of_ttft") is not None else "-") for st, row in dec["stages"].items()])
        for label, vals in r.stage_rows.items():
            total = sum(vals.values()) or 1.0
            bar = "".join(st[0].upper() * max(0, round(40 * val / total)) for st, val in vals.items())
            L.append(f"- {md_esc(label)}: `{md_esc(bar)}` " + ", ".join(f"{md_esc(st)} {_d(val)}" for st, val in vals.items()))
        L += ["", "(bar letters: first letter of each stage, 40 characters = the row's total)", ""]
    else:
        L += ["No stage spans: a client-only capture or an uninstrumented server.", ""]
    if not r.slowest.empty:
        cols = _stage_cols(r.slowest)
        L += [f"Slowest {len(r.slowest)} requests:", ""]
        L += _md_table(["request", "TTFT", "prompt tokens"] + cols,
                       [[_request_label(row), _d(row["ttft_s"]), fmt_value(row.get("input_tokens"))]
                        + [_d(row[stages.stage_column(s)]) if pd.notna(row[stages.stage_column(s)]) else "-" for s in cols]
                        for _, row in r.slowest.iterrows()])
    L += ["## TTFT against prompt length and load", ""]
    ok = r.ok
    if "input_tokens" in ok and ok["input_tokens"].notna().any():
        d = ok.loc[ok["input_tokens"].notna()]
        q = pd.qcut(d["input_tokens"].rank(method="first"), min(6, len(d)), labels=False) if len(d) >= 2 else pd.Series(0, index=d.index)
        rows = []
        for _, g in d.groupby(q):
            rows.append((f"{fmt_num(g['input_tokens'].min())}-{fmt_num(g['input_tokens'].max())}", len(g),
                         _d(g["ttft_s"].median()), _d(g["ttft_s"].quantile(0.95))))
        L += _md_table(["prompt tokens", "requests", "TTFT p50", "TTFT p95"], rows)
        if r.prompt_fit:
            L += [f"Fit: {md_esc(r.prompt_fit[2])}; intercept {fmt_duration_s(r.prompt_fit[1])}.", ""]
    if len(ok) and r.inflight.size == len(ok):
        g = pd.Series(ok["ttft_s"].to_numpy()).groupby(r.inflight)
        rows = [(int(k), int(n), _d(m), _d(p)) for (k, n), m, p in zip(g.size().items(), g.median(), g.quantile(0.95))][:40]
        L += _md_table(["in flight at arrival", "requests", "TTFT p50", "TTFT p95"], rows)
    if r.by_segment:
        L += _md_table(["segment", "requests", "TTFT p50", "TTFT p95", "ITL p50"],
                       [(s["segment"], s["requests"], _d(s["ttft_p50_s"]), _d(s["ttft_p95_s"]), _d(s["itl_p50_s"])) for s in r.by_segment])
    L += ["## Device, KV cache and queue over time", ""]
    trows = []
    for key, fmt in (("busy", fmt_pct), ("kv", fmt_pct), ("queue", fmt_value)):
        for tl in r.timelines[key]:
            vals = tl.values[np.isfinite(tl.values)]
            if not vals.size:
                continue
            lo_hi = (0.0, 1.0) if key != "queue" else (0.0, None)
            trows.append((tl.label, svg.sparkline(vals.tolist(), 48, lo_hi[0], lo_hi[1]), fmt(float(vals.mean())), fmt(float(vals.max()))))
    if trows:
        L += _md_table(["series", "over time", "mean", "max"], trows)
    else:
        L += ["No engine steps or sampled series in the capture.", ""]
    c = r.context
    L += ["## The capture", ""]
    crow = [("captures", ", ".join(c["captures"])), ("sides", " + ".join(c["sides"]) or "-")]
    if c["services"]:
        crow.append(("services", ", ".join(c["services"])))
    if c["models"]:
        crow.append(("models", ", ".join(c["models"])))
    if c["faults"]:
        crow.append(("faults injected", ", ".join(f"{k}={v}" for k, v in c["faults"].items())))
    crow.append(("requests", f"{r.resources['requests']} in all, {r.resources['ok_requests']} counted, "
                             f"{r.resources['errors']} failed, {c['warmup']} warm-up"))
    L += _md_table(["", ""], crow)
    if c["errors"]:
        L += _md_table(["error", "requests"], list(c["errors"].items()))
    if c["warnings"]:
        L += ["Warnings:", ""] + [f"- {md_esc(w)}" for w in c["warnings"]] + [""]
    return "\n".join(L) + "\n"


# --- JSON -----------------------------------------------------------------------------------


def render_json(r: ReportData) -> str:
    """analysis.to_dict() plus the report's percentiles, resources and SLO results (strict JSON)."""
    doc = dict(r.analysis.to_dict())
    doc["percentiles"] = r.percentiles
    doc["resources"] = r.resources
    doc["slo"] = [s.to_dict() for s in r.slo]
    doc["slo_passed"] = all(s.passed for s in r.slo)
    doc["report"] = {"title": r.title, "generated": r.generated, "verdict_line": r.verdict_line}
    return json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"


def write_report(analysis: Any, path: str | os.PathLike[str], slo: Mapping[str, float] | None = None,
                 title: str | None = None) -> ReportResult:
    """Write the report for ``analysis`` to ``path`` (.html, .md or .json) and return what happened."""
    fmt = report_format(path)
    data = build_report(analysis, slo, title)
    text = {"html": render_html, "markdown": render_markdown, "json": render_json}[fmt](data)
    out = Path(path)
    try:
        if out.parent and not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        raise ReportError(f"{out}: cannot write report: {exc.strerror or exc}") from exc
    return ReportResult(out, fmt, data.verdict_line, data.slo)


__all__ = ["ReportError", "ReportResult", "ReportData", "build_report", "write_report", "render_html",
           "render_markdown", "render_json", "report_format", "md_esc", "STAGE_COLORS"]
