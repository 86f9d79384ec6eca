"""The one place the TUI touches the rule engine, the feature extractor and the report writer.

``rules.diagnose`` / ``diag.features.compute_features`` / ``diag.report.write_report`` are
used when they import; otherwise (or when they fail) a small fallback verdict is derived
from the stage decomposition so the screen still says where TTFT goes, and the fallback
says so in its note.

Threading: every function here runs on a worker thread (they do pandas work and I/O).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag import stages
from diag.tables import Tables

NS = 1_000_000_000


@dataclass
class FallbackEvidence:
    name: str
    value: float | None
    threshold: float | None
    unit: str
    meaning: str


@dataclass
class FallbackFinding:
    rule_id: str
    category: str
    title: str
    confidence: float
    explained_s: float | None
    explained_pct: float | None
    evidence: list[FallbackEvidence] = field(default_factory=list)
    next_checks: list[str] = field(default_factory=list)
    note: str = ""
    basis: str = "mean TTFT"


@dataclass
class FallbackDiagnosis:
    """A Diagnosis-shaped verdict from the stage shares only (no thresholds, no rules)."""

    verdict: FallbackFinding
    findings: list[FallbackFinding]
    skipped: list[Any] = field(default_factory=list)
    features: Any = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"verdict": asdict(self.verdict), "findings": [asdict(f) for f in self.findings], "skipped": []}

    def format_text(self) -> str:
        v = self.verdict
        return f"verdict: {v.title} ({v.category}, confidence {v.confidence:.0%})\n{v.note}"


_NEXT_CHECKS: dict[str, list[str]] = {
    stages.QUEUE: ["queue wait share of TTFT", "scheduler thread CPU profile", "max_num_seqs and KV-cache space"],
    stages.TOKENIZE: ["tokenizer time per prompt token", "CPU profile of the serving process"],
    stages.PREFILL: ["TTFT against prompt length (slope)", "GPU compute utilisation during prefill"],
    stages.COMM: ["comm share of prefill", "NVLink/PCIe counters and topology"],
    stages.SAMPLE: ["sampler settings (top-k/top-p over a large vocabulary)"],
    stages.DETOKENIZE: ["detokenizer time per token", "CPU profile of the serving process"],
    stages.NETWORK: ["client-server network path", "response serialization and HTTP stack"],
    stages.LUMPED: ["engine-internal stages the engine does not separate"],
}


def window_tables(tables: Tables, window_ns: tuple[int, int] | None) -> Tables:
    """The tables restricted to requests/steps/series that start inside the window.

    Requests and steps are sorted by ``start_ns`` (diag.tables sorts them) and series by
    ``ts_s``, so this is a binary search plus a slice, not a scan. Spans are not sliced.
    """
    if window_ns is None:
        return tables
    lo, hi = window_ns

    def cut(df: pd.DataFrame, col: str, scale: float = 1.0) -> pd.DataFrame:
        if not len(df) or col not in df.columns:
            return df
        v = df[col].to_numpy(dtype="float64", na_value=np.nan)
        if len(v) > 1 and not bool(np.all(v[1:] >= v[:-1])):
            mask = (v >= lo / scale) & (v < hi / scale)
            return df.loc[mask]
        a, b = np.searchsorted(v, [lo / scale, hi / scale], side="left")
        return df.iloc[int(a):int(b)]

    return Tables(
        requests=cut(tables.requests, "start_ns"),
        steps=cut(tables.steps, "start_ns"),
        cold_starts=tables.cold_starts,
        spans=tables.spans,
        series=cut(tables.series, "ts_s", NS),
        meta=tables.meta,
        warnings=tables.warnings,
        clock_offsets=tables.clock_offsets,
        lumped_notes=tables.lumped_notes,
    )


def rule_engine_available() -> bool:
    try:
        import rules
    except ImportError:
        return False
    return hasattr(rules, "diagnose")


def diagnose(tables: Tables, window_ns: tuple[int, int] | None, slo: dict[str, float] | None = None,
             rules_file: str | None = None, windowed: Tables | None = None) -> Any:
    """Run the rule engine over the window; fall back to the stage shares when it is missing
    or fails. ``windowed`` is ``window_tables(tables, window_ns)`` when the caller has it."""
    problem = ""
    try:
        import rules
    except ImportError:
        rules = None  # type: ignore[assignment]
    fn = getattr(rules, "diagnose", None) if rules is not None else None
    if fn is not None:
        try:
            return fn(tables, rules_file=rules_file, slo=slo, window_ns=window_ns)
        except TypeError as exc:
            if "window_ns" not in str(exc):
                problem = f"rule engine failed: TypeError: {exc}"
            else:  # an older signature without window_ns: give it the windowed tables
                try:
                    return fn(windowed or window_tables(tables, window_ns), rules_file=rules_file, slo=slo)
                except Exception as exc2:
                    problem = f"rule engine failed: {type(exc2).__name__}: {exc2}"
        except Exception as exc:  # a rule's bug must not blank the screen
            problem = f"rule engine failed: {type(exc).__name__}: {str(exc)[:120]}"
    else:
        problem = "rule engine not available"
    return fallback_diagnosis(windowed if windowed is not None else window_tables(tables, window_ns), problem)


def fallback_diagnosis(tables: Tables, problem: str) -> FallbackDiagnosis:
    """The largest stage share as the verdict (confidence scaled by the share)."""
    req = tables.requests
    ok = req
    if len(ok) and "error" in ok.columns:
        ok = ok.loc[ok["error"].isna()]
    if len(ok) and "ttft_s" in ok.columns:
        ok = ok.loc[ok["ttft_s"].notna()]
    note = f"{problem}: verdict from the stage shares only" if problem else "verdict from the stage shares only"
    if not len(ok):
        f = FallbackFinding("fallback.no_data", "no_data", "No completed requests in this window", 0.0, None, None,
                            note=note)
        return FallbackDiagnosis(f, [f])
    ttft = ok["ttft_s"].to_numpy(dtype="float64")
    total = float(np.nansum(ttft))
    shares: list[tuple[float, str, float]] = []
    for st in stages.DECOMPOSITION_STAGES:
        col = stages.stage_column(st)
        if col not in ok.columns:
            continue
        v = ok[col].to_numpy(dtype="float64")
        have = ~np.isnan(v)
        if not have.any():
            continue
        denom = float(ttft[have].sum())
        if denom <= 0:
            continue
        shares.append((float(v[have].sum()) / denom, st, float(v[have].mean())))
    shares.sort(reverse=True)
    findings: list[FallbackFinding] = []
    n = len(ok)
    for share, st, mean_s in shares[:3]:
        findings.append(FallbackFinding(
            rule_id=f"fallback.{st}", category=st,
            title=f"{st} takes {share:.0%} of TTFT", confidence=round(min(0.9, share), 2),
            explained_s=mean_s, explained_pct=share * 100,
            evidence=[FallbackEvidence(f"{st}_share", share * 100, None, "%", f"share of TTFT over {n} requests"),
                      FallbackEvidence(f"{st}_mean_s", mean_s, None, "s", "mean per request")],
            next_checks=_NEXT_CHECKS.get(st, []), note=note))
    if not findings:
        f = FallbackFinding("fallback.no_stages", "unknown", "No stage spans: TTFT cannot be decomposed", 0.0,
                            total / n, None, note=note)
        findings = [f]
    return FallbackDiagnosis(findings[0], findings)


#: The rules see at most this many requests: a larger window is cut to its most recent part
#: holding this many (a sampled window, said on screen). Features cost ~25 µs per request
#: (token gaps are flattened from the span table), so 20,000 requests take about 0.5 s.
RULES_MAX_REQUESTS = 20_000


@dataclass
class RulesRun:
    """One run of the rules over a window (worker thread result)."""

    diagnosis: Any
    #: the window the rules saw (Unix ns): the frame's window, or its most recent part
    window_ns: tuple[int, int] | None
    requests: int  # requests the rules saw
    total: int  # requests in the frame's window
    elapsed_s: float
    note: str = ""


def rules_input(tables: Tables, window_ns: tuple[int, int] | None,
                max_requests: int = RULES_MAX_REQUESTS) -> tuple[Tables, tuple[int, int] | None, int, int]:
    """The tables the rules get for a window: requests/steps/series of the window (cut to its
    most recent ``max_requests`` requests) and only the spans that start inside it (plus the
    longest request's duration), so the rules' cost follows the window, not the capture.
    Returns (tables, rules window, requests seen, requests in the window)."""
    if window_ns is None:
        st = tables.requests["start_ns"] if len(tables.requests) else pd.Series(dtype="float64")
        if not len(st):
            return tables, None, 0, 0
        window_ns = (int(np.nanmin(st.to_numpy(dtype="float64"))), int(np.nanmax(st.to_numpy(dtype="float64"))) + 1)
    w = window_tables(tables, window_ns)
    total = len(w.requests)
    lo, hi = window_ns
    if total > max_requests:
        starts = w.requests["start_ns"].to_numpy(dtype="float64")
        lo = int(np.sort(starts)[total - max_requests])
        w = window_tables(tables, (lo, hi))
    seen = len(w.requests)
    spans = tables.spans
    if len(spans) and "start_ns" in spans.columns:
        e2e = w.requests["e2e_s"].to_numpy(dtype="float64") if "e2e_s" in w.requests.columns and seen else np.zeros(0)
        slack = float(np.nanmax(e2e)) if len(e2e) and (~np.isnan(e2e)).any() else 60.0
        slack = min(max(slack, 1.0), 3600.0)
        t = spans["start_ns"].to_numpy()
        mask = (t >= lo - NS) & (t < hi + int(slack * NS))
        if not bool(mask.all()):
            spans = spans.loc[mask]
    cut = Tables(w.requests, w.steps, w.cold_starts, spans, w.series, w.meta, w.warnings, w.clock_offsets,
                 w.lumped_notes)
    return cut, (lo, hi), seen, total


def run_rules(tables: Tables, window_ns: tuple[int, int] | None, slo: dict[str, float] | None = None,
              rules_file: str | None = None, max_requests: int = RULES_MAX_REQUESTS) -> RulesRun:
    """Features + rules over the window (worker thread), on at most ``max_requests`` requests."""
    t0 = time.perf_counter()
    cut, win, seen, total = rules_input(tables, window_ns, max_requests)
    diagnosis = diagnose(cut, win, slo=slo, rules_file=rules_file, windowed=cut)
    note = ""
    if seen < total:
        note = f"verdict over the most recent {seen:,} of {total:,} requests in the window (sampled window)"
    return RulesRun(diagnosis, win, seen, total, time.perf_counter() - t0, note)


def write_report(tables: Tables, window_ns: tuple[int, int] | None, diagnosis: Any, directory: Path,
                 source_path: str, slo: dict[str, float] | None = None) -> Path:
    """Write a report for the window: ``diag.report.write_report`` when it exists (HTML), else
    the diagnosis as JSON. Returns the path written (raises OSError on a write failure)."""
    from diag.analysis import Analysis
    from diag.tables import stage_decomposition

    windowed = window_tables(tables, window_ns)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    analysis = Analysis([source_path], windowed, stage_decomposition(windowed.requests), diagnosis,
                        list(tables.warnings))
    try:
        from diag import report  # type: ignore[attr-defined]
    except ImportError:
        report = None  # type: ignore[assignment]
    writer = getattr(report, "write_report", None) if report is not None else None
    directory.mkdir(parents=True, exist_ok=True)
    if writer is not None:
        path = directory / f"ttft-report-{stamp}.html"
        out = writer(analysis, path, slo=slo)
        if isinstance(out, (str, Path)):
            return Path(out)
        return Path(getattr(out, "path", path))
    path = directory / f"ttft-report-{stamp}.json"
    doc = analysis.to_dict()
    doc["window_ns"] = list(window_ns) if window_ns else None
    from diag.units import json_safe

    path.write_text(json.dumps(json_safe(doc), indent=2), encoding="utf-8")
    return path

