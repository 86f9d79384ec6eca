"""Snapshot (tables + window) + diagnosis -> a plain view model the widgets only render.

All of a frame's data work happens here, on a worker thread: slicing the window, running the
rules (via :mod:`tui.adapters`; their :class:`rules.Diagnosis` as it is), percentiles,
sparklines, the stage breakdown, throughput, KV,
GPU / engine-busy panels and the slowest requests. The resulting :class:`ViewModel`
(:mod:`tui.viewmodels`) holds only plain Python values (str, float, lists), so the UI thread
never touches pandas; the numpy columns behind it are cached in :mod:`tui.prepared`, one
request's waterfall is :mod:`tui.waterfall`.

Units: durations in seconds (``_s``), rates per second, bytes, percentages in percent
(``_pct``), ratios 0..1 (``_ratio``); timestamps Unix ns (``_ns``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pandas as pd

import rules
from diag.ground import stages
from diag.analysis.report.cells import evidence_cells, fmt_explained, leading_line
from diag.ground.units import Unit, fmt_value, is_num
from tui import adapters
from tui.prepared import NS, Buckets, Prepared, SeriesView, as_float, bucket_mean, percentiles, prepared
from tui.sources import Snapshot
from tui.viewmodels import (
    BusyVM, EvidenceVM, FindingVM, GpuVM, LatencyVM, SlowRowVM, StagesVM, StageVM, ThroughputVM, VerdictVM,
    ViewModel, WaterfallRow, WaterfallVM,
)
from tui.waterfall import request_waterfall

T = TypeVar("T")

#: rows in the slowest-requests table
SLOWEST_ROWS = 15

__all__ = [
    "build_view_model", "build_view_model_with_rules", "request_waterfall", "verdict_vm", "latency_vm", "stages_vm",
    "throughput_vm", "gpus_vm", "busy_vm", "slowest_vm", "prepared", "Prepared", "SLOWEST_ROWS",
    "BusyVM",
    "EvidenceVM",
    "FindingVM",
    "GpuVM",
    "LatencyVM",
    "SlowRowVM",
    "StagesVM",
    "StageVM",
    "ThroughputVM",
    "VerdictVM",
    "ViewModel",
    "WaterfallRow",
    "WaterfallVM",
]


# --- the parts ------------------------------------------------------------------------------


def verdict_vm(diagnosis: rules.Diagnosis | None, error: str = "") -> VerdictVM:
    """The rules' :class:`rules.Diagnosis` -> VerdictVM; None means the first run is under way,
    or, with ``error``, that the rules failed (the screen says why and keeps the other panels)."""
    if diagnosis is None:
        if error:
            return VerdictVM(title="no verdict: the rules failed", note=error, failed=True)
        return VerdictVM(title="computing the verdict…", pending=True)
    v = diagnosis.verdict
    explained = f"explains {fmt_explained(v)}" if v.explained_s is not None else ""
    evidence = []
    for e in v.evidence[:6]:
        c = evidence_cells(e)
        evidence.append(EvidenceVM(c.name, c.value, c.threshold, c.meaning, c.mark))
    others = [FindingVM(f.title, f.category, f.confidence, fmt_value(f.explained_pct, Unit.PCT) if f.explained_pct is not None else "")
              for f in diagnosis.findings if f is not v and f.rule_id != v.rule_id][:3]
    return VerdictVM(
        title=v.title,
        category=v.category,
        rule_id=v.rule_id,
        confidence=v.confidence,
        explained=explained,
        evidence=evidence,
        next_checks=list(v.next_checks[:4]),
        note=v.note or "",
        others=others,
        leading=leading_line(diagnosis.leading) or "",
        skipped=[f"{s.rule_id}: {s.reason}" for s in diagnosis.skipped[:6]],
    )


def latency_vm(p: Prepared, rows: np.ndarray | slice, window: tuple[int, int]) -> tuple[LatencyVM, np.ndarray]:
    """TTFT/ITL percentiles and sparklines over the window's rows; returns the ok mask too."""
    ok = p.ok[rows]
    if not len(ok):
        return LatencyVM(), ok
    r = {k: v[rows] for k, v in p.req.items()}
    ttft = r["ttft_s"][ok]
    p50, p95, p99 = percentiles(ttft, [50, 95, 99])
    itl50 = r["itl_p50_s"][ok]
    buckets = Buckets(r["start_ns"][ok], window)
    return LatencyVM(
        requests=int(ok.sum()), errors=int(p.err[rows].sum()), over_context=int(p.over_context[rows].sum()),
        side="client" if bool(np.any(~np.isnan(r["client_ttft_s"][ok]))) else "server",
        ttft_p50_s=p50, ttft_p95_s=p95, ttft_p99_s=p99, itl_p50_s=percentiles(itl50, [50], sample=True)[0],
        itl_p99_s=percentiles(r["itl_p99_s"][ok], [99], sample=True)[0],
        tpot_p50_s=percentiles(r["tpot_s"][ok], [50], sample=True)[0],
        ttft_spark=buckets.agg(ttft), itl_spark=buckets.agg(itl50),
    ), ok


def stages_vm(p: Prepared, rows: np.ndarray | slice, ok: np.ndarray) -> StagesVM:
    """Mean per stage and its share of TTFT (same rule as diag.ground.tables.stage_decomposition)."""
    if not len(ok) or not ok.any():
        return StagesVM(note="no completed requests in the window")
    ttft = p.req["ttft_s"][rows]
    out = []
    for name, col in zip(p.stage_names, p.stage_cols):
        v = col[rows]  # a view when the window is a slice
        have = ok & ~np.isnan(v)
        n = int(np.count_nonzero(have))
        if not n:
            continue
        total = float(np.sum(v, where=have))
        denom = float(np.sum(ttft, where=have))
        share = total / denom if denom > 0 else 0.0
        out.append(StageVM(name, total / n, max(share, 0.0)))
    ttft = ttft[ok]
    note = "" if out else "no stage spans (client-only capture, or the server is not instrumented)"
    covered = sum(s.share for s in out) if out else None
    return StagesVM(out, float(np.mean(ttft)), covered, note)


def throughput_vm(p: Prepared, rows: np.ndarray | slice, srows: np.ndarray | slice, ok: np.ndarray,
                  window: tuple[int, int]) -> ThroughputVM:
    """Token/request throughput from the window's requests; running/waiting/KV from /metrics
    series when present, else from the engine's step spans."""
    lo, hi = window
    width_s = max((hi - lo) / NS, 1e-9)
    out = ThroughputVM()
    if len(ok):
        out.req_per_s = float(ok.sum()) / width_s
        tin = p.req["input_tokens"][rows][ok]
        tout = p.req["output_tokens"][rows][ok]
        out.input_tok_per_s = float(np.nansum(tin)) / width_s if (~np.isnan(tin)).any() else None
        out.output_tok_per_s = float(np.nansum(tout)) / width_s if (~np.isnan(tout)).any() else None
    sv = p.series
    got: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in (stages.SERIES_RUNNING, stages.SERIES_WAITING, stages.SERIES_KV_USAGE, stages.SERIES_PREEMPTIONS,
                 stages.SERIES_PROMPT_TOKENS_PER_S, stages.SERIES_GENERATION_TOKENS_PER_S):
        r = sv.rows(name, window, nvml=False) if sv.n else np.zeros(0, dtype=np.int64)
        if len(r):
            got[name] = (sv.ts_ns[r], sv.val[r])
    src = []
    if stages.SERIES_RUNNING in got or stages.SERIES_WAITING in got or stages.SERIES_KV_USAGE in got:
        src.append("/metrics")
        if stages.SERIES_RUNNING in got:
            out.running = as_float(got[stages.SERIES_RUNNING][1][-1])
        if stages.SERIES_WAITING in got:
            t, v = got[stages.SERIES_WAITING]
            out.waiting = as_float(v[-1])
            out.waiting_spark = bucket_mean(t, v, window)
        if stages.SERIES_KV_USAGE in got:
            t, v = got[stages.SERIES_KV_USAGE]
            out.kv_usage_ratio = as_float(v[-1])
            out.kv_max_ratio = as_float(np.nanmax(v)) if len(v) else None
            out.kv_spark = bucket_mean(t, v, window)
    st = {k: v[srows] for k, v in p.steps.items()}
    if len(st["start_ns"]) and (out.running is None or out.kv_usage_ratio is None):
        src.append("engine steps")
        b = Buckets(st["start_ns"], window)
        if out.running is None:
            out.running = as_float(st["running_seqs"][-1])
            out.waiting = as_float(st["waiting_seqs"][-1])
            out.waiting_spark = b.agg(st["waiting_seqs"])
        if out.kv_usage_ratio is None:
            kv = st["kv_usage_ratio"]
            have = ~np.isnan(kv)
            if have.any():
                out.kv_usage_ratio = as_float(kv[have][-1])
                out.kv_max_ratio = as_float(kv[have].max())
                out.kv_spark = b.agg(kv)
        pre = st["preempted_seqs"]
        if (~np.isnan(pre)).any():
            out.preemptions = float(np.nansum(pre))
    if out.input_tok_per_s is None and stages.SERIES_PROMPT_TOKENS_PER_S in got:
        out.input_tok_per_s = as_float(np.nanmean(got[stages.SERIES_PROMPT_TOKENS_PER_S][1]))
    if out.output_tok_per_s is None and stages.SERIES_GENERATION_TOKENS_PER_S in got:
        out.output_tok_per_s = as_float(np.nanmean(got[stages.SERIES_GENERATION_TOKENS_PER_S][1]))
    if out.preemptions is None and stages.SERIES_PREEMPTIONS in got:
        v = got[stages.SERIES_PREEMPTIONS][1]
        v = v[~np.isnan(v)]
        out.preemptions = float(v[-1] - v[0]) if len(v) > 1 else None
    out.source = " + ".join(src)
    return out


def gpus_vm(sv: SeriesView, window: tuple[int, int]) -> list[GpuVM]:
    """Per GPU: latest value of each counter in the window (NVLink/PCIe summed over links
    and directions), utilisation as a sparkline."""
    if not sv.n:
        return []
    out: dict[str, GpuVM] = {}

    def gpu(entity: str) -> GpuVM:
        g = entity.split("/", 1)[0]
        vm = out.get(g)
        if vm is None:
            vm = out[g] = GpuVM(g)
        return vm

    for name in (stages.SERIES_NVLINK_TX_BYTES_PER_S, stages.SERIES_NVLINK_RX_BYTES_PER_S,
                 stages.SERIES_PCIE_TX_BYTES_PER_S, stages.SERIES_PCIE_RX_BYTES_PER_S):
        for ent, v in sv.last_per_entity(sv.rows(name, window)).items():
            vm = gpu(ent)
            if name.startswith("nvlink"):
                vm.nvlink_bytes_per_s = (vm.nvlink_bytes_per_s or 0.0) + v
            else:
                vm.pcie_bytes_per_s = (vm.pcie_bytes_per_s or 0.0) + v
    for ent, v in sv.last_per_entity(sv.rows(stages.SERIES_HBM_USED_BYTES, window)).items():
        gpu(ent).hbm_used_bytes = v
    for ent, v in sv.last_per_entity(sv.rows(stages.SERIES_HBM_TOTAL_BYTES, window)).items():
        gpu(ent).hbm_total_bytes = v
    for ent, v in sv.last_per_entity(sv.rows(stages.SERIES_MEM_UTIL_PCT, window)).items():
        gpu(ent).membw_pct, gpu(ent).membw_label = v, "mem busy"
    for ent, v in sv.last_per_entity(sv.rows(stages.SERIES_DRAM_BW_UTIL_PCT, window)).items():
        gpu(ent).membw_pct, gpu(ent).membw_label = v, "DRAM bw"
    util_rows = sv.rows(stages.SERIES_GPU_UTIL_PCT, window)
    if len(util_rows):
        codes = sv.e_codes[util_rows]
        for c in np.unique(codes):
            r = util_rows[codes == c]
            vm = gpu(sv.entities[int(c)])
            vm.util_pct = as_float(sv.val[r][-1])
            vm.util_spark = bucket_mean(sv.ts_ns[r], sv.val[r], window)
    return [out[k] for k in sorted(out, key=lambda s: (len(s), s))]


def busy_vm(p: Prepared, srows: np.ndarray | slice, window: tuple[int, int]) -> BusyVM:
    """Engine busy % per bucket from step spans (a step's time counts in its start bucket)."""
    st = {k: v[srows] for k, v in p.steps.items()}
    n = len(st["start_ns"])
    if not n:
        return BusyVM()
    lo, hi = window
    width_s = max((hi - lo) / NS, 1e-9)
    dur = st["duration_s"]
    pre = st["prefill_tokens"]
    b = Buckets(st["start_ns"], window)
    bucket_s = width_s / b.n
    busy = [min(100.0, x / bucket_s * 100) for x in b.agg(dur, how="sum")]
    has_pre = ~np.isnan(pre)
    return BusyVM(
        steps=n,
        busy_pct=min(100.0, float(np.nansum(dur)) / width_s * 100),
        steps_per_s=n / width_s,
        mean_step_s=float(np.nanmean(dur)) if (~np.isnan(dur)).any() else None,
        prefill_step_pct=float(np.mean(pre[has_pre] > 0) * 100) if has_pre.any() else None,
        busy_spark=busy,
        prefill_spark=b.agg(np.nan_to_num(pre), how="sum"),
    )


def slowest_vm(p: Prepared, req: pd.DataFrame, rows: np.ndarray | slice, ok: np.ndarray,
               window: tuple[int, int], n: int = SLOWEST_ROWS) -> list[SlowRowVM]:
    """The ``n`` requests with the highest TTFT in the window (errors listed after them)."""
    if not len(ok):
        return []
    idx_all = np.arange(len(p.ok))[rows]
    key = np.where(ok, p.req["ttft_s"][rows], -np.inf)
    k = min(n, int(ok.sum()))
    pick: list[int] = []
    if k:
        part = np.argpartition(-key, k - 1)[:k]
        pick = [int(idx_all[i]) for i in part[np.argsort(-key[part], kind="stable")]]
    if len(pick) < n:
        errs = idx_all[p.err[rows]]
        pick += [int(i) for i in errs[-(n - len(pick)):]] if len(errs) else []
    out = []
    cols = [c for c in ("trace_id", "request_id", "error") if c in req.columns]
    # the few columns first, then the rows: taking rows of the whole table copies every column
    sub = [dict(zip(cols, vals)) for vals in zip(*(req[c].iloc[pick].tolist() for c in cols))] if cols else \
        [{} for _ in pick]
    for i, rec in zip(pick, sub):
        top, top_s = "", None
        vals = np.array([c[i] for c in p.stage_cols], dtype="float64")
        if len(vals) and (~np.isnan(vals)).any():
            m = int(np.nanargmax(vals))
            top, top_s = p.stage_names[m], float(vals[m])
        err = rec.get("error")
        rid = rec.get("request_id")
        out.append(SlowRowVM(
            trace_id=str(rec.get("trace_id", "")),
            request_id="" if rid is None or (isinstance(rid, float) and np.isnan(rid)) else str(rid),
            ttft_s=as_float(p.req["ttft_s"][i]), top_stage=top, top_stage_s=top_s,
            input_tokens=as_float(p.req["input_tokens"][i]), output_tokens=as_float(p.req["output_tokens"][i]),
            offset_s=((as_float(p.req["start_ns"][i]) or window[0]) - window[0]) / NS,
            error="" if err is None or (isinstance(err, float) and np.isnan(err)) else str(err),
        ))
    return out


def build_view_model_with_rules(snap: Snapshot, slo: dict[str, float] | None = None,
                                rules_file: str | None = None) -> ViewModel:
    """Rules then view model, in one call (headless callers and benchmarks; worker thread)."""
    slo = slo if slo is not None else snap.slo
    run = adapters.run_rules(snap.tables, None if snap.whole else snap.window_ns, slo=slo, rules_file=rules_file)
    return build_view_model(snap, run)


def build_view_model(snap: Snapshot, run: adapters.RulesRun | None = None, stale: bool = False) -> ViewModel:
    """One frame's data work (worker thread): everything but the rules, whose latest result
    (``run``, possibly for an earlier window when ``stale``) is only formatted."""
    t1 = time.perf_counter()
    diagnosis = run.diagnosis if run is not None else None
    window = snap.window_ns
    vm = ViewModel(title=snap.title, live=snap.live, phase=snap.phase,
                   window_label=snap.window_label, window_ns=window,
                   extent_ns=snap.extent_ns, whole=snap.whole, generation=snap.generation,
                   notes=list(snap.notes), errors=list(snap.errors), diagnosis=diagnosis)
    vm.verdict = verdict_vm(diagnosis, run.error if run is not None else "")
    if run is not None:
        vm.verdict.stale = stale
        vm.verdict.scope = run.note
        vm.verdict.rules_ms = run.elapsed_s * 1e3
        if snap.live and run.window_ns is not None:
            vm.verdict.as_of = time.strftime("%H:%M:%S", time.localtime(run.window_ns[1] / NS))
    try:  # the verdict above is painted even when the window's data cannot be prepared
        p = prepared(snap.tables)
        # the whole capture: every row, the population `ttft analyze` describes
        rows = slice(None) if snap.whole else p.req_rows(window)
        srows = slice(None) if snap.whole else p.step_rows(window)
    except Exception as exc:
        vm.errors.append(f"panels failed: {type(exc).__name__}: {str(exc)[:160]}")
        return vm
    empty_ok = np.zeros(0, dtype=bool)
    vm.latency, ok = _part(vm.errors, "latency", lambda: latency_vm(p, rows, window), (LatencyVM(), empty_ok))
    vm.stages = _part(vm.errors, "stages", lambda: stages_vm(p, rows, ok), StagesVM())
    vm.throughput = _part(vm.errors, "throughput", lambda: throughput_vm(p, rows, srows, ok, window), ThroughputVM())
    vm.gpus = _part(vm.errors, "GPU", lambda: gpus_vm(p.series, window), [])
    if not vm.gpus:
        nv = snap.tables.meta.get("nvml") if isinstance(snap.tables.meta, dict) else None
        why = nv.get("note") if isinstance(nv, dict) else None
        vm.gpu_note = str(why) if why else "no GPU counters in this capture: showing the engine's busy timeline"
    vm.busy = _part(vm.errors, "busy", lambda: busy_vm(p, srows, window), BusyVM())
    vm.slowest = _part(vm.errors, "slowest requests", lambda: slowest_vm(p, snap.tables.requests, rows, ok, window), [])
    t2 = time.perf_counter()
    vm.timings_ms = {"view": (t2 - t1) * 1e3, "total": (t2 - t1) * 1e3,
                     "rules": run.elapsed_s * 1e3 if run is not None else float("nan")}
    return vm


def _part(errors: list[str], name: str, fn: Callable[[], T], default: T) -> T:
    """One panel's view model; a panel that fails on data it did not expect says so in
    ``errors`` (shown in red) and shows ``default``, and the other panels are still painted."""
    try:
        return fn()
    except Exception as exc:
        errors.append(f"{name} panel failed: {type(exc).__name__}: {str(exc)[:160]}")
        return default


def is_blank(v: Any) -> bool:
    return not is_num(v)
