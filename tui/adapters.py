"""The TUI's calls into the rule engine and the report writer, cut to the frame's window.

``run_rules`` gives the rules the window's tables (at most :data:`RULES_MAX_REQUESTS`
requests) and returns their :class:`rules.Diagnosis` as it is; ``write_report`` writes the
window's HTML report with :func:`diag.analysis.report.write_report`.

Threading: every function here runs on a worker thread (they do pandas work and I/O).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import rules
from diag.analysis import Analysis
from diag.analysis.report import write_report as write
from diag.ground.tables import Tables, stage_decomposition

NS = 1_000_000_000


def run_rules_in_window(tables: Tables, window_ns: tuple[int, int] | None, slo: dict[str, float] | None = None,
             rules_file: str | None = None) -> rules.Diagnosis:
    """The rule engine over ``tables`` for the window (worker thread). Raises what the rules raise
    (e.g. :class:`rules.RulesFileError`); the caller shows it."""
    return rules.run_rules(tables, rules_file=rules_file, slo=slo, window_ns=window_ns)


#: The rules see at most this many requests: a larger window is cut to its most recent part
#: holding this many (a sampled window, said on screen). Features cost ~25 µs per request
#: (token gaps are flattened from the span table), so 20,000 requests take about 0.5 s.
RULES_MAX_REQUESTS = 20_000


@dataclass
class RulesRun:
    """One run of the rules over a window (worker thread result).

    ``diagnosis`` is None only when the rules failed; ``error`` then says why (one line).
    """

    diagnosis: rules.Diagnosis | None
    #: the window the rules saw (Unix ns): the frame's window, or its most recent part
    window_ns: tuple[int, int] | None
    requests: int  # requests the rules saw
    total: int  # requests in the frame's window
    elapsed_s: float
    note: str = ""
    error: str = ""


def rules_input(tables: Tables, window_ns: tuple[int, int] | None,
                max_requests: int = RULES_MAX_REQUESTS) -> tuple[Tables, tuple[int, int] | None, int, int]:
    """The tables the rules get for a window: requests/steps/series of the window (cut to its
    most recent ``max_requests`` requests; ``window_ns`` None: the whole capture, uncut unless
    it holds more than ``max_requests``) and only the spans that start inside it (plus the
    longest request's duration), so the rules' cost follows the window, not the capture.
    Returns (tables, rules window, requests seen, requests in the window)."""
    if window_ns is None:
        # the whole capture: the tables as they are, so the rules compute what `ttft analyze`
        # computes (a window cut here dropped the last /metrics sample: 60% vs 55%)
        n = len(tables.requests)
        st = tables.requests["start_ns"].to_numpy(dtype="float64") if n and "start_ns" in tables.requests.columns \
            else np.zeros(0)
        if n <= max_requests or not (~np.isnan(st)).any():
            return tables, None, n, n
        window_ns = (int(np.nanmin(st)), int(np.nanmax(st)) + 1)
    w = tables.window(window_ns)
    total = len(w.requests)
    lo, hi = window_ns
    if total > max_requests:
        starts = w.requests["start_ns"].to_numpy(dtype="float64")
        lo = int(np.sort(starts)[total - max_requests])
        w = tables.window((lo, hi))
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
    return replace(w, spans=spans), (lo, hi), seen, total


def run_rules(tables: Tables, window_ns: tuple[int, int] | None, slo: dict[str, float] | None = None,
              rules_file: str | None = None, max_requests: int = RULES_MAX_REQUESTS) -> RulesRun:
    """Features + rules over the window (worker thread), on at most ``max_requests`` requests."""
    t0 = time.perf_counter()
    cut, win, seen, total = rules_input(tables, window_ns, max_requests)
    diagnosis = run_rules_in_window(cut, win, slo=slo, rules_file=rules_file)
    note = ""
    if seen < total:
        note = f"verdict over the most recent {seen:,} of {total:,} requests in the window (sampled window)"
    return RulesRun(diagnosis, win, seen, total, time.perf_counter() - t0, note)


def write_report(tables: Tables, window_ns: tuple[int, int] | None, diagnosis: rules.Diagnosis | None,
                 directory: Path, source_path: str, slo: dict[str, float] | None = None) -> Path:
    """Write the window's HTML report into ``directory`` and return its path (worker thread;
    raises OSError or :class:`diag.analysis.report.ReportError` on a write failure)."""
    windowed = tables.window(window_ns)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    analysis = Analysis([source_path], windowed, stage_decomposition(windowed.requests), diagnosis,
                        list(tables.warnings))
    directory.mkdir(parents=True, exist_ok=True)
    return write(analysis, directory / f"ttft-report-{stamp}.html", slo=slo).path
