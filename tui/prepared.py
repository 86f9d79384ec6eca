"""A capture's tables as numpy columns, built once per data generation, and the time buckets
of the sparklines; a frame (a new window over the same data) is then slicing and arithmetic.

Threading: :func:`prepared` hands out one cached :class:`Prepared` under a lock; it is
read-only afterwards, so worker threads share it. Times are Unix ns.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.tables import Tables
from diag.ground.units import as_float  # noqa: F401  (the view model imports it from here)
from rules.features.populations import experiment_limit_rows

NS = 1_000_000_000
#: sparkline buckets across the window
BUCKETS = 48
#: stages of the stacked bar, in request order (lumped only appears for external engines)
BAR_STAGES: tuple[str, ...] = stages.DECOMPOSITION_STAGES



def num_column(df: pd.DataFrame, name: str) -> np.ndarray:
    """A column as float64 (NaN where missing or not a number; all NaN when absent)."""
    if name not in df.columns or not len(df):
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


#: above this many values, secondary percentiles (ITL, TPOT) use an even-strided sample of
#: this many (TTFT percentiles are always exact)
PCT_SAMPLE = 20_000


def percentiles(v: np.ndarray, qs: list[float], sample: bool = False) -> list[float | None]:
    """The ``qs`` percentiles of the non-NaN values (None each when there are none)."""
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


def bucket_mean(t_ns: np.ndarray, values: np.ndarray, window: tuple[int, int], n: int | None = None,
                 how: str = "sum_or_mean") -> list[float]:
    """Per-bucket mean of ``values`` at times ``t_ns`` over the window; NaN for empty."""
    return Buckets(t_ns, window, n).agg(values, "sum" if how == "sum" else "mean")


def window_rows(t: np.ndarray, window: tuple[int, int], is_sorted: bool) -> np.ndarray | slice:
    """Rows with ``window[0] <= t < window[1]``: a slice when ``t`` is sorted, else a mask."""
    lo, hi = window
    if is_sorted:
        a, b = np.searchsorted(t, [lo, hi], side="left")
        return slice(int(a), int(b))
    return (t >= lo) & (t < hi)


def is_sorted(t: np.ndarray) -> bool:
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
        self.req = {c: num_column(req, c) for c in self.REQ_COLS}
        n = len(req)
        err = req["error"].notna().to_numpy() if "error" in req.columns and n else np.zeros(n, dtype=bool)
        if "error" in req.columns and n and bool(err.any()):
            err = err & (req["error"].astype(str).str.len().to_numpy() > 0)  # to_numpy() may be read-only
        warm = (req["warmup"].fillna(False).astype(bool).to_numpy() if "warmup" in req.columns and n
                else np.zeros(n, dtype=bool))
        #: refused at a designed experiment's context limit: the probe's own limit, not an error
        self.over_context = (experiment_limit_rows(req, tables.meta).to_numpy(dtype=bool) if n
                             else np.zeros(n, dtype=bool))
        err = err & ~self.over_context
        self.err = err
        self.ok = ~err & ~warm & ~np.isnan(self.req["ttft_s"])
        self.stage_names = [st for st in BAR_STAGES if stages.stage_column(st) in req.columns]
        #: one contiguous array per stage (column-wise work is 2x faster than a row-major matrix)
        self.stage_cols = [num_column(req, stages.stage_column(st)) for st in self.stage_names]
        self.req_sorted = is_sorted(self.req["start_ns"])
        steps = tables.steps
        self.steps = {c: num_column(steps, c) for c in self.STEP_COLS}
        self.steps_sorted = is_sorted(self.steps["start_ns"])
        self.n_steps = len(steps)
        self.series = SeriesView(tables.series)

    def req_rows(self, window: tuple[int, int]) -> np.ndarray | slice:
        return window_rows(self.req["start_ns"], window, self.req_sorted)

    def step_rows(self, window: tuple[int, int]) -> np.ndarray | slice:
        return window_rows(self.steps["start_ns"], window, self.steps_sorted)


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
