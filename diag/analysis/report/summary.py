"""Numbers a report or a diff shows that are not the rule engine's business: latency
percentiles (TTFT, ITL, TPOT, E2E), SLO checks, in-flight requests at arrival, throughput
and the resources' summary (the timelines behind the charts are :mod:`diag.analysis.report.timelines`).

Inputs are :class:`diag.ground.tables.Tables`; durations are seconds (``_s``), timestamps Unix ns
(``_ns``) or seconds since the start of the capture (``t_s``). Vectorised with numpy/pandas;
the only per-row Python loop is over requests' token-time arrays (pooled ITL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.capture import attribute
from diag.ground.tables import Tables, describe
from diag.ground.units import fmt_s
from rules.features.populations import experiment_limit_rows

NS = 1e9
#: SLO metric -> the percentile table key that holds it.
SLO_METRICS: dict[str, str] = {"ttft": "ttft_s", "itl": "itl_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def warmup_rows(req: pd.DataFrame) -> pd.Series:
    """Whether each request was warm-up (False where the table does not say)."""
    if "warmup" not in req:
        return pd.Series(False, index=req.index)
    return req["warmup"].astype(object).fillna(False).astype(bool)


def ok_requests(req: pd.DataFrame) -> pd.DataFrame:
    """Requests that count for latency: not warm-up, no error, with a TTFT."""
    ok = req.loc[~warmup_rows(req)]
    if "error" in ok.columns:
        ok = ok.loc[ok["error"].isna()]
    if "ttft_s" in ok.columns:
        ok = ok.loc[ok["ttft_s"].notna()]
    return ok


def itl_gaps_s(tables: Tables, trace_ids: pd.Series | None = None) -> np.ndarray:
    """Every inter-token gap (s) pooled over requests (client token times preferred).

    ``trace_ids`` limits the pool to those traces (e.g. the ok requests).
    """
    spans = tables.spans
    if spans is None or spans.empty or stages.ATTR_TOKEN_TIMES_NS not in spans.columns:
        return np.empty(0)
    names = spans["name"].astype(str)
    roots = spans.loc[names.isin([stages.SPAN_CLIENT_REQUEST, stages.SPAN_REQUEST])]
    if roots.empty:
        return np.empty(0)
    frame = pd.DataFrame({
        "trace_id": roots["trace_id"].astype(str).to_numpy(),
        "client": (roots["name"].astype(str) == stages.SPAN_CLIENT_REQUEST).to_numpy(),
        "tt": attribute(roots, stages.ATTR_TOKEN_TIMES_NS).to_numpy(),
    })
    frame = frame.loc[frame["tt"].map(lambda x: isinstance(x, (list, tuple, np.ndarray)) and len(x) >= 2)]
    if trace_ids is not None:
        frame = frame.loc[frame["trace_id"].isin(set(trace_ids.astype(str)))]
    if frame.empty:
        return np.empty(0)
    frame = frame.sort_values("client", ascending=False, kind="stable").drop_duplicates("trace_id", keep="first")
    gaps = [np.diff(np.asarray(tt, dtype="float64")) / NS for tt in frame["tt"].to_numpy()]
    return np.concatenate(gaps) if gaps else np.empty(0)


def latency_percentiles(tables: Tables) -> dict[str, dict[str, Any]]:
    """TTFT (client/server/either), pooled ITL, per-request TPOT and E2E, over ok requests."""
    ok = ok_requests(tables.requests)
    out = {
        "ttft_s": describe(ok["ttft_s"]) if "ttft_s" in ok else describe([]),
        "server_ttft_s": describe(ok["server_ttft_s"]) if "server_ttft_s" in ok else describe([]),
        "client_ttft_s": describe(ok["client_ttft_s"]) if "client_ttft_s" in ok else describe([]),
        "itl_s": describe(itl_gaps_s(tables, ok["trace_id"] if "trace_id" in ok else None)),
        "tpot_s": describe(ok["tpot_s"]) if "tpot_s" in ok else describe([]),
        "e2e_s": describe(ok["e2e_s"]) if "e2e_s" in ok else describe([]),
    }
    return out


@dataclass
class SLOResult:
    """One SLO item checked against the capture: ``actual_s`` None means no data (a fail)."""

    key: str
    target_s: float
    actual_s: float | None
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"slo": self.key, "target_s": self.target_s, "actual_s": self.actual_s,
                "passed": self.passed, "detail": self.detail}


def evaluate_slo(percentiles: dict[str, dict[str, Any]], slo: dict[str, float],
                 rules_checks: dict[str, Any] | None = None) -> list[SLOResult]:
    """Check ``{"ttft_p99": seconds, ...}``; missing data fails (a gate must not pass blind).

    ``rules_checks`` is the rule engine's ``slo_checks`` feature ({key: {"value_s": ...}}); its
    values win when present, so the gate agrees with the verdict (the rules leave cold-start
    outliers out of TTFT). Otherwise the values come from ``percentiles``.
    """
    results = []
    for key, target in slo.items():
        metric, _, stat = key.partition("_")
        col = SLO_METRICS.get(metric)
        row = percentiles.get(col or "", {})
        actual = row.get(stat) if row else None
        checked = (rules_checks or {}).get(key)
        if isinstance(checked, dict) and checked.get("value_s") is not None:
            actual = float(checked["value_s"])
        if actual is None:
            why = "no token times in the capture" if metric in ("itl", "tpot") else "no successful requests"
            results.append(SLOResult(key, target, None, False, f"no data ({why}): cannot show it is met"))
            continue
        passed = bool(actual <= target)
        op = "<=" if passed else ">"
        results.append(SLOResult(key, target, float(actual), passed,
                                 f"{fmt_s(actual)} {op} {fmt_s(target)} (n={row.get('count', 0)})"))
    return results


def inflight_at_arrival(req: pd.DataFrame) -> np.ndarray:
    """Requests in flight when each request arrived (itself included, so >= 1), in ``req``'s
    row order; the same definition as the rules' ``inflight_at_arrival_*`` features.

    A request is in flight from its start to its end (start + E2E; start + TTFT when the E2E
    is unknown; errors without either count as instantaneous).
    """
    if req.empty:
        return np.empty(0)
    start = pd.to_numeric(req["start_ns"], errors="coerce").to_numpy(dtype="float64")
    dur = pd.to_numeric(req.get("e2e_s"), errors="coerce").to_numpy(dtype="float64") if "e2e_s" in req else np.full(len(req), np.nan)
    ttft = pd.to_numeric(req.get("ttft_s"), errors="coerce").to_numpy(dtype="float64") if "ttft_s" in req else np.full(len(req), np.nan)
    dur = np.where(np.isfinite(dur), dur, np.where(np.isfinite(ttft), ttft, 0.0))
    valid = np.isfinite(start)
    starts = np.sort(start[valid])
    ends = np.sort((start + dur * NS)[valid])
    out = np.full(len(req), np.nan)
    s = start[valid]
    out[valid] = np.searchsorted(starts, s, side="right") - np.searchsorted(ends, s, side="right")
    return np.clip(out, 1, None)


def time_origin_ns(tables: Tables) -> float | None:
    """The earliest timestamp among requests, steps and series (Unix ns)."""
    cands = []
    req = tables.requests
    if not req.empty and "start_ns" in req and req["start_ns"].notna().any():
        cands.append(float(pd.to_numeric(req["start_ns"], errors="coerce").min()))
    if tables.steps is not None and not tables.steps.empty:
        cands.append(float(tables.steps["start_ns"].min()))
    if tables.series is not None and not tables.series.empty and tables.series["ts_s"].notna().any():
        cands.append(float(tables.series["ts_s"].min()) * NS)
    return min(cands) if cands else None


def wall_window_s(req: pd.DataFrame) -> float | None:
    """From the first request's start to the last request's end (s)."""
    if req.empty or "start_ns" not in req:
        return None
    start = pd.to_numeric(req["start_ns"], errors="coerce")
    end = start + pd.to_numeric(req.get("e2e_s"), errors="coerce").fillna(0) * NS
    if not start.notna().any():
        return None
    w = (float(end.max()) - float(start.min())) / NS
    return w if w > 0 else None


def busy_union_s(steps: pd.DataFrame) -> float:
    """Seconds covered by at least one engine step (union of intervals)."""
    if steps is None or steps.empty:
        return 0.0
    s = steps["start_ns"].to_numpy(dtype="float64")
    e = steps["end_ns"].to_numpy(dtype="float64")
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    prev_reach = np.concatenate([[-np.inf], reach[:-1]])
    new_block = s > prev_reach
    block_id = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = np.full(block_start.shape, -np.inf)
    np.maximum.at(block_end, block_id, e)
    return float((block_end - block_start).sum() / NS)


def series_frame(tables: Tables, name: str) -> pd.DataFrame:
    """The rows of one series of the capture's long-format series table (empty when absent)."""
    ser = tables.series
    if ser is None or ser.empty:
        return pd.DataFrame(columns=list(stages.SERIES_COLUMNS))
    return ser.loc[ser["series"].astype(str) == name]


def resource_summary(tables: Tables) -> dict[str, Any]:
    """Throughput, device busy fraction, KV usage and waiting-queue depth for a diff or report.
    ``errors`` counts the measured requests that failed, as the rules do: not the warm-up (the
    probe's compatibility check and calibration included), not the refusals at a designed
    experiment's context limit, counted apart in ``over_context``
    (:func:`rules.features.populations.experiment_limit_rows`)."""
    req = tables.requests
    ok = ok_requests(req)
    window = wall_window_s(ok)
    limit = experiment_limit_rows(req, tables.meta)
    out: dict[str, Any] = {
        "requests": int(len(req)),
        "ok_requests": int(len(ok)),
        "errors": int((req["error"].notna() & ~limit & ~warmup_rows(req)).sum()) if "error" in req else 0,
        "over_context": int(limit.sum()),
        "window_s": window,
        "requests_per_s": (len(ok) / window) if window else None,
        "output_tokens_per_s": (float(pd.to_numeric(ok["output_tokens"], errors="coerce").sum()) / window)
        if window and "output_tokens" in ok and ok["output_tokens"].notna().any() else None,
        "input_tokens_per_s": (float(pd.to_numeric(ok["input_tokens"], errors="coerce").sum()) / window)
        if window and "input_tokens" in ok and ok["input_tokens"].notna().any() else None,
    }
    gpu = series_frame(tables, stages.SERIES_GPU_UTIL_PCT)
    if not gpu.empty:
        out["device_busy_frac"] = float(gpu["value"].mean() / 100.0)
        out["device_busy_source"] = "nvml"
    elif tables.steps is not None and not tables.steps.empty:
        span_s = (float(tables.steps["end_ns"].max()) - float(tables.steps["start_ns"].min())) / NS
        out["device_busy_frac"] = busy_union_s(tables.steps) / span_s if span_s > 0 else None
        out["device_busy_source"] = "engine steps"
    else:
        out["device_busy_frac"] = None
        out["device_busy_source"] = None
    kv = series_frame(tables, stages.SERIES_KV_USAGE)["value"]
    if kv.empty and tables.steps is not None and "kv_usage_ratio" in tables.steps:
        kv = tables.steps["kv_usage_ratio"]
    kvd = describe(kv)
    out["kv_usage_p95"] = kvd["p95"]
    out["kv_usage_max"] = kvd["max"]
    wait = series_frame(tables, stages.SERIES_WAITING)["value"]
    if wait.empty and tables.steps is not None and "waiting_seqs" in tables.steps:
        wait = tables.steps["waiting_seqs"]
    wd = describe(wait)
    out["waiting_mean"] = wd["mean"]
    out["waiting_max"] = wd["max"]
    pre = pd.to_numeric(req["preemptions"], errors="coerce") if "preemptions" in req else pd.Series(dtype="float64")
    out["preemptions"] = float(pre.sum()) if pre.notna().any() else None
    return out
