"""The report as one self-contained HTML document, rendered from jinja2 templates.

:func:`render_html` turns a :class:`~diag.analysis.report.gather.ReportData` into the template's plain
values (text already formatted by :mod:`diag.ground.units`, charts as inline SVG from
:mod:`diag.analysis.report.svg`) and renders ``templates/report.html.j2`` with autoescape on, so every
string from a trace (request ids, services, models, segment labels, error kinds, evidence text,
warnings) is escaped by jinja2. The SVG charts escape their own text and are the only markup
passed through (:class:`markupsafe.Markup`). The page carries a Content-Security-Policy that
forbids scripts and any network load, and has no external references: it opens offline.
Pure functions, any thread (the jinja2 environment is read-only once built).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

from diag.ground import stages
from diag.analysis.report import svg
from diag.analysis.report.cells import evidence_cells, fmt_confidence, fmt_explained, leading_line
from diag.analysis.report.gather import ReportData, request_label, stage_cols, top_stage
from diag.ground.units import as_float
from diag.ground.units import Unit, fmt_rate, fmt_s, fmt_value

#: Stage colours, shared by every chart (and by the diff).
STAGE_COLORS: dict[str, str] = {
    stages.TOKENIZE: "#56B4E9", stages.QUEUE: "#E69F00", stages.PREFILL: "#0072B2", stages.COMM: "#CC79A7",
    stages.SAMPLE: "#009E73", stages.KV_TRANSFER: "#882255", stages.DETOKENIZE: "#F0E442", stages.LUMPED: "#999999", stages.NETWORK: "#D55E00",
    "unattributed": "#DDDDDD",
}
CATEGORY_COLORS: dict[str, str] = {"healthy": "#009E73", "loadgen": "#999999", "cold_start": "#56B4E9",
                                   "inconclusive": "#E69F00", "failures": "#D55E00", "no_data": "#999999"}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _share(v: float) -> str:
    return fmt_value(v, Unit.SHARE)


def _count(v: float) -> str:
    return fmt_value(v, Unit.COUNT)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("diag.analysis.report", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _finding(f: Any) -> dict[str, Any]:
    return {"category": f.category, "title": f.title, "rule_id": f.rule_id if f.rule_id != f.category else "",
            "confidence": f.confidence, "confidence_text": fmt_confidence(f.confidence),
            "explained": fmt_explained(f), "evidence": [evidence_cells(e) for e in f.evidence],
            "next_checks": list(f.next_checks), "note": f.note or "",
            "color": CATEGORY_COLORS.get(f.category, "#0072B2")}


def _verdict(r: ReportData) -> dict[str, Any]:
    pct = r.percentiles["ttft_s"]
    glance = [("TTFT p50", fmt_s(pct["p50"])), ("TTFT p95", fmt_s(pct["p95"])), ("TTFT p99", fmt_s(pct["p99"])),
              ("ITL p50", fmt_s(r.percentiles["itl_s"]["p50"])), ("requests", str(r.resources["ok_requests"]))]
    if r.resources.get("errors"):
        glance.append(("errors", str(r.resources["errors"])))
    top = top_stage(r.analysis.decomposition) if r.verdict is None else None
    return {"glance": glance, "finding": _finding(r.verdict) if r.verdict is not None else None,
            "leading": leading_line(r.diagnosis.leading if r.diagnosis is not None else None),
            "top": (top[0], _share(top[1]), stages.STAGE_DESCRIPTIONS.get(top[0], "")) if top else None}


def _latency(r: ReportData) -> dict[str, Any]:
    res = r.resources
    thr = []
    if res.get("requests_per_s") is not None:
        thr.append(fmt_rate(res["requests_per_s"], Unit.REQUESTS))
    for side in ("output", "input"):
        if res.get(f"{side}_tokens_per_s") is not None:
            thr.append(f"{side} {fmt_value(res[f'{side}_tokens_per_s'], Unit.TOKENS_PER_S)}")
    return {"rows": r.latency_rows(), "side": r.context.get("ttft_side"), "throughput": ", ".join(thr),
            "window": fmt_s(res.get("window_s")), "histogram": _histogram(r)}


def _histogram(r: ReportData) -> Markup | None:
    v = pd.to_numeric(r.ok["ttft_s"], errors="coerce").dropna().to_numpy() if "ttft_s" in r.ok else np.empty(0)
    if v.size < 5:
        return None
    hi, lo = float(np.percentile(v, 99.5)), float(v.min())
    if hi <= lo:
        return None
    edges = np.linspace(lo, hi, 25)
    counts, _ = np.histogram(np.clip(v, lo, hi), bins=edges)
    return Markup(svg.bar_chart([fmt_s(e) for e in edges[:-1]], counts.tolist(),
                                title="TTFT distribution (requests per bin; bin start shown)",
                                value_fmt=_count, height=200, width=1000, x_label="TTFT"))


def _stages(r: ReportData) -> dict[str, Any]:
    dec = r.analysis.decomposition
    out: dict[str, Any] = {"chart": None, "rows": [], "ttft_p50": fmt_s(dec["ttft_s"]["p50"]), "slowest": None}
    if r.stage_rows:
        rows = [(label, list(vals.items())) for label, vals in r.stage_rows.items()]
        out["chart"] = Markup(svg.stacked_hbar(
            rows, title="Per-stage time: median, mean, and the slowest 5% of requests", colors=STAGE_COLORS,
            value_fmt=fmt_s, label_w=170, width=1000, x_label="seconds (stages in request order; comm is inside prefill)"))
        out["rows"] = [{"color": STAGE_COLORS.get(st, "#333"), "stage": st, "count": row["count"], "p50": fmt_s(row["p50"]),
                        "p95": fmt_s(row["p95"]), "p99": fmt_s(row["p99"]), "share": _share(row.get("share_of_ttft")),
                        "what": stages.STAGE_DESCRIPTIONS.get(st, "")} for st, row in dec["stages"].items()]
    if not r.slowest.empty:
        cols = stage_cols(r.slowest)
        bars, detail = [], []
        for _, row in r.slowest.iterrows():
            segs = [(st, float(row[stages.stage_column(st)])) for st in cols if pd.notna(row[stages.stage_column(st)])]
            rest = float(row["ttft_s"]) - sum(v for _, v in segs)
            if rest > max(1e-4, 0.01 * float(row["ttft_s"])):
                segs.append(("unattributed", rest))
            bars.append((request_label(row), segs))
            seg, srv = row.get("segment"), row.get("server_service")
            detail.append((request_label(row), fmt_s(row["ttft_s"]), _count(row.get("input_tokens")),
                           _count(row.get("output_tokens")), seg if pd.notna(seg) else "",
                           srv if pd.notna(srv) else (row.get("client_service") or "")))
        out["slowest"] = {"n": len(bars), "detail": detail, "chart": Markup(svg.stacked_hbar(
            bars, title="Slowest requests by TTFT, split by stage", colors=STAGE_COLORS, value_fmt=fmt_s,
            label_w=170, width=1000, x_label="seconds"))}
    return out


def _tips(ok: pd.DataFrame, extra: str, values: Sequence[Any]) -> list[str] | None:
    if len(ok) > 3000:
        return None
    labels = [request_label(row) for _, row in ok.iterrows()]
    return [f"{lab}: TTFT {fmt_s(t)}, {extra} {_count(x)}" for lab, t, x in zip(labels, ok["ttft_s"], values)] or None


def _load(r: ReportData) -> dict[str, Any]:
    ok = r.ok
    out: dict[str, Any] = {"prompt": None, "inflight": None, "notes": "", "segments": []}
    if "input_tokens" in ok and ok["input_tokens"].notna().any():
        d = ok.loc[ok["input_tokens"].notna()]
        fit = svg.Fit(r.prompt_fit[0], r.prompt_fit[1], r.prompt_fit[2]) if r.prompt_fit else None
        out["prompt"] = Markup(svg.scatter_chart(
            [svg.Series("", d["input_tokens"].tolist(), d["ttft_s"].tolist(), "#0072B2", _tips(d, "prompt tokens", d["input_tokens"].tolist()))],
            title="TTFT vs prompt tokens", x_label="prompt tokens", y_label="TTFT", y_fmt=fmt_s, fit=fit, width=520, height=280))
    if len(ok) and r.inflight.size == len(ok):
        infl = r.inflight
        curve = r.feature_table("ttft_by_inflight")
        if curve and r.feature_source("ttft_by_inflight") in (None, "measured"):
            pts = sorted((float(k), float(v)) for k, v in curve.items() if as_float(k) is not None and as_float(v) is not None)
            lines = [svg.Series("rules' median TTFT per level", [p[0] for p in pts], [p[1] for p in pts], "#D55E00")]
        else:
            med = pd.Series(ok["ttft_s"].to_numpy()).groupby(infl).median()
            lines = [svg.Series("median per level", med.index.tolist(), med.tolist(), "#D55E00")] if len(med) >= 2 else []
        out["inflight"] = Markup(svg.scatter_chart(
            [svg.Series("", infl.tolist(), ok["ttft_s"].tolist(), "#009E73", _tips(ok, "in flight", infl.tolist()))],
            title="TTFT vs requests in flight at arrival", x_label="requests in flight (incl. itself)",
            y_label="TTFT", y_fmt=fmt_s, lines=lines, width=520, height=280))
    notes = []
    if r.prompt_fit:
        notes.append(f"Dashed line: {r.prompt_fit[2]}; intercept {fmt_s(r.prompt_fit[1])}.")
    knee = r.feature("concurrency_knee")
    if knee is not None:
        where = (f"the sweep's concurrency {fmt_value(knee, Unit.COUNT)}" if r.feature_source("concurrency_knee") == "segments"
                 else f"{fmt_value(knee, Unit.REQUESTS)} in flight")
        notes.append(f"The rules place the concurrency knee (where TTFT starts to climb) at {where}.")
    out["notes"] = " ".join(notes)
    out["segments"] = [(s["segment"], s["requests"], fmt_s(s["ttft_p50_s"]), fmt_s(s["ttft_p95_s"]), fmt_s(s["itl_p50_s"]),
                        _count(s["input_tokens_mean"])) for s in r.by_segment]
    return out


def _timelines(r: ReportData) -> dict[str, Any]:
    ok, tl, origin = r.ok, r.timelines, r.context.get("origin_ns")
    # one x axis for every timeline so that a spike lines up across charts
    t_max = max([float(np.nanmax(x.t_s)) for k in tl for x in tl[k] if x.t_s.size] + [0.0])
    t_arr = np.empty(0)
    if origin is not None and len(ok):
        t_arr = (pd.to_numeric(ok["start_ns"], errors="coerce").to_numpy(dtype="float64") - origin) / 1e9
        if np.isfinite(t_arr).any():
            t_max = max(t_max, float(np.nanmax(t_arr)))
    xr, xl = (0.0, t_max if t_max > 0 else 1.0), "seconds since capture start"
    charts = []
    if t_arr.size:
        charts.append(svg.scatter_chart([svg.Series("", t_arr.tolist(), ok["ttft_s"].tolist(), "#0072B2")],
                                        title="TTFT by arrival time", x_label=xl, y_label="TTFT", y_fmt=fmt_s,
                                        height=200, width=1000, x_range=xr))
    for key, title, color in (("busy", "Device busy", "#0072B2"), ("kv", "KV-cache usage", "#CC79A7")):
        if tl[key]:
            t = tl[key][0]
            charts.append(svg.line_chart([svg.Series(t.label, t.t_s.tolist(), t.values.tolist(), color)], title=title,
                                         x_label=xl, y_fmt=_share, y_min=0.0, y_max=1.0, height=190, width=1000, x_range=xr))
    if tl["queue"]:
        colors = ["#E69F00", "#009E73"]
        charts.append(svg.line_chart(
            [svg.Series(q.label, q.t_s.tolist(), q.values.tolist(), colors[i % 2]) for i, q in enumerate(tl["queue"])],
            title="Sequences waiting and running", x_label=xl, y_fmt=_count, y_min=0.0, height=190, width=1000, x_range=xr))
    res = r.resources
    facts = [("device busy", _share(res.get("device_busy_frac")), res.get("device_busy_source") or ""),
             ("KV usage p95 / max", f"{_share(res.get('kv_usage_p95'))} / {_share(res.get('kv_usage_max'))}", ""),
             ("waiting sequences mean / max", f"{_count(res.get('waiting_mean'))} / {_count(res.get('waiting_max'))}", ""),
             ("preemptions", _count(res.get("preemptions")), "")]
    missing = [n for n, key in (("device busy", "busy"), ("KV-cache usage", "kv"), ("queue depth", "queue")) if not tl[key]]
    return {"charts": [Markup(c) for c in charts], "missing": ", ".join(missing), "facts": facts}


def _capture(r: ReportData) -> dict[str, Any]:
    c, res = r.context, r.resources
    rows: list[tuple[str, str]] = [("captures", ", ".join(c["captures"])), ("sides", " + ".join(c["sides"]) or "-")]
    for key in ("services", "models", "engines"):
        if c[key]:
            rows.append((key, ", ".join(c[key])))
    rows.append(("requests", f"{res['requests']} in all, {res['ok_requests']} counted, {res['errors']} failed, {c['warmup']} warm-up"))
    if c["faults"]:
        rows.append(("faults injected", ", ".join(f"{k}={v}" for k, v in c["faults"].items())))
    if c["clock_offsets"]:
        rows.append(("clock offsets (server - client)", ", ".join(f"{k}: {v * 1e3:+.3f} ms" for k, v in c["clock_offsets"].items())))
    rows += [(f"note ({eng})", note) for eng, note in c["lumped"].items()]
    if c.get("tool_version"):
        rows.append(("capture written by", f"ttft-diag {c['tool_version']}"))
    cold = c["cold_starts"]
    cold_rows = [] if cold is None or cold.empty else [
        (str(p) if p is not None else "-", s, fmt_s(d)) for p, s, d in zip(cold["phase"], cold["service"], cold["duration_s"])][:30]
    return {"rows": rows, "errors": list(c["errors"].items()), "cold": cold_rows, "warnings": c["warnings"]}


def render_html(r: ReportData) -> str:
    """The whole report as one HTML document (inline CSS and SVG; no script, no network)."""
    return _env().get_template("report.html.j2").render(
        title=r.title, csp=CSP, sub=f"{r.resources['ok_requests']} requests · generated {r.generated}",
        verdict=_verdict(r), slo=r.slo, slo_broken=sum(1 for s in r.slo if not s.passed),
        findings=[_finding(f) for f in r.findings], rules_ran=r.verdict is not None, notes=r.notes,
        skipped=[(s.rule_id, s.reason) for s in r.skipped], passed=[(p.rule_id, p.reason) for p in r.passed],
        latency=_latency(r), stages=_stages(r), load=_load(r), timelines=_timelines(r), capture=_capture(r),
        fmt_s=fmt_s,
    )


__all__ = ["render_html", "STAGE_COLORS", "CATEGORY_COLORS"]
