"""Snapshot (tables + window) + diagnosis -> a plain view model the widgets only render.

All of a frame's data work happens here, on a worker thread: slicing the window, running the
rules (via :mod:`tui.adapters`; their :class:`rules.Diagnosis` as it is), percentiles,
sparklines, the stage breakdown, throughput, KV,
GPU / engine-busy panels and the slowest requests. The resulting :class:`ViewModel` holds
only plain Python values (str, float, lists), so the UI thread never touches pandas.

Units: durations in seconds (``_s``), rates per second, bytes, percentages in percent
(``_pct``), ratios 0..1 (``_ratio``); timestamps Unix ns (``_ns``).
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

import rules
from diag import stages
from diag.tables import Tables
from diag.report.cells import evidence_cells, fmt_explained
from diag.units import Unit, fmt_value, is_num
from tui import adapters
from tui.sources import Snapshot

NS = 1_000_000_000
#: sparkline buckets across the window
BUCKETS = 48
#: rows in the slowest-requests table
SLOWEST_ROWS = 15
#: stages of the stacked bar, in request order (lumped only appears for external engines)
BAR_STAGES: tuple[str, ...] = stages.DECOMPOSITION_STAGES


@dataclass
class EvidenceVM:
    """An evidence row's cells as every renderer shows them (:mod:`diag.report.cells`)."""

    name: str
    value: str
    threshold: str
    meaning: str
    mark: str = ""  # "✓ crossed", "✗ not crossed" or "" (context row)


@dataclass
class FindingVM:
    title: str
    category: str
    confidence: float
    explained: str


@dataclass
class VerdictVM:
    title: str = "waiting for data…"
    category: str = ""
    rule_id: str = ""
    confidence: float = 0.0
    explained: str = ""
    evidence: list[EvidenceVM] = field(default_factory=list)
    next_checks: list[str] = field(default_factory=list)
    note: str = ""
    others: list[FindingVM] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: the rules failed (``note`` says why): no verdict
    failed: bool = False
    #: no verdict yet (the first rules run is under way)
    pending: bool = False
    #: the verdict is from an earlier window or data; a new one is being computed
    stale: bool = False
    #: how the rules' window differs from the frame's (a sampled window), or ""
    scope: str = ""
    rules_ms: float | None = None
    #: live views: wall-clock time of the data the verdict is over (HH:MM:SS)
    as_of: str = ""


@dataclass
class LatencyVM:
    requests: int = 0
    errors: int = 0
    side: str = ""  # "client" when the client's TTFT is measured, else "server"
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    tpot_p50_s: float | None = None
    ttft_spark: list[float] = field(default_factory=list)  # mean TTFT per bucket, s
    itl_spark: list[float] = field(default_factory=list)  # mean ITL p50 per bucket, s


@dataclass
class StageVM:
    stage: str
    mean_s: float
    share: float  # of TTFT, 0..1


@dataclass
class StagesVM:
    stages: list[StageVM] = field(default_factory=list)
    ttft_mean_s: float | None = None
    covered_share: float | None = None  # sum of shares (≈1 when every stage is traced)
    note: str = ""


@dataclass
class ThroughputVM:
    req_per_s: float | None = None
    input_tok_per_s: float | None = None
    output_tok_per_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_spark: list[float] = field(default_factory=list)
    kv_usage_ratio: float | None = None
    kv_max_ratio: float | None = None
    kv_spark: list[float] = field(default_factory=list)
    preemptions: float | None = None
    source: str = ""  # where running/waiting/KV came from


@dataclass
class GpuVM:
    entity: str
    util_pct: float | None = None
    hbm_used_bytes: float | None = None
    hbm_total_bytes: float | None = None
    membw_pct: float | None = None
    membw_label: str = "mem bw"
    nvlink_bytes_per_s: float | None = None
    pcie_bytes_per_s: float | None = None
    util_spark: list[float] = field(default_factory=list)


@dataclass
class BusyVM:
    """The engine's busy timeline from its step spans (the CPU fallback of the GPU panel)."""

    steps: int = 0
    busy_pct: float | None = None
    steps_per_s: float | None = None
    mean_step_s: float | None = None
    prefill_step_pct: float | None = None
    busy_spark: list[float] = field(default_factory=list)  # busy % per bucket
    prefill_spark: list[float] = field(default_factory=list)  # prefill tokens per bucket


@dataclass
class SlowRowVM:
    trace_id: str
    request_id: str
    ttft_s: float | None
    top_stage: str
    top_stage_s: float | None
    input_tokens: float | None
    output_tokens: float | None
    offset_s: float  # since the window start
    error: str


@dataclass
class ViewModel:
    title: str = ""
    live: bool = False
    phase: str | None = None
    window_label: str | None = None  # how the header names the window (the demo's "this phase")
    window_ns: tuple[int, int] = (0, 0)
    extent_ns: tuple[int, int] = (0, 0)
    whole: bool = False
    generation: int = 0
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    verdict: VerdictVM = field(default_factory=VerdictVM)
    latency: LatencyVM = field(default_factory=LatencyVM)
    stages: StagesVM = field(default_factory=StagesVM)
    throughput: ThroughputVM = field(default_factory=ThroughputVM)
    gpus: list[GpuVM] = field(default_factory=list)
    gpu_note: str = ""
    busy: BusyVM = field(default_factory=BusyVM)
    slowest: list[SlowRowVM] = field(default_factory=list)
    #: time spent in this frame's parts, ms: rules, view, total
    timings_ms: dict[str, float] = field(default_factory=dict)
    diagnosis: rules.Diagnosis | None = None  # kept for the report key (not rendered)


# --- helpers --------------------------------------------------------------------------------


def _f(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if np.isfinite(x) else None


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df.columns or not len(df):
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


#: above this many values, secondary percentiles (ITL, TPOT) use an even-strided sample of
#: this many (TTFT percentiles are always exact)
PCT_SAMPLE = 20_000


def _pct(v: np.ndarray, qs: list[float], sample: bool = False) -> list[float | None]:
    if sample and len(v) > PCT_SAMPLE:
        v = v[:: len(v) // PCT_SAMPLE]
    v = v[~np.isnan(v)]
    if not len(v):
        return [None] * len(qs)
    return [float(x) for x in np.percentile(v, qs)]


def n_buckets(points: int) -> int:
    """Sparkline buckets for ``points`` samples: about two per bucket, 6..BUCKETS."""
    return int(min(BUCKETS, max(6, points // 2)))


class Buckets:
    """Time buckets across the window for one time array (computed once, reused for every
    value array on the same times). ``n`` defaults to :func:`n_buckets` of the sample count."""

    def __init__(self, t_ns: np.ndarray, window: tuple[int, int], n: int | None = None) -> None:
        lo, hi = window
        width = float(max(hi - lo, 1))
        n = n_buckets(len(t_ns)) if n is None else n
        self.n = n
        with np.errstate(invalid="ignore"):
            idx = np.floor((t_ns - lo) * (n / width))
        bad = np.isnan(idx)
        self.idx = np.clip(np.where(bad, 0, idx), 0, n - 1).astype(np.intp)
        self.valid = ~bad
        self._all_valid = not bad.any()
        self._counts: np.ndarray | None = None  # per-bucket counts when every time is valid

    def agg(self, values: np.ndarray, how: str = "mean") -> list[float]:
        """Per-bucket mean (NaN for empty buckets) or sum of ``values`` (NaN values skipped)."""
        nan = np.isnan(values)
        if self._all_valid and not nan.any():  # the common case: no masking, counts computed once
            sums = np.bincount(self.idx, weights=values, minlength=self.n)
            if how == "sum":
                return sums.tolist()
            if self._counts is None:
                self._counts = np.bincount(self.idx, minlength=self.n)
            counts = self._counts
        else:
            ok = self.valid & ~nan
            if not ok.any():
                return [float("nan")] * self.n
            idx = self.idx[ok]
            sums = np.bincount(idx, weights=values[ok], minlength=self.n)
            if how == "sum":
                return sums.tolist()
            counts = np.bincount(idx, minlength=self.n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (sums / counts).tolist()


def _bucket_mean(t_ns: np.ndarray, values: np.ndarray, window: tuple[int, int], n: int | None = None,
                 how: str = "sum_or_mean") -> list[float]:
    """Per-bucket mean of ``values`` at times ``t_ns`` over the window; NaN for empty."""
    return Buckets(t_ns, window, n).agg(values, "sum" if how == "sum" else "mean")


def _range(t: np.ndarray, window: tuple[int, int], is_sorted: bool) -> np.ndarray | slice:
    """Rows with ``window[0] <= t < window[1]``: a slice when ``t`` is sorted, else a mask."""
    lo, hi = window
    if is_sorted:
        a, b = np.searchsorted(t, [lo, hi], side="left")
        return slice(int(a), int(b))
    return (t >= lo) & (t < hi)


def _sorted(t: np.ndarray) -> bool:
    return bool(len(t) < 2 or np.all(t[1:] >= t[:-1]))


class SeriesView:
    """The long-format series, factorized once so each frame's lookups are numpy index
    operations instead of string comparisons over every row. Times in Unix ns."""

    def __init__(self, series: pd.DataFrame) -> None:
        self.n = len(series)
        self.names: dict[str, int] = {}
        self.entities: list[str] = []
        if not self.n:
            return
        s_codes, s_uni = pd.factorize(series["series"].astype(str).to_numpy(dtype=object))
        self.e_codes, e_uni = pd.factorize(series["entity"].astype(str).to_numpy(dtype=object))
        src_codes, src_uni = pd.factorize(series["source"].astype(str).to_numpy(dtype=object))
        self.entities = [str(e) for e in e_uni]
        nvml = [i for i, x in enumerate(src_uni) if str(x) == "nvml"]
        self.is_nvml = np.isin(src_codes, nvml) if nvml else np.zeros(self.n, dtype=bool)
        self.ts_ns = pd.to_numeric(series["ts_s"], errors="coerce").to_numpy(dtype="float64") * NS
        self.val = pd.to_numeric(series["value"], errors="coerce").to_numpy(dtype="float64")
        order = np.argsort(s_codes, kind="stable")
        # within one series, order rows by time (stable: equal times keep file order)
        order = order[np.lexsort((self.ts_ns[order], s_codes[order]))]
        bounds = np.searchsorted(s_codes[order], np.arange(len(s_uni) + 1))
        self.names = {str(name): i for i, name in enumerate(s_uni)}
        self._rows = [order[bounds[i]:bounds[i + 1]] for i in range(len(s_uni))]

    def rows(self, name: str, window: tuple[int, int] | None = None, nvml: bool | None = None) -> np.ndarray:
        """Row indices of one series inside the window, in time order; ``nvml`` filters by source."""
        i = self.names.get(name)
        if i is None:
            return np.zeros(0, dtype=np.int64)
        r = self._rows[i]
        if window is not None and len(r):
            a, b = np.searchsorted(self.ts_ns[r], [window[0], window[1]], side="left")
            r = r[int(a):int(b)]
        if nvml is not None and len(r):
            r = r[self.is_nvml[r] == nvml]
        return r

    def last_per_entity(self, rows: np.ndarray) -> dict[str, float]:
        """Latest value per entity among ``rows`` (time-ordered)."""
        if not len(rows):
            return {}
        codes = self.e_codes[rows][::-1]
        uniq, first = np.unique(codes, return_index=True)
        vals = self.val[rows][::-1][first]
        return {self.entities[int(c)]: float(v) for c, v in zip(uniq, vals)}


class Prepared:
    """Numpy columns of one Tables object, built once per data generation so a frame (a new
    window over the same data) is slicing and arithmetic only. Not thread-safe by itself:
    :func:`prepared` hands it out under a lock and it is read-only afterwards."""

    REQ_COLS = ("start_ns", "ttft_s", "client_ttft_s", "itl_p50_s", "itl_p99_s", "tpot_s", "input_tokens",
                "output_tokens")
    STEP_COLS = ("start_ns", "duration_s", "prefill_tokens", "running_seqs", "waiting_seqs", "kv_usage_ratio",
                 "preempted_seqs")

    def __init__(self, tables: Tables) -> None:
        req = tables.requests
        self.req = {c: _col(req, c) for c in self.REQ_COLS}
        n = len(req)
        err = req["error"].notna().to_numpy() if "error" in req.columns and n else np.zeros(n, dtype=bool)
        if "error" in req.columns and n and bool(err.any()):
            err &= req["error"].astype(str).str.len().to_numpy() > 0
        warm = (req["warmup"].fillna(False).astype(bool).to_numpy() if "warmup" in req.columns and n
                else np.zeros(n, dtype=bool))
        self.err = err
        self.ok = ~err & ~warm & ~np.isnan(self.req["ttft_s"])
        self.stage_names = [st for st in BAR_STAGES if stages.stage_column(st) in req.columns]
        #: one contiguous array per stage (column-wise work is 2x faster than a row-major matrix)
        self.stage_cols = [_col(req, stages.stage_column(st)) for st in self.stage_names]
        self.req_sorted = _sorted(self.req["start_ns"])
        steps = tables.steps
        self.steps = {c: _col(steps, c) for c in self.STEP_COLS}
        self.steps_sorted = _sorted(self.steps["start_ns"])
        self.n_steps = len(steps)
        self.series = SeriesView(tables.series)

    def req_rows(self, window: tuple[int, int]) -> np.ndarray | slice:
        return _range(self.req["start_ns"], window, self.req_sorted)

    def step_rows(self, window: tuple[int, int]) -> np.ndarray | slice:
        return _range(self.steps["start_ns"], window, self.steps_sorted)


_PREP_LOCK = threading.Lock()
_PREP: tuple[Any, Prepared] | None = None  # (weakref to the Tables, its Prepared)


def prepared(tables: Tables) -> Prepared:
    """The cached :class:`Prepared` of ``tables`` (one entry: the tables of the last frame)."""
    global _PREP
    with _PREP_LOCK:
        if _PREP is not None and _PREP[0]() is tables:
            return _PREP[1]
        prep = Prepared(tables)
        _PREP = (weakref.ref(tables), prep)
        return prep


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
        skipped=[f"{s.rule_id}: {s.reason}" for s in diagnosis.skipped[:6]],
    )


def latency_vm(p: Prepared, rows: np.ndarray | slice, window: tuple[int, int]) -> tuple[LatencyVM, np.ndarray]:
    """TTFT/ITL percentiles and sparklines over the window's rows; returns the ok mask too."""
    ok = p.ok[rows]
    if not len(ok):
        return LatencyVM(), ok
    r = {k: v[rows] for k, v in p.req.items()}
    ttft = r["ttft_s"][ok]
    p50, p95, p99 = _pct(ttft, [50, 95, 99])
    itl50 = r["itl_p50_s"][ok]
    buckets = Buckets(r["start_ns"][ok], window)
    return LatencyVM(
        requests=int(ok.sum()), errors=int(p.err[rows].sum()),
        side="client" if bool(np.any(~np.isnan(r["client_ttft_s"][ok]))) else "server",
        ttft_p50_s=p50, ttft_p95_s=p95, ttft_p99_s=p99, itl_p50_s=_pct(itl50, [50], sample=True)[0],
        itl_p99_s=_pct(r["itl_p99_s"][ok], [99], sample=True)[0],
        tpot_p50_s=_pct(r["tpot_s"][ok], [50], sample=True)[0],
        ttft_spark=buckets.agg(ttft), itl_spark=buckets.agg(itl50),
    ), ok


def stages_vm(p: Prepared, rows: np.ndarray | slice, ok: np.ndarray) -> StagesVM:
    """Mean per stage and its share of TTFT (same rule as diag.tables.stage_decomposition)."""
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
            out.running = _f(got[stages.SERIES_RUNNING][1][-1])
        if stages.SERIES_WAITING in got:
            t, v = got[stages.SERIES_WAITING]
            out.waiting = _f(v[-1])
            out.waiting_spark = _bucket_mean(t, v, window)
        if stages.SERIES_KV_USAGE in got:
            t, v = got[stages.SERIES_KV_USAGE]
            out.kv_usage_ratio = _f(v[-1])
            out.kv_max_ratio = _f(np.nanmax(v)) if len(v) else None
            out.kv_spark = _bucket_mean(t, v, window)
    st = {k: v[srows] for k, v in p.steps.items()}
    if len(st["start_ns"]) and (out.running is None or out.kv_usage_ratio is None):
        src.append("engine steps")
        b = Buckets(st["start_ns"], window)
        if out.running is None:
            out.running = _f(st["running_seqs"][-1])
            out.waiting = _f(st["waiting_seqs"][-1])
            out.waiting_spark = b.agg(st["waiting_seqs"])
        if out.kv_usage_ratio is None:
            kv = st["kv_usage_ratio"]
            have = ~np.isnan(kv)
            if have.any():
                out.kv_usage_ratio = _f(kv[have][-1])
                out.kv_max_ratio = _f(kv[have].max())
                out.kv_spark = b.agg(kv)
        pre = st["preempted_seqs"]
        if (~np.isnan(pre)).any():
            out.preemptions = float(np.nansum(pre))
    if out.input_tok_per_s is None and stages.SERIES_PROMPT_TOKENS_PER_S in got:
        out.input_tok_per_s = _f(np.nanmean(got[stages.SERIES_PROMPT_TOKENS_PER_S][1]))
    if out.output_tok_per_s is None and stages.SERIES_GENERATION_TOKENS_PER_S in got:
        out.output_tok_per_s = _f(np.nanmean(got[stages.SERIES_GENERATION_TOKENS_PER_S][1]))
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
            vm.util_pct = _f(sv.val[r][-1])
            vm.util_spark = _bucket_mean(sv.ts_ns[r], sv.val[r], window)
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
            ttft_s=_f(p.req["ttft_s"][i]), top_stage=top, top_stage_s=top_s,
            input_tokens=_f(p.req["input_tokens"][i]), output_tokens=_f(p.req["output_tokens"][i]),
            offset_s=((_f(p.req["start_ns"][i]) or window[0]) - window[0]) / NS,
            error="" if err is None or (isinstance(err, float) and np.isnan(err)) else str(err),
        ))
    return out


def build_view_model_with_rules(snap: Snapshot, slo: dict[str, float] | None = None,
                                rules_file: str | None = None) -> ViewModel:
    """Rules then view model, in one call (headless callers and benchmarks; worker thread)."""
    run = adapters.run_rules(snap.tables, snap.window_ns, slo=slo, rules_file=rules_file)
    return build_view_model(snap, run)


def build_view_model(snap: Snapshot, run: adapters.RulesRun | None = None, stale: bool = False) -> ViewModel:
    """One frame's data work (worker thread): everything but the rules, whose latest result
    (``run``, possibly for an earlier window when ``stale``) is only formatted."""
    t1 = time.perf_counter()
    diagnosis = run.diagnosis if run is not None else None
    p = prepared(snap.tables)
    window = snap.window_ns
    rows = p.req_rows(window)
    srows = p.step_rows(window)
    vm = ViewModel(title=snap.title, live=snap.live, phase=snap.phase,
                   window_label=getattr(snap, "window_label", None), window_ns=window,
                   extent_ns=snap.extent_ns, whole=snap.whole, generation=snap.generation,
                   notes=list(snap.notes), errors=list(snap.errors), diagnosis=diagnosis)
    vm.verdict = verdict_vm(diagnosis, run.error if run is not None else "")
    if run is not None:
        vm.verdict.stale = stale
        vm.verdict.scope = run.note
        vm.verdict.rules_ms = run.elapsed_s * 1e3
        if snap.live and run.window_ns is not None:
            vm.verdict.as_of = time.strftime("%H:%M:%S", time.localtime(run.window_ns[1] / NS))
    vm.latency, ok = latency_vm(p, rows, window)
    vm.stages = stages_vm(p, rows, ok)
    vm.throughput = throughput_vm(p, rows, srows, ok, window)
    vm.gpus = gpus_vm(p.series, window)
    if not vm.gpus:
        nv = snap.tables.meta.get("nvml") if isinstance(snap.tables.meta, dict) else None
        why = nv.get("note") if isinstance(nv, dict) else None
        vm.gpu_note = str(why) if why else "no GPU counters in this capture: showing the engine's busy timeline"
    vm.busy = busy_vm(p, srows, window)
    vm.slowest = slowest_vm(p, snap.tables.requests, rows, ok, window)
    t2 = time.perf_counter()
    vm.timings_ms = {"view": (t2 - t1) * 1e3, "total": (t2 - t1) * 1e3,
                     "rules": run.elapsed_s * 1e3 if run is not None else float("nan")}
    return vm


# --- one request's waterfall ----------------------------------------------------------------


@dataclass
class WaterfallRow:
    name: str
    depth: int
    start_s: float  # offset from the request's first span
    duration_s: float
    service: str


@dataclass
class WaterfallVM:
    trace_id: str
    title: str
    rows: list[WaterfallRow] = field(default_factory=list)
    total_s: float = 0.0
    first_token_s: float | None = None  # offset of the first token (TTFT boundary)
    token_offsets_s: list[float] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)


def request_waterfall(tables: Tables, trace_id: str) -> WaterfallVM:
    """The spans of one trace as waterfall rows (worker thread; scans the span table once)."""
    spans = tables.spans
    vm = WaterfallVM(trace_id, f"request {trace_id[:16]}")
    req = tables.requests
    row = req.loc[req["trace_id"].astype(str) == trace_id] if len(req) else req
    if len(row):
        r = row.iloc[0]
        vm.title = f"request {r.get('request_id') or trace_id[:16]}"
        for label, key, unit in (("TTFT", "ttft_s", "s"), ("server TTFT", "server_ttft_s", "s"),
                                 ("client TTFT", "client_ttft_s", "s"), ("e2e", "e2e_s", "s"),
                                 ("input tokens", "input_tokens", ""), ("output tokens", "output_tokens", ""),
                                 ("ITL p50", "itl_p50_s", "s"), ("ITL p99", "itl_p99_s", "s"),
                                 ("preemptions", "preemptions", ""), ("segment", "segment", None),
                                 ("error", "error", None)):
            v = r.get(key)
            if v is None or (isinstance(v, float) and np.isnan(v)):
                continue
            vm.facts.append((label, fmt_value(v, unit) if unit is not None else str(v)))
    if not len(spans):
        return vm
    mine = spans.loc[spans["trace_id"].astype(str) == trace_id]
    if not len(mine):
        return vm
    t0 = int(mine["start_ns"].min())
    vm.total_s = (int(mine["end_ns"].max()) - t0) / NS
    ids = mine["span_id"].astype(str).tolist()
    parents = dict(zip(ids, mine["parent_span_id"].astype(str).tolist()))

    def depth(sid: str) -> int:
        d, seen = 0, set()
        while parents.get(sid) in parents and sid not in seen:
            seen.add(sid)
            sid = parents[sid]
            d += 1
        return d

    order = mine.sort_values(["start_ns", "end_ns"], ascending=[True, False])
    for _, s in order.iterrows():
        vm.rows.append(WaterfallRow(str(s["name"]), depth(str(s["span_id"])), (int(s["start_ns"]) - t0) / NS,
                                    (int(s["end_ns"]) - int(s["start_ns"])) / NS, str(s.get("service", ""))))
    if len(row):
        r = row.iloc[0]
        first = _f(r.get("client_first_content_ns")) if "client_first_content_ns" in row.columns else None
        if first is None:
            first = _f(r.get("first_token_ns"))
        if first is not None:
            vm.first_token_s = (first - t0) / NS
    tt_key = stages.ATTR_TOKEN_TIMES_NS
    if tt_key in mine.columns:
        for v in mine[tt_key].dropna():
            if isinstance(v, (list, tuple, np.ndarray)) and len(v):
                vm.token_offsets_s = [(float(x) - t0) / NS for x in v]
                break
    return vm


def is_blank(v: Any) -> bool:
    return not is_num(v)
