"""Features: the numbers the triage rules read, computed once per capture (or time window).

Front door: :func:`compute_features` (tables -> :class:`Features`). Pure pandas/numpy, no I/O,
vectorised over spans and token gaps (per-request Python work is bounded to a few dozen
cold-start candidates). Every feature says whether it could be computed and, when not, why
(``Feature.reason``), so a rule can answer "skipped: needs …" instead of passing silently.

Populations:

* *ok* requests: not warm-up, no error, with a TTFT.
* *steady* requests: ok minus cold-start outliers (the first request(s) far above the rest);
  TTFT percentiles, stage shares and fits are on the steady population. Cold-start outliers
  are reported apart (``cold_start_*``) and never counted as TTFT.

Units are in the names: ``_s`` seconds, ``_ms`` milliseconds, ``_frac``/``_share``/``_ratio``
unitless (0..1 for fractions), ``_n`` counts, ``_pct`` percent.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diag import stages
from diag.tables import Tables

NS = 1e9

#: Parameters of the feature computations (rules' ``[features]`` table overrides them).
DEFAULT_PARAMS: dict[str, float] = {
    "tail_quantile": 0.95,  # "slowest 5%": requests with TTFT >= this quantile
    "median_band": 0.10,  # requests within +-10 percentile points of the median TTFT
    "queue_small_frac": 0.10,  # a request "did not queue" when queue_s <= this x its TTFT
    "min_fit_requests": 5,  # fewest requests for a prompt-length fit
    "min_bin_requests": 3,  # fewest requests in an in-flight bin
    "max_inflight_bins": 12,
    "flat_factor": 1.5,  # the TTFT-vs-concurrency curve is "flat" while <= this x its base
    "knee_sharpness": 1.8,  # a knee step this many times steeper than every step before it is a cliff
    "cold_start_factor": 3.0,  # a first request is a cold-start outlier above this x the rest
    "kv_high_ratio": 0.90,  # KV usage counted as "near capacity"
    "min_itl_gaps": 20,  # fewest token gaps per group for the interference comparison
}


@dataclass
class Feature:
    """One measured quantity. ``value`` is a float, a dict (a small table) or None.

    ``available`` is False when it cannot be computed; ``reason`` then says why (one line).
    ``source`` names where it came from when there are several ways (e.g. "nvml", "engine_steps").
    """

    name: str
    value: float | dict[str, Any] | None
    unit: str
    available: bool
    reason: str | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": _jsonable(self.value), "unit": self.unit, "available": self.available}
        if self.reason:
            out["reason"] = self.reason
        if self.source:
            out["source"] = self.source
        return out


@dataclass
class Features:
    """A mapping name -> :class:`Feature` with convenience accessors."""

    items: dict[str, Feature] = field(default_factory=dict)

    def add(self, feature: Feature) -> None:
        self.items[feature.name] = feature

    def get(self, name: str) -> Feature:
        """The feature, or an unavailable placeholder saying it was not computed."""
        f = self.items.get(name)
        if f is None:
            return Feature(name, None, "", False, "not computed for this capture")
        return f

    def value(self, name: str, default: Any = None) -> Any:
        f = self.items.get(name)
        if f is None or not f.available or f.value is None:
            return default
        return f.value

    def available(self, name: str) -> bool:
        f = self.items.get(name)
        return bool(f is not None and f.available and f.value is not None)

    def __contains__(self, name: object) -> bool:
        return name in self.items

    def __getitem__(self, name: str) -> Feature:
        return self.items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def to_dict(self) -> dict[str, Any]:
        return {k: f.to_dict() for k, f in self.items.items()}


# --- small helpers --------------------------------------------------------------------------


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def _f(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce").astype("float64")
    return pd.Series(np.nan, index=df.index, dtype="float64")


def _bool_col(df: pd.DataFrame, name: str, default: bool = False) -> pd.Series:
    if name in df.columns:
        return df[name].fillna(default).astype(bool)
    return pd.Series(default, index=df.index, dtype=bool)


def _pct(values: np.ndarray | pd.Series, q: float) -> float | None:
    arr = np.asarray(values, dtype="float64")
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q))


def _name_is(spans: pd.DataFrame, name: str) -> np.ndarray:
    """Boolean mask of spans with this name; compares categorical codes, never casts 1M names to str."""
    col = spans["name"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        if name not in cats:
            return np.zeros(len(col), dtype=bool)
        return col.cat.codes.to_numpy() == cats.get_loc(name)
    return (col.astype(str) == name).to_numpy()


def _merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals (any order) as sorted disjoint intervals."""
    if start.size == 0:
        return start.astype("float64"), end.astype("float64")
    order = np.argsort(start, kind="stable")
    s = start[order].astype("float64")
    e = end[order].astype("float64")
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    ms = s[idx]
    me = np.maximum.reduceat(run_end, idx) if idx.size else run_end[:0]
    return ms, me


class _Coverage:
    """Time covered by a set of intervals between any a and b, O(log n) per query (vectorised)."""

    def __init__(self, start: np.ndarray, end: np.ndarray) -> None:
        self.s, self.e = _merge_intervals(np.asarray(start, dtype="float64"), np.asarray(end, dtype="float64"))
        self.cum = np.concatenate([[0.0], np.cumsum(self.e - self.s)])

    def upto(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype="float64")
        if self.s.size == 0:
            return np.zeros_like(t)
        i = np.searchsorted(self.s, t, side="right")  # intervals starting at or before t
        prev = np.maximum(i - 1, 0)
        full = self.cum[prev]
        partial = np.clip(t - self.s[prev], 0.0, (self.e - self.s)[prev])
        return np.where(i > 0, full + partial, 0.0)

    def between(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.upto(b) - self.upto(a)

    @property
    def total(self) -> float:
        return float(self.cum[-1])


_SEG_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (col, re.compile(rf"(?i)(?:^|[\s,;/_-])(?:{key})\s*[=:]\s*([0-9.]+)"))
    for key, col in (("prompt|input", "prompt"), ("conc|concurrency|c", "conc"), ("tp", "tp"))
)


def _parse_segment(label: str) -> tuple[float, float, float]:
    out = []
    for _, pat in _SEG_PATTERNS:
        m = pat.search(label)
        try:
            out.append(float(m.group(1)) if m else math.nan)
        except ValueError:
            out.append(math.nan)
    return out[0], out[1], out[2]


def _segment_numbers(segments: pd.Series) -> pd.DataFrame:
    """Parse sweep labels such as ``prompt=512`` / ``concurrency=8`` / ``tp=2`` into numeric columns.

    Parses each distinct label once (a capture has a handful), then maps.
    """
    out = pd.DataFrame(np.nan, index=segments.index, columns=["prompt", "conc", "tp"], dtype="float64")
    if segments.empty:
        return out
    obj = segments.to_numpy(dtype=object)
    labels = pd.unique(obj)
    parsed = {lab: _parse_segment(lab) for lab in labels if isinstance(lab, str) and lab}
    if not parsed:
        return out
    codes = pd.Index(list(parsed), dtype=object).get_indexer(obj)
    table = np.array([parsed[k] for k in parsed], dtype="float64")
    vals = np.where((codes >= 0)[:, None], table[np.maximum(codes, 0)], np.nan)
    out.loc[:, ["prompt", "conc", "tp"]] = vals
    return out


def _linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least squares y = a + b x: (slope b, intercept a, R²)."""
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    sxy = float(((x - xm) * (y - ym)).sum())
    slope = sxy / sxx if sxx > 0 else 0.0
    intercept = float(ym - slope * xm)
    ss_tot = float(((y - ym) ** 2).sum())
    ss_res = float(((y - (intercept + slope * x)) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    return slope, intercept, r2


# --- the computation ------------------------------------------------------------------------


class _Builder:
    """Holds the inputs and accumulates features; one method per theme."""

    def __init__(self, tables: Tables, window_ns: tuple[int, int] | None, slo: Mapping[str, float] | None,
                 params: Mapping[str, float] | None) -> None:
        self.t = tables
        self.window = window_ns
        self.slo = dict(slo or {})
        self.p = {**DEFAULT_PARAMS, **(params or {})}
        self.f = Features()
        req = tables.requests if tables.requests is not None else pd.DataFrame()
        steps = tables.steps if tables.steps is not None else pd.DataFrame()
        series = tables.series if tables.series is not None else pd.DataFrame()
        if window_ns is not None and len(req):
            a, b = window_ns
            st = _col(req, "start_ns")
            req = req.loc[(st >= a) & (st < b)]
        if window_ns is not None and len(steps) and "start_ns" in steps.columns:
            a, b = window_ns
            steps = steps.loc[(steps["end_ns"] > a) & (steps["start_ns"] < b)]
        if window_ns is not None and len(series) and "ts_s" in series.columns:
            a, b = window_ns
            ts = pd.to_numeric(series["ts_s"], errors="coerce")
            series = series.loc[(ts >= a / NS) & (ts < b / NS)]
        self.req_all = req.reset_index(drop=True)
        self.steps = steps.reset_index(drop=True)
        self.series = series
        self.spans = tables.spans if tables.spans is not None else pd.DataFrame()
        self.meta = tables.meta or {}

    # -- helpers --
    def add(self, name: str, value: Any, unit: str, reason: str | None = None, source: str | None = None) -> None:
        if isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, bool):
            value = _f(value)
        ok = value is not None and reason is None
        self.f.add(Feature(name, _jsonable(value) if ok else None, unit, ok, None if ok else (reason or "no data"), source))

    def na(self, names: list[tuple[str, str]], reason: str) -> None:
        for name, unit in names:
            self.f.add(Feature(name, None, unit, False, reason))

    def series_values(self, name: str, source: str | None = None) -> pd.DataFrame:
        s = self.series
        if s is None or s.empty or "series" not in s.columns:
            return pd.DataFrame(columns=list(stages.SERIES_COLUMNS))
        m = s["series"].astype(str) == name
        if source is not None:
            m &= s["source"].astype(str) == source
        out = s.loc[m]
        return out.loc[pd.to_numeric(out["value"], errors="coerce").notna()]

    def _weighted(self, name: str, weight: str | None = None) -> pd.DataFrame:
        """Rows of series ``name`` as (entity, value, w): ``w`` is the matching ``weight`` row's value
        (same scrape, same entity), or 1.0 for every row when the weight series does not cover them all."""
        s = self.series_values(name)
        if s.empty:
            return pd.DataFrame({"entity": pd.Series(dtype=object), "value": pd.Series(dtype="float64"),
                                 "w": pd.Series(dtype="float64")})
        out = pd.DataFrame({"ts_s": pd.to_numeric(s["ts_s"], errors="coerce").to_numpy(),
                            "entity": s["entity"].astype(str).to_numpy(),
                            "value": pd.to_numeric(s["value"], errors="coerce").to_numpy(dtype="float64")})
        out = out.loc[np.isfinite(out["value"])]
        w = np.ones(len(out))
        if weight is not None:
            ws = self.series_values(weight)
            if len(ws):
                wdf = pd.DataFrame({"ts_s": pd.to_numeric(ws["ts_s"], errors="coerce").to_numpy(),
                                    "entity": ws["entity"].astype(str).to_numpy(),
                                    "w": pd.to_numeric(ws["value"], errors="coerce").to_numpy(dtype="float64")})
                wdf = wdf.drop_duplicates(["ts_s", "entity"], keep="last")
                m = out[["ts_s", "entity"]].merge(wdf, how="left", on=["ts_s", "entity"])["w"].to_numpy(dtype="float64")
                if len(m) and np.isfinite(m).all() and (m >= 0).all() and m.sum() > 0:
                    w = m
        out = out.assign(w=w)
        return out.loc[out["w"] > 0, ["entity", "value", "w"]]

    def _wmean(self, name: str, weight: str | None = None) -> float | None:
        """Weighted mean of a series' windowed values (weights: see :meth:`_weighted`); None when absent."""
        d = self._weighted(name, weight)
        if d.empty:
            return None
        return float(np.average(d["value"].to_numpy(), weights=d["w"].to_numpy()))

    # -- engine metrics (canonical /metrics series) --
    def engine_metrics(self) -> None:
        """Engine-wide numbers from the canonical series of ``collectors.prometheus_adapters``.

        Windowed means (``queue_time_s``, ``ttft_s``, ...) are weighted by the requests in each
        scrape window (``requests_per_s`` x window length) when the engine exports a request
        count, else every window counts the same. Always computed; the request-level features
        fall back to them only when no request has a TTFT (:meth:`series_fallback`).
        """
        S = stages
        rate_series = (S.SERIES_REQUESTS_PER_S, S.SERIES_TTFT_S, S.SERIES_QUEUE_TIME_S, S.SERIES_PREFILL_TIME_S,
                       S.SERIES_ITL_S, S.SERIES_PREFILL_BUSY, S.SERIES_PROMPT_TOKENS_PER_S,
                       S.SERIES_GENERATION_TOKENS_PER_S)
        ts = [pd.to_numeric(self.series_values(n)["ts_s"], errors="coerce") for n in rate_series]
        windows = pd.concat(ts).dropna().unique() if any(len(t) for t in ts) else np.array([])
        self.add("metrics_windows_n", float(len(windows)), "scrape windows")
        src = "prometheus"
        # requests in each window: requests_per_s x the time since the entity's previous scrape
        rq = self.series_values(S.SERIES_REQUESTS_PER_S)
        if len(rq):
            allrows = self.series.loc[self.series["source"].astype(str) == str(rq["source"].iloc[0])]
            all_ts = pd.DataFrame({"entity": allrows["entity"].astype(str).to_numpy(),
                                   "ts_s": pd.to_numeric(allrows["ts_s"], errors="coerce").to_numpy()}).dropna()
            prev: dict[tuple[str, float], float] = {}
            for ent, g in all_ts.drop_duplicates().groupby("entity"):
                t = np.sort(g["ts_s"].to_numpy())
                for a, b in zip(t[:-1], t[1:]):
                    prev[(str(ent), float(b))] = float(b - a)
            ents = rq["entity"].astype(str).to_numpy()
            tsv = pd.to_numeric(rq["ts_s"], errors="coerce").to_numpy(dtype="float64")
            dt = np.array([prev.get((e, float(t)), np.nan) for e, t in zip(ents, tsv)])
            n = pd.to_numeric(rq["value"], errors="coerce").to_numpy(dtype="float64") * dt
            self.add("metrics_requests_n", float(np.nansum(n)) if np.isfinite(n).any() else None, "requests",
                     None if np.isfinite(n).any() else "no window length for the requests_per_s series", source=src)
        else:
            self.add("metrics_requests_n", None, "requests",
                     "the engine exports no request count (no requests_per_s series from a TTFT/queue histogram)")
        w = S.SERIES_REQUESTS_PER_S
        ttft = self._wmean(S.SERIES_TTFT_S, w)
        queue = self._wmean(S.SERIES_QUEUE_TIME_S, w)
        pre = self._wmean(S.SERIES_PREFILL_TIME_S, w)
        no = "no {} series (the engine's {} histogram)"
        self.add("metrics_ttft_mean_s", ttft, "s", None if ttft is not None else no.format("ttft_s", "TTFT"), source=src)
        self.add("metrics_queue_time_mean_s", queue, "s",
                 None if queue is not None else no.format("queue_time_s", "queue-time"), source=src)
        q95 = self._wmean(stages.SERIES_QUEUE_TIME_S + "_p95", w)
        self.add("metrics_queue_time_p95_s", q95, "s",
                 None if q95 is not None else "no queue_time_s_p95 series (queue-time histogram buckets)", source=src)
        self.add("metrics_prefill_time_mean_s", pre, "s",
                 None if pre is not None else no.format("prefill_time_s", "prefill-time"), source=src)
        for stage, mean, feat in ((stages.QUEUE, queue, "metrics_queue_share"), (stages.PREFILL, pre, "metrics_prefill_share")):
            share = mean / ttft if (mean is not None and ttft is not None and ttft > 0) else None
            self.add(feat, share, "ratio of TTFT",
                     None if share is not None else f"needs {stage} and TTFT means from the engine's metrics", source=src)
        # engine busy with prompts / tokens (llama.cpp's prompt seconds, TGI's batch step sums).
        # llama.cpp adds a request's prompt seconds when its prompt is done (one window may hold
        # 3 s/s, its neighbours 0), and sums its slots, which share one batched forward: so the
        # run's mean per replica is clipped at 1 s/s (always busy), never read as "4x busy"
        for series, feat in ((S.SERIES_PREFILL_BUSY, "prefill_busy_ratio"), (S.SERIES_DECODE_BUSY, "decode_busy_ratio")):
            d = self._weighted(series)
            if len(d):  # time mean per entity (replica), clipped, then the mean over entities
                per_entity = d.groupby("entity")["value"].mean()
                val = float(per_entity.clip(upper=1.0).mean())
                self.add(feat, val, "s busy per s", source=src + ("; above 1 s/s (slots summed) clipped at 1"
                                                                  if bool((per_entity > 1.0).any()) else ""))
            else:
                self.add(feat, None, "s busy per s", f"no {series} series (engine counters of busy seconds)")
        spt = self._wmean(S.SERIES_PREFILL_S_PER_TOKEN, S.SERIES_PROMPT_TOKENS_PER_S)
        self.add("prefill_s_per_token", spt, "s/token", None if spt is not None else
                 "no prefill_s_per_token series (engine counters of prompt seconds and prompt tokens)", source=src)
        ptps = self._wmean(S.SERIES_PROMPT_TOKENS_PER_S)
        self.add("prompt_tokens_per_s", ptps, "tokens/s", None if ptps is not None else "no prompt_tokens_per_s series",
                 source=src)
        # no request has a TTFT, but the engine's metrics describe the run: the series-only mode
        total = int(self.f.value("requests_total_n", 0) or 0)
        failed = int(self.f.value("requests_failed_n", 0) or 0)
        all_failed = total > 0 and failed == total
        have = any(len(self.series_values(n)) for n in (S.SERIES_TTFT_S, S.SERIES_QUEUE_TIME_S, S.SERIES_PREFILL_TIME_S,
                                                         S.SERIES_ITL_S, S.SERIES_PREFILL_BUSY, S.SERIES_KV_USAGE,
                                                         S.SERIES_PREEMPTIONS, S.SERIES_WAITING))
        self.series_only = len(self.steady) == 0 and not all_failed and have and len(windows) > 0
        self.add("series_only", 1.0 if self.series_only else 0.0, "bool",
                 source="from engine metrics only, no per-request spans" if self.series_only else None)

    def series_fallback(self) -> None:
        """Series-only mode: TTFT percentiles, stage shares and the request count from the engine's
        metrics (source "prometheus"). Never replaces a feature computed from requests."""
        if not self.series_only:
            return
        S = stages
        src = "prometheus"
        w = S.SERIES_REQUESTS_PER_S
        n = self.f.value("metrics_requests_n")
        if n is not None:
            self.add("requests_n", float(round(n)), "requests", source=src)
        else:
            self.add("requests_n", None, "requests", self.f.get("metrics_requests_n").reason)
        # TTFT percentiles: request-weighted mean of the windowed percentiles (histogram bucket
        # deltas); without buckets (TTFT derived from means, e.g. TGI) percentiles of the window means
        for q in (50, 95, 99):
            name = f"ttft_p{q}_s"
            val = self._wmean(f"{S.SERIES_TTFT_S}_p{q}", w)
            if val is None:
                means = pd.to_numeric(self.series_values(S.SERIES_TTFT_S)["value"], errors="coerce").dropna()
                val = float(np.percentile(means, q)) if len(means) else None
            if val is not None:
                self.add(name, val, "s", source=src)
            else:
                self.add(name, None, "s", "no request has a TTFT and the engine's metrics have no TTFT histogram")
        ttft = self.f.value("metrics_ttft_mean_s")
        if ttft is not None:
            self.add("ttft_mean_s", ttft, "s", source=src)
        shares: dict[str, float] = {}
        means: dict[str, float] = {}
        for stage, share, mean in ((S.QUEUE, "metrics_queue_share", "metrics_queue_time_mean_s"),
                                   (S.PREFILL, "metrics_prefill_share", "metrics_prefill_time_mean_s")):
            v = self.f.value(share)
            if v is None:
                continue
            shares[stage] = min(max(float(v), 0.0), 1.0)
            means[stage] = float(self.f.value(mean))
            # one number for both: the metrics give means per window, not the slowest 5% of requests
            self.add(f"{stage}_share_median", shares[stage], "ratio of TTFT", source=src)
            self.add(f"{stage}_share_tail", shares[stage], "ratio of TTFT", source=src)
        if shares:
            self.add("stage_shares_median", dict(shares), "ratio of TTFT", source=src)
            self.add("stage_shares_tail", dict(shares), "ratio of TTFT", source=src)
            self.add("stage_tail_mean_s", means, "s", source=src)
            self.add("unattributed_share_tail", max(0.0, 1.0 - sum(shares.values())), "ratio of TTFT", source=src)

    # -- populations --
    def populations(self) -> None:
        req = self.req_all
        n_total = len(req)
        warm = _bool_col(req, "warmup")
        err = req["error"].notna() if "error" in req.columns else pd.Series(False, index=req.index)
        if "error" in req.columns:
            err &= req["error"].astype(str).str.len() > 0
        ttft = _col(req, "ttft_s")
        ok = req.loc[~warm & ~err & ttft.notna() & (ttft >= 0)]
        self.ok = ok.sort_values("start_ns", kind="stable").reset_index(drop=True) if len(ok) else ok
        measured = req.loc[~warm]
        self.add("requests_total_n", float(len(measured)), "requests")
        self.add("requests_failed_n", float(int(err[~warm].sum())), "requests")
        self.add("error_rate", float(err[~warm].mean()) if len(measured) else None, "ratio",
                 None if len(measured) else "no requests in the capture")
        kinds = req.loc[err & ~warm, "error"].astype(str).value_counts().head(10) if "error" in req.columns else pd.Series(dtype=int)
        self.add("errors_by_kind", {str(k): int(v) for k, v in kinds.items()}, "requests")
        has_server = _bool_col(req, "has_server")
        has_client = _bool_col(req, "has_client")
        self.add("sides_n", {"server": int(has_server.sum()), "client": int(has_client.sum()),
                             "joined": int((has_server & has_client).sum()), "total": n_total}, "requests")
        self.server_side = bool(has_server.any())
        self.client_side = bool(has_client.any())
        self.add("client_only", 1.0 if (self.client_side and not self.server_side) else 0.0, "bool")
        self.cold_start_outliers()
        self.add("requests_n", float(len(self.steady)), "requests")

    def cold_start_outliers(self) -> None:
        ok = self.ok
        n = len(ok)
        self.steady = ok
        names = [("cold_start_outliers_n", "requests"), ("cold_start_outlier_ttft_s", "s"),
                 ("cold_start_outlier_excess_s", "s")]
        if n < 6:
            self.add("cold_start_outliers_n", 0.0 if n else None, "requests",
                     None if n else "no completed requests")
            self.na(names[1:], f"too few requests ({n}) to tell first requests from the rest" if n else "no completed requests")
            return
        head_n = int(min(50, max(3, math.ceil(0.02 * n))))
        head = ok.iloc[:head_n]
        rest = ok.iloc[head_n:]
        ttft_rest = _col(rest, "ttft_s").to_numpy()
        tok_rest = _col(rest, "input_tokens").to_numpy()
        med_all = float(np.median(ttft_rest))
        p99_rest = float(np.percentile(ttft_rest, 99))
        factor = float(self.p["cold_start_factor"])
        out_idx: list[int] = []
        excess: list[float] = []
        for i, (ttft_i, tok_i) in enumerate(zip(_col(head, "ttft_s").to_numpy(), _col(head, "input_tokens").to_numpy())):
            ref = med_all
            if np.isfinite(tok_i) and tok_i > 0:
                near = (tok_rest >= 0.5 * tok_i) & (tok_rest <= 2 * tok_i)
                if near.sum() >= 3:
                    ref = float(np.median(ttft_rest[near]))
            if ttft_i > factor * ref and ttft_i > p99_rest:
                out_idx.append(i)
                excess.append(float(ttft_i - ref))
        self.add("cold_start_outliers_n", float(len(out_idx)), "requests")
        if out_idx:
            self.steady = ok.drop(index=ok.index[out_idx]).reset_index(drop=True)
            self.add("cold_start_outlier_ttft_s", float(_col(head, "ttft_s").to_numpy()[out_idx].max()), "s")
            self.add("cold_start_outlier_excess_s", float(max(excess)), "s")
        else:
            self.add("cold_start_outlier_ttft_s", 0.0, "s")
            self.add("cold_start_outlier_excess_s", 0.0, "s")

    # -- TTFT percentiles --
    def ttft(self) -> None:
        st = self.steady
        for prefix, col in (("ttft", "ttft_s"), ("server_ttft", "server_ttft_s"), ("client_ttft", "client_ttft_s")):
            v = _col(st, col).dropna().to_numpy()
            if v.size == 0:
                why = "no completed requests" if len(st) == 0 else f"no request has {col} (that side was not captured)"
                self.na([(f"{prefix}_p50_s", "s"), (f"{prefix}_p95_s", "s"), (f"{prefix}_p99_s", "s")], why)
                continue
            q = np.percentile(v, [50, 95, 99])
            self.add(f"{prefix}_p50_s", q[0], "s")
            self.add(f"{prefix}_p95_s", q[1], "s")
            self.add(f"{prefix}_p99_s", q[2], "s")
        v = _col(st, "ttft_s").dropna()
        self.add("ttft_mean_s", float(v.mean()) if len(v) else None, "s", None if len(v) else "no completed requests")
        e2e = _col(st, "e2e_s").dropna()
        self.add("e2e_p50_s", float(e2e.median()) if len(e2e) else None, "s", None if len(e2e) else "no request end times")

    # -- stage shares --
    def stage_shares(self) -> None:
        st = self.steady
        stage_names = [s for s in stages.DECOMPOSITION_STAGES]
        scalar = [(f"{s}_share_{w}", "ratio") for s in stage_names for w in ("median", "tail")]
        server = st.loc[_bool_col(st, "has_server")] if len(st) else st
        present = [s for s in stage_names if s != stages.NETWORK and stages.stage_column(s) in server.columns
                   and server[stages.stage_column(s)].notna().any()]
        if len(st) == 0:
            why = "no completed requests"
        elif len(server) == 0:
            why = "no server-side stage spans (client-only capture)"
        elif not present:
            why = "requests have no stage spans"
        else:
            why = ""
        if "network_s" in st.columns and _col(st, "network_s").notna().any() and why == "":
            present.append(stages.NETWORK)
        if why:
            self.na([("stage_shares_median", "ratio"), ("stage_shares_tail", "ratio"), ("stage_tail_mean_s", "s"),
                     ("unattributed_share_tail", "ratio")], why)
            self.na(scalar, why)
            return
        ttft = _col(server, "ttft_s")
        tq = float(self.p["tail_quantile"])
        band = float(self.p["median_band"])
        lo, mid_lo, mid_hi, hi = np.nanquantile(ttft, [tq, 0.5 - band, 0.5 + band, 1.0])
        tail_m = ttft >= lo
        mid_m = (ttft >= mid_lo) & (ttft <= mid_hi)
        shares: dict[str, dict[str, float]] = {"median": {}, "tail": {}}
        tail_mean: dict[str, float] = {}
        for which, m in (("median", mid_m), ("tail", tail_m)):
            denom = float(ttft[m].sum())
            for s in present:
                vals = _col(server, stages.stage_column(s))[m]
                if denom > 0:
                    shares[which][s] = float(vals.fillna(0).sum() / denom)
                if which == "tail" and m.any():
                    tail_mean[s] = float(vals.fillna(0).mean())
        self.add("stage_shares_median", shares["median"], "ratio of TTFT")
        self.add("stage_shares_tail", shares["tail"], "ratio of TTFT")
        self.add("stage_tail_mean_s", tail_mean, "s")
        self.add("unattributed_share_tail", max(0.0, 1.0 - sum(shares["tail"].values())), "ratio of TTFT")
        for s in stage_names:
            for which in ("median", "tail"):
                name = f"{s}_share_{which}"
                if s in shares[which]:
                    self.add(name, shares[which][s], "ratio of TTFT")
                else:
                    self.add(name, None, "ratio of TTFT", f"no request has a {s} stage span"
                             + (" (needs both client and server sides)" if s == stages.NETWORK else ""))

    # -- concurrency --
    def inflight(self) -> None:
        """In-flight requests at each arrival (itself included), from start/end intervals."""
        req = self.req_all
        self.inflight_at = pd.Series(np.nan, index=self.steady.index, dtype="float64")
        if len(req) == 0:
            return
        start = _col(req, "start_ns").to_numpy()
        e2e = _col(req, "e2e_s").to_numpy()
        ttft = _col(req, "ttft_s").to_numpy()
        dur = np.where(np.isfinite(e2e), e2e, ttft)
        good = np.isfinite(start) & np.isfinite(dur)
        s = np.sort(start[good])
        e = np.sort(start[good] + dur[good] * NS)
        q = _col(self.steady, "start_ns").to_numpy()
        n_started = np.searchsorted(s, q, side="right")
        n_ended = np.searchsorted(e, q, side="right")
        self.inflight_at = pd.Series(np.maximum(n_started - n_ended, 1).astype("float64"), index=self.steady.index)

    def concurrency(self) -> None:
        st = self.steady
        names = [("inflight_at_arrival_p50", "requests"), ("inflight_at_arrival_max", "requests"),
                 ("ttft_by_inflight", "s"), ("ttft_concurrency_ratio", "ratio"), ("concurrency_knee", "requests"),
                 ("ttft_knee_jump_ratio", "ratio"), ("ttft_pre_knee_rise", "ratio"), ("concurrency_flat_levels", "levels"),
                 ("itl_at_top_concurrency_s", "s"), ("ttft_rise_per_itl", "decode steps"),
                 ("decode_speed_by_inflight", "tokens/s per stream"), ("decode_speed_hold_ratio", "ratio")]
        if len(st) == 0:
            self.na(names, "no completed requests")
            return
        x = self.inflight_at
        self.add("inflight_at_arrival_p50", float(x.median()), "requests")
        self.add("inflight_at_arrival_max", float(x.max()), "requests")
        seg = _segment_numbers(st["segment"]) if "segment" in st.columns else None
        # A labelled concurrency sweep is the better x when the probe wrote one.
        if seg is not None and seg["conc"].notna().sum() >= 0.8 * len(st) and seg["conc"].nunique() >= 3:
            x = seg["conc"]
            source = "segments"
        else:
            source = "measured"
        levels = x.dropna()
        min_bin = int(self.p["min_bin_requests"])
        if levels.nunique() > int(self.p["max_inflight_bins"]):
            bins = pd.qcut(levels, int(self.p["max_inflight_bins"]), duplicates="drop")
            key = levels.groupby(bins, observed=True).transform("median")
        else:
            key = levels
        ttft = _col(st, "ttft_s").loc[key.index]
        g = ttft.groupby(key)
        counts = g.size()
        curve = g.median()[counts >= min_bin].sort_index()
        tpot = _col(st, "tpot_s").loc[key.index]
        speed = (1.0 / tpot.where(tpot > 0))
        sg = speed.groupby(key)
        scurve = sg.median()[(sg.count() >= min_bin)].sort_index()
        if len(curve) < 3:
            why = (f"in-flight requests at arrival hardly vary ({levels.min():g}..{levels.max():g}); "
                   "needs a concurrency sweep or varied load") if len(levels) else "no arrival times"
            self.na(names[2:], why)
            return
        self.add("ttft_by_inflight", {f"{k:g}": float(v) for k, v in curve.items()}, "s (median TTFT)", source=source)
        y = curve.to_numpy()
        xs = curve.index.to_numpy(dtype="float64")
        base = max(y[0], 1e-9)
        self.add("ttft_concurrency_ratio", float(y[-1] / base), "ratio", source=source)
        # The knee is the steepest step between adjacent levels. It is a *sharp* knee (a cliff,
        # "TTFT suddenly worsens") when that single step is steeper than every step before it by
        # ``knee_sharpness`` and larger than the whole rise before it; a curve that climbs from
        # the lowest level on (a serialising server) has none.
        steps = y[1:] / np.maximum(y[:-1], 1e-9)
        k = int(np.argmax(steps))
        before = float(steps[:k].max()) if k > 0 else 1.0
        flat = float(self.p["flat_factor"])
        sharp = k >= 1 and steps[k] >= float(self.p["knee_sharpness"]) * max(before, 1.0) and steps[k] >= y[k] / base
        b = k if sharp else 0
        if not sharp:
            while b + 1 < len(y) and y[b + 1] <= flat * base:
                b += 1
        if b < len(y) - 1:
            self.add("concurrency_knee", float(xs[b]), "requests", source=source)
            self.add("ttft_knee_jump_ratio", float(y[-1] / max(y[b], 1e-9)), "ratio", source=source)
        else:
            self.add("concurrency_knee", None, "requests", "TTFT stays flat across the concurrency range")
            self.add("ttft_knee_jump_ratio", 1.0, "ratio", source=source)
        self.add("ttft_pre_knee_rise", float(y[b] / base), "ratio", source=source)
        self.add("concurrency_flat_levels", float(b), "levels", source=source)
        itl_req = _col(st, "itl_p50_s").loc[key.index].groupby(key).median()
        top_itl = _f(itl_req.get(curve.index[-1]))
        if top_itl:
            self.add("itl_at_top_concurrency_s", top_itl, "s", source=source)
            self.add("ttft_rise_per_itl", float((y[-1] - y[0]) / top_itl), "decode steps", source=source)
        else:
            self.na([("itl_at_top_concurrency_s", "s"), ("ttft_rise_per_itl", "decode steps")],
                    "no ITL at the highest concurrency level")
        if len(scurve) >= 2:
            self.add("decode_speed_by_inflight", {f"{k:g}": float(v) for k, v in scurve.items()},
                     "tokens/s per stream (median 1/TPOT)", source=source)
            self.add("decode_speed_hold_ratio", float(scurve.iloc[-1] / scurve.iloc[0]) if scurve.iloc[0] > 0 else None,
                     "ratio")
        else:
            self.na(names[-2:], "too few requests with two or more output tokens per concurrency level")

    # -- prompt length --
    def prompt_fit(self) -> None:
        st = self.steady
        names = [("ttft_prompt_slope_ms_per_token", "ms/token"), ("ttft_prompt_intercept_ms", "ms"),
                 ("ttft_prompt_r2", "ratio"), ("ttft_prompt_explained_frac", "ratio"), ("ttft_prompt_fit_n", "requests")]
        if len(st) == 0:
            self.na(names, "no completed requests")
            return
        tokens = _col(st, "input_tokens")
        if tokens.notna().sum() == 0:
            self.na(names, "no request carries its prompt token count (gen_ai.usage.input_tokens)")
            return
        has_server = _bool_col(st, "has_server")
        y = _col(st, "server_ttft_s").where(has_server, _col(st, "ttft_s"))
        queue = _col(st, "queue_s")
        if queue.notna().any():
            mask = queue.fillna(0) <= float(self.p["queue_small_frac"]) * y
            how = "requests that did not queue"
        else:
            seg = _segment_numbers(st["segment"]) if "segment" in st.columns else pd.DataFrame(index=st.index)
            prompt_seg = seg["prompt"].notna() if "prompt" in seg.columns else pd.Series(False, index=st.index)
            mask = (self.inflight_at <= 1) | prompt_seg
            how = "requests alone in flight (concurrency 1) or in a prompt sweep"
            inflight = self.inflight_at.dropna()
            steady_load = len(inflight) and float(inflight.quantile(0.9) - inflight.quantile(0.1)) <= 1.0
            if int((mask & tokens.notna()).sum()) < int(self.p["min_fit_requests"]) and steady_load:
                # a closed loop at a fixed concurrency: every request met the same load
                mask = pd.Series(True, index=st.index)
                how = f"requests at a steady concurrency (~{float(inflight.median()):g} in flight, closed loop)"
        mask &= tokens.notna() & y.notna()
        x = tokens[mask].to_numpy()
        yy = y[mask].to_numpy()
        min_n = int(self.p["min_fit_requests"])
        if x.size < min_n:
            self.na(names, f"only {x.size} {how} with a token count (needs {min_n})")
            return
        if np.unique(x).size < 3 or (x.max() - x.min()) < 0.2 * max(x.mean(), 1e-9):
            self.na(names, f"only {np.unique(x).size} distinct prompt lengths ({x.min():g}..{x.max():g} tokens); "
                    "needs a prompt-length sweep")
            return
        # When prompt lengths repeat (a sweep, a prompt file), fit the median TTFT of each length:
        # robust to the few requests that waited behind another one.
        lengths, counts = np.unique(x, return_counts=True)
        repeated = counts >= 2
        if repeated.sum() >= 3 and counts[repeated].sum() >= 0.8 * x.size:
            fx = lengths[repeated].astype("float64")
            fy = np.array([np.median(yy[x == v]) for v in lengths[repeated]])
            slope, intercept, r2 = _linear_fit(fx, fy)
            weights = counts[repeated]
            expl = slope * float((weights * fx).sum()) / max(float((weights * fy).sum()), 1e-12)
            how += ", median TTFT per prompt length"
        else:
            slope, intercept, r2 = _linear_fit(x, yy)
            expl = None
        self.add("ttft_prompt_slope_ms_per_token", slope * 1e3, "ms/token", source=how)
        self.add("ttft_prompt_intercept_ms", intercept * 1e3, "ms", source=how)
        self.add("ttft_prompt_r2", max(0.0, r2), "ratio", source=how)
        # time-weighted (means, not medians): in a mixed workload most requests are short, yet
        # the long ones carry most of the TTFT time
        mean_y = float(np.mean(yy))
        if expl is None:
            expl = slope * float(np.mean(x)) / mean_y if mean_y > 0 else None
        self.add("ttft_prompt_explained_frac", max(0.0, expl) if expl is not None else None, "ratio")
        self.add("ttft_prompt_fit_n", float(x.size), "requests")

    # -- device busy --
    def device(self) -> None:
        util = self.series_values(stages.SERIES_GPU_UTIL_PCT)
        if len(util):
            per_gpu = pd.to_numeric(util["value"]).groupby(util["entity"].astype(str)).mean()
            self.add("device_busy_frac", float(per_gpu.mean()) / 100.0, "ratio", source="nvml")
        steps = self.steps
        if len(steps) and "start_ns" in steps.columns:
            s = steps["start_ns"].to_numpy(dtype="float64")
            e = steps["end_ns"].to_numpy(dtype="float64")
            self.busy = _Coverage(s, e)
            lo, hi = float(s.min()), float(e.max())
            if len(self.req_all):
                rs = _col(self.req_all, "server_start_ns").where(_col(self.req_all, "server_start_ns").notna(),
                                                                 _col(self.req_all, "start_ns"))
                lo = min(lo, float(np.nanmin(rs.to_numpy()))) if rs.notna().any() else lo
                ends = (rs + _col(self.req_all, "e2e_s") * NS).dropna()
                hi = max(hi, float(ends.max())) if len(ends) else hi
            if self.window is not None:
                lo, hi = max(lo, self.window[0]), min(hi, self.window[1])
            wall = max(hi - lo, 1.0)
            busy = float(self.busy.between(np.array([lo]), np.array([hi]))[0])
            if "device_busy_frac" not in self.f:
                self.add("device_busy_frac", busy / wall, "ratio", source="engine_steps")
            self.add("engine_busy_frac", busy / wall, "ratio", source="engine_steps")
            self.queued_busy()
        else:
            self.busy = None
            if "device_busy_frac" not in self.f:
                self.add("device_busy_frac", None, "ratio", "needs NVML gpu_util_pct samples or engine-step spans")
            self.add("engine_busy_frac", None, "ratio", "no engine-step spans")
            self.add("device_busy_frac_while_queued", None, "ratio", "no engine-step spans")
        if len(steps) and "duration_s" in steps.columns:
            d = steps["duration_s"].to_numpy(dtype="float64")
            self.add("engine_step_p50_s", float(np.median(d)), "s")
            # what a request arriving at a random time finds in flight: the length-biased mean step
            self.add("engine_step_in_flight_s", float((d * d).sum() / d.sum()) if d.sum() > 0 else None, "s")
        else:
            self.na([("engine_step_p50_s", "s"), ("engine_step_in_flight_s", "s")], "no engine-step spans")
        dec = steps.loc[(_col(steps, "prefill_tokens").fillna(0) <= 0) & (_col(steps, "decode_seqs") > 0)] if len(steps) else steps
        if len(dec):
            self.add("decode_step_p50_s", float(dec["duration_s"].median()), "s")
        else:
            self.add("decode_step_p50_s", None, "s", "no decode-only engine steps")

    def queued_busy(self) -> None:
        """Fraction of the time requests sat in the queue during which the device was busy."""
        sp = self.spans
        if sp is None or sp.empty or self.busy is None:
            self.add("device_busy_frac_while_queued", None, "ratio", "needs queue spans and engine-step spans")
            return
        q = sp.loc[_name_is(sp, stages.QUEUE)]
        if self.window is not None and len(q):
            q = q.loc[(q["start_ns"] >= self.window[0]) & (q["start_ns"] < self.window[1])]
        if q.empty:
            self.add("device_busy_frac_while_queued", None, "ratio", "no queue spans")
            return
        a = q["start_ns"].to_numpy(dtype="float64")
        b = q["end_ns"].to_numpy(dtype="float64")
        total = float((b - a).sum())
        if total <= 0:
            self.add("device_busy_frac_while_queued", None, "ratio", "queue spans have zero length")
            return
        self.add("device_busy_frac_while_queued", float(self.busy.between(a, b).sum() / total), "ratio",
                 source="engine_steps")

    # -- KV, preemptions, queue depth --
    def kv(self) -> None:
        steps = self.steps
        kv = _col(steps, "kv_usage_ratio").dropna() if len(steps) else pd.Series(dtype="float64")
        high = float(self.p["kv_high_ratio"])
        names = [("kv_usage_p95", "ratio"), ("kv_usage_max", "ratio"), ("kv_time_above_high_frac", "ratio")]
        if len(kv):
            dur = steps.loc[kv.index, "duration_s"].to_numpy(dtype="float64")
            v = kv.to_numpy()
            self.add("kv_usage_p95", float(np.percentile(v, 95)), "ratio", source="engine_steps")
            self.add("kv_usage_max", float(v.max()), "ratio", source="engine_steps")
            w = dur.sum()
            frac = float(dur[v >= high].sum() / w) if w > 0 else float((v >= high).mean())
            self.add("kv_time_above_high_frac", frac, "ratio", source="engine_steps")
        else:
            s = self.series_values(stages.SERIES_KV_USAGE)
            if len(s):
                v = pd.to_numeric(s["value"]).to_numpy()
                if np.nanmax(v) > 1.5:  # some engines export percent
                    v = v / 100.0
                self.add("kv_usage_p95", float(np.percentile(v, 95)), "ratio", source="prometheus")
                self.add("kv_usage_max", float(v.max()), "ratio", source="prometheus")
                self.add("kv_time_above_high_frac", float((v >= high).mean()), "ratio", source="prometheus")
            else:
                self.na(names, "needs KV usage: engine-step spans with ttft.step.kv_usage_ratio or a kv_usage_ratio series")
        # preemptions
        pre_req = _col(self.steady, "preemptions")
        pre_steps = _col(steps, "preempted_seqs") if len(steps) else pd.Series(dtype="float64")
        pre_series = self.series_values(stages.SERIES_PREEMPTIONS)
        if pre_req.notna().any():
            self.add("preemptions_total", float(pre_req.fillna(0).sum()), "preemptions", source="requests")
            self.add("preempted_requests_frac", float((pre_req.fillna(0) > 0).mean()), "ratio")
        elif pre_steps.notna().any():
            self.add("preemptions_total", float(pre_steps.fillna(0).sum()), "preemptions", source="engine_steps")
            self.add("preempted_requests_frac", None, "ratio", "requests do not carry ttft.preemptions")
        elif len(pre_series):
            v = pd.to_numeric(pre_series["value"])
            per = v.groupby(pre_series["entity"].astype(str)).agg(lambda x: x.max() - x.min())
            self.add("preemptions_total", float(per.clip(lower=0).sum()), "preemptions", source="prometheus")
            self.add("preempted_requests_frac", None, "ratio", "only the engine's cumulative counter is known")
        else:
            why = "needs ttft.preemptions on requests, preempted_seqs on steps or a preemptions_total series"
            self.na([("preemptions_total", "preemptions"), ("preempted_requests_frac", "ratio")], why)
        # queue depth
        for col, series_name, feat in (("waiting_seqs", stages.SERIES_WAITING, "waiting_seqs"),
                                       ("running_seqs", stages.SERIES_RUNNING, "running_seqs")):
            v = _col(steps, col).dropna() if len(steps) else pd.Series(dtype="float64")
            src = "engine_steps"
            if v.empty:
                s = self.series_values(series_name)
                v = pd.to_numeric(s["value"]) if len(s) else v
                src = "prometheus"
            if len(v):
                self.add(f"{feat}_p95", float(np.percentile(v, 95)), "sequences", source=src)
                self.add(f"{feat}_max", float(v.max()), "sequences", source=src)
            else:
                self.na([(f"{feat}_p95", "sequences"), (f"{feat}_max", "sequences")],
                        f"needs {col} on engine steps or a {series_name} series")

    # -- comm / TP --
    def comm_tp(self) -> None:
        st = self.steady
        comm = _col(st, "comm_s")
        pre = _col(st, "prefill_s")
        m = comm.notna() & pre.notna()
        if m.any() and float((pre[m] + comm[m]).sum()) > 0:
            self.add("comm_share_of_prefill", float(comm[m].sum() / (pre[m] + comm[m]).sum()), "ratio", source="requests")
        else:
            steps = self.steps
            if len(steps) and _col(steps, "comm_s").notna().any() and (_col(steps, "prefill_tokens") > 0).any():
                ps = steps.loc[_col(steps, "prefill_tokens") > 0]
                d = float(ps["duration_s"].sum())
                self.add("comm_share_of_prefill", float(_col(ps, "comm_s").fillna(0).sum() / d) if d > 0 else None,
                         "ratio", source="engine_steps")
            else:
                self.add("comm_share_of_prefill", None, "ratio",
                         "no comm spans (tensor parallel off, or the engine does not time its collectives)")
        tp = _col(st, "tp_size")
        if tp.isna().all() and "segment" in st.columns:
            tp = _segment_numbers(st["segment"])["tp"]
        if tp.isna().all():
            meta_tp = self.meta.get("tp_size")
            eng = self.meta.get("engine")
            if meta_tp is None and isinstance(eng, dict):
                meta_tp = eng.get("tp_size", eng.get("tp"))
            mt = _f(meta_tp)
            if mt is not None:
                tp = pd.Series(mt, index=st.index)
        if tp.notna().any():
            self.add("tp_size", float(tp.max()), "GPUs")
            degrees = sorted(tp.dropna().unique())
            if len(degrees) >= 2:
                ttft = _col(st, "ttft_s")
                tokens = _col(st, "input_tokens")
                per_tok = (ttft / tokens).where(tokens > 0)
                by: dict[str, float] = {}
                norm: dict[float, float] = {}
                for d in degrees:
                    mm = tp == d
                    by[f"{d:g}"] = float(ttft[mm].median())
                    norm[d] = float(per_tok[mm].median()) if per_tok[mm].notna().any() else float(ttft[mm].median())
                self.add("ttft_by_tp", by, "s (median TTFT)")
                lo_d, hi_d = degrees[0], degrees[-1]
                self.add("tp_ttft_ratio", norm[hi_d] / norm[lo_d] if norm[lo_d] > 0 else None, "ratio",
                         source=f"TP={hi_d:g} vs TP={lo_d:g}, per prompt token when token counts are known")
            else:
                self.na([("ttft_by_tp", "s"), ("tp_ttft_ratio", "ratio")],
                        f"only one TP degree ({degrees[0]:g}) in the capture; needs runs at two degrees")
        else:
            self.add("tp_size", None, "GPUs", "requests do not carry ttft.tp.size")
            self.na([("ttft_by_tp", "s"), ("tp_ttft_ratio", "ratio")], "TP degree unknown")

    # -- ITL and interference --
    def _token_gaps(self, span_name: str) -> pd.DataFrame | None:
        sp = self.spans
        key = stages.ATTR_TOKEN_TIMES_NS
        if sp is None or sp.empty or key not in sp.columns:
            return None
        rows = sp.loc[_name_is(sp, span_name), ["trace_id", key]]
        rows = rows.loc[rows[key].notna()]
        if rows.empty:
            return None
        tids = rows["trace_id"].to_numpy(dtype=object)
        # keep steady requests only: drop the (usually few) excluded ones by set lookup; string
        # isin on pyarrow strings is a Python loop in pandas, far slower at 1M spans
        all_ids = self.t.requests["trace_id"].to_numpy(dtype=object) if "trace_id" in self.t.requests.columns else []
        steady_ids = set(self.steady["trace_id"].to_numpy(dtype=object)) if "trace_id" in self.steady.columns else set()
        excluded = set(all_ids) - steady_ids if len(steady_ids) != len(all_ids) else set()
        keep = np.fromiter((t not in excluded and t in steady_ids for t in tids), dtype=bool, count=len(tids)) \
            if excluded or not steady_ids else np.ones(len(tids), dtype=bool)
        if self.window is not None or len(steady_ids) < len(all_ids):
            keep &= np.fromiter((t in steady_ids for t in tids), dtype=bool, count=len(tids))
        rows = rows.loc[keep]
        first = ~pd.Series(rows["trace_id"].to_numpy(dtype=object)).duplicated().to_numpy()
        rows = rows.loc[first]
        if rows.empty:
            return None
        arrays = rows[key].to_numpy()
        lens = np.fromiter((len(a) if isinstance(a, (list, tuple, np.ndarray)) else 0 for a in arrays),
                           dtype=np.int64, count=len(arrays))
        flat = np.fromiter(itertools.chain.from_iterable(a for a, n in zip(arrays, lens) if n), dtype=np.int64,
                           count=int(lens.sum()))
        if flat.size == 0:
            return None
        owner = np.repeat(np.arange(len(arrays)), lens)
        same = owner[1:] == owner[:-1]
        g_start = flat[:-1][same]
        g_end = flat[1:][same]
        tid_of = rows["trace_id"].to_numpy(dtype=object)
        seg_by_tid = dict(zip(self.steady["trace_id"].to_numpy(dtype=object), self.steady["segment"].to_numpy(dtype=object))) \
            if "segment" in self.steady.columns and "trace_id" in self.steady.columns else {}
        seg = np.array([seg_by_tid.get(t) for t in tid_of], dtype=object)
        return pd.DataFrame({"start_ns": g_start.astype("float64"), "end_ns": g_end.astype("float64"),
                             "gap_s": (g_end - g_start) / NS,
                             "req": owner[1:][same],
                             "segment": seg[owner[1:][same]]})

    def itl(self) -> None:
        client = self._token_gaps(stages.SPAN_CLIENT_REQUEST)
        server = self._token_gaps(stages.SPAN_REQUEST)
        gaps = client if client is not None and len(client) else server
        names = [("itl_p50_s", "s"), ("itl_p90_s", "s"), ("itl_p99_s", "s"), ("itl_max_s", "s")]
        if gaps is None or gaps.empty:
            p50 = _col(self.steady, "itl_p50_s").dropna()
            if len(p50):  # per-request statistics when the raw token times are gone
                self.add("itl_p50_s", float(p50.median()), "s", source="per-request medians")
                self.add("itl_p90_s", float(np.percentile(_col(self.steady, "itl_p99_s").dropna(), 90)), "s")
                self.add("itl_p99_s", float(np.percentile(_col(self.steady, "itl_p99_s").dropna(), 99)), "s")
                self.add("itl_max_s", float(_col(self.steady, "itl_max_s").max()), "s")
            elif not self.itl_from_series(names):
                self.na(names, "needs token emission times (ttft.token_times_ns) with two or more tokens, "
                        "or an itl_s series from the engine's metrics")
        else:
            q = np.percentile(gaps["gap_s"].to_numpy(), [50, 90, 99])
            src = "client token times" if gaps is client else "server token times"
            for (n, _), v in zip(names, q):
                self.add(n, v, "s", source=src)
            self.add("itl_max_s", float(gaps["gap_s"].max()), "s", source=src)
        tpot = _col(self.steady, "tpot_s").dropna()
        self.add("tpot_p50_s", float(tpot.median()) if len(tpot) else None, "s", None if len(tpot) else "no request with 2+ output tokens")
        self.add("tpot_p99_s", float(np.percentile(tpot, 99)) if len(tpot) else None, "s", None if len(tpot) else "no request with 2+ output tokens")
        self.interference(server, client)

    def itl_from_series(self, names: list[tuple[str, str]]) -> bool:
        """ITL from the engine's itl_s histogram (windowed p50/p99, else the windowed mean), weighted by
        generated tokens per window; False when the engine exports no ITL."""
        S = stages
        w = S.SERIES_GENERATION_TOKENS_PER_S
        p50 = self._wmean(S.SERIES_ITL_S + "_p50", w)
        how = "prometheus"
        if p50 is None:
            p50 = self._wmean(S.SERIES_ITL_S, w)  # e.g. llama.cpp: Δ generation s / Δ tokens (a mean)
        if p50 is None:
            return False
        self.add("itl_p50_s", p50, "s", source=how)
        p99 = self._wmean(S.SERIES_ITL_S + "_p99", w)
        self.add("itl_p99_s", p99, "s", None if p99 is not None else "no itl_s_p99 series (ITL histogram buckets)",
                 source=how)
        self.na(names[1:2] + names[3:], "the engine's metrics give ITL p50/p99 only")
        return True

    def interference(self, server: pd.DataFrame | None, client: pd.DataFrame | None) -> None:
        names = [("itl_during_prefill_p50_s", "s"), ("itl_during_prefill_mean_s", "s"), ("itl_without_prefill_p50_s", "s"),
                 ("itl_interference_ratio", "ratio"), ("itl_prefill_stall_share", "ratio of decode time"),
                 ("itl_tail_during_prefill_frac", "ratio"), ("itl_tail_gaps_n", "gaps"),
                 ("itl_during_prefill_frac", "ratio")]
        steps = self.steps
        windows: tuple[np.ndarray, np.ndarray] | None = None
        gaps = None
        src = ""
        if server is not None and len(server) and len(steps) and (_col(steps, "prefill_tokens") > 0).any():
            ps = steps.loc[_col(steps, "prefill_tokens") > 0]
            windows = (ps["start_ns"].to_numpy(dtype="float64"), ps["end_ns"].to_numpy(dtype="float64"))
            gaps, src = server, "engine steps with prefill tokens vs server token times"
        elif server is not None and len(server) and self.spans is not None and len(self.spans):
            pre = self.spans.loc[_name_is(self.spans, stages.PREFILL)]
            if len(pre):
                windows = (pre["start_ns"].to_numpy(dtype="float64"), pre["end_ns"].to_numpy(dtype="float64"))
                gaps, src = server, "prefill stage spans vs server token times"
        if windows is None and client is not None and len(client):
            st = self.steady
            a = _col(st, "start_ns").to_numpy()
            b = (a + _col(st, "ttft_s").to_numpy() * NS)
            good = np.isfinite(a) & np.isfinite(b)
            windows = (a[good], b[good])
            gaps, src = client, "other requests' TTFT windows vs client token times (black box)"
        if windows is None or gaps is None:
            self.na(names, "needs token times and prefill windows (engine steps, prefill spans or other requests' arrivals)")
            return
        cov = _Coverage(*windows)
        overlap = cov.between(gaps["start_ns"].to_numpy(), gaps["end_ns"].to_numpy())
        during = overlap > 0
        min_n = int(self.p["min_itl_gaps"])
        n_d, n_w = int(during.sum()), int((~during).sum())
        self.add("itl_during_prefill_frac", float(during.mean()), "ratio", source=src)
        if n_d < min_n or n_w < min_n:
            self.na(names[:5], f"too few token gaps to compare ({n_d} during prefills, {n_w} without; needs {min_n} each)")
            return
        g = gaps["gap_s"].to_numpy()
        if "segment" in gaps.columns and gaps["segment"].nunique(dropna=True) >= 2:
            # different phases (sweep points, TP degrees) run at different speeds: compare each
            # gap with its own phase's typical gap so the slower phase is not read as stalls
            seg = gaps["segment"].astype(str)
            scale = pd.Series(g).groupby(seg.to_numpy()).transform("median").to_numpy()
            g = g / np.where(scale > 0, scale, 1.0) * float(np.median(g))
        d50 = float(np.median(g[during]))
        dmean = float(g[during].mean())
        w50 = float(np.median(g[~during]))
        self.add("itl_during_prefill_p50_s", d50, "s", source=src)
        self.add("itl_during_prefill_mean_s", dmean, "s", source=src)
        self.add("itl_without_prefill_p50_s", w50, "s", source=src)
        # mean, not median, of the gaps during prefills: a few long prompts stall many gaps a lot
        self.add("itl_interference_ratio", dmean / w50 if w50 > 0 else None, "ratio", source=src)
        total = float(g.sum())
        lost = float(np.clip(g[during] - w50, 0, None).sum())
        self.add("itl_prefill_stall_share", lost / total if total > 0 else None, "ratio of decode time", source=src)
        # the ITL tail: which share of the slowest 1% of token gaps overlap a prefill
        tail = g >= np.percentile(g, 99)
        self.add("itl_tail_during_prefill_frac", float(during[tail].mean()) if tail.any() else None, "ratio", source=src)
        self.add("itl_tail_gaps_n", float(tail.sum()), "gaps", source=src)

    # -- cold start spans --
    def cold_start_spans(self) -> None:
        cs = self.t.cold_starts
        if cs is None or len(cs) == 0:
            self.add("cold_start_s", 0.0, "s", source="no cold_start spans")
            self.add("cold_start_by_phase_s", {}, "s")
            return
        d = pd.to_numeric(cs["duration_s"], errors="coerce").fillna(0)
        phase = cs["phase"].fillna("unknown").astype(str) if "phase" in cs.columns else pd.Series("unknown", index=cs.index)
        self.add("cold_start_s", float(d.sum()), "s", source="cold_start spans")
        self.add("cold_start_by_phase_s", {str(k): float(v) for k, v in d.groupby(phase).sum().items()}, "s")

    # -- network --
    def network(self) -> None:
        st = self.steady
        both = st.loc[_bool_col(st, "has_server") & _bool_col(st, "has_client")] if len(st) else st
        names = [("client_server_gap_p50_s", "s"), ("client_server_gap_p95_s", "s"), ("client_server_ttft_ratio", "ratio")]
        if len(both) == 0:
            self.na(names, "needs requests seen by both the client and the server (join a client and a server capture)")
            return
        gap = _col(both, "client_ttft_s") - _col(both, "server_ttft_s")
        self.add("client_server_gap_p50_s", float(gap.median()), "s")
        self.add("client_server_gap_p95_s", float(np.percentile(gap.dropna(), 95)) if gap.notna().any() else None, "s")
        srv = float(_col(both, "server_ttft_s").median())
        self.add("client_server_ttft_ratio", float(_col(both, "client_ttft_s").median()) / srv if srv > 0 else None, "ratio")

    # -- client health --
    def client_health(self) -> None:
        health = self.meta.get("client_health")
        health = health if isinstance(health, dict) else {}
        flags = {k: v for k, v in health.items() if isinstance(v, (bool, int, float, str)) and not isinstance(v, dict)}
        self.add("client_health_flags", flags, "", None if health else "meta.json has no client_health")

        def from_meta(*needles: str) -> float | None:
            for k, v in health.items():
                kl = k.lower()
                if all(n in kl for n in needles):
                    x = _f(v)
                    if x is not None:
                        return x
            return None

        lag = self.series_values(stages.SERIES_LOOP_LAG_S)
        stall = from_meta("loop_stall")
        if len(lag) >= 3:
            # share of the sampled wall time the loop ran late, per client process (entity)
            fracs = []
            for _, g in lag.groupby(lag["entity"].astype(str)):
                ts = pd.to_numeric(g["ts_s"]).to_numpy()
                covered = float(ts.max() - ts.min())
                if covered > 0:
                    fracs.append(min(1.0, float(pd.to_numeric(g["value"]).iloc[1:].sum()) / covered))
            stall = max(fracs) if fracs else stall
        self.add("client_loop_stall_frac", stall, "ratio",
                 None if stall is not None else "no client_loop_lag_s series or client_health loop_stall_frac",
                 source="series" if len(lag) >= 3 else "meta")
        if len(lag):
            self.add("client_loop_lag_p99_s", float(np.percentile(pd.to_numeric(lag["value"]), 99)), "s", source="series")
        else:
            v = from_meta("loop_lag", "p99")
            v = v if v is not None else from_meta("loop_lag")
            self.add("client_loop_lag_p99_s", v, "s", None if v is not None else "no client_loop_lag_s series or client_health entry",
                     source="meta")
        cpu = self.series_values(stages.SERIES_CLIENT_CPU_PCT)
        if len(cpu):
            self.add("client_cpu_pct_p95", float(np.percentile(pd.to_numeric(cpu["value"]), 95)), "%", source="series")
        else:
            v = from_meta("cpu", "p95")
            v = v if v is not None else from_meta("cpu", "p90")  # collectors.probe.health writes cpu_pct_p90
            v = v if v is not None else from_meta("cpu", "max")
            self.add("client_cpu_pct_p95", v, "%", None if v is not None else "no client_cpu_pct series or client_health entry",
                     source="meta")
        sat = None
        for k in ("saturated", "client_bound", "bottleneck", "overloaded", "client_saturated"):
            if k in health:
                sat = 1.0 if bool(health[k]) else 0.0
        self.add("client_saturated_flag", sat, "bool", None if sat is not None else "client_health does not say")
        slot = _col(self.steady, "slot_wait_s").dropna()
        self.add("client_slot_wait_p95_s", float(np.percentile(slot, 95)) if len(slot) else None, "s",
                 None if len(slot) else "no client slot-wait times")
        # lateness of sends against the load schedule, net of slot waits
        sp = self.spans
        key = stages.ATTR_CLIENT_SCHEDULED_NS
        if sp is not None and len(sp) and key in sp.columns and stages.ATTR_CLIENT_START_NS in sp.columns:
            rows = sp.loc[(_name_is(sp, stages.SPAN_CLIENT_REQUEST)) & sp[key].notna()]
            if len(rows):
                sched = pd.to_numeric(rows[key], errors="coerce")
                start = pd.to_numeric(rows[stages.ATTR_CLIENT_START_NS], errors="coerce")
                wait = pd.to_numeric(rows.get(stages.ATTR_CLIENT_SLOT_WAIT_S), errors="coerce") if stages.ATTR_CLIENT_SLOT_WAIT_S in rows.columns else 0.0
                late = ((start - sched) / NS - (wait if np.isscalar(wait) else wait.fillna(0))).clip(lower=0).dropna()
                if len(late):
                    self.add("client_send_lateness_p95_s", float(np.percentile(late, 95)), "s")
                    return
        self.add("client_send_lateness_p95_s", None, "s", "requests carry no scheduled send time (closed-loop load)")

    # -- CPU profile --
    def cpu_profile(self) -> None:
        prof = self.meta.get("pyspy")
        shares = None
        if isinstance(prof, dict):
            for k in ("busy_shares", "stage_shares", "shares", "by_stage"):  # collectors.pyspy writes busy_shares
                if isinstance(prof.get(k), dict):
                    shares = {str(a): float(b) for a, b in prof[k].items() if _f(b) is not None}
                    break
        self.add("cpu_profile_shares", shares, "ratio of samples",
                 None if shares else "no CPU profile summary (meta 'pyspy' with stage shares)")

    # -- SLO --
    def slo_checks(self) -> None:
        if not self.slo:
            self.add("slo_checks", None, "", "no SLO given")
            return
        st = self.steady
        gaps_p = {"p50": "itl_p50_s", "p90": "itl_p90_s", "p99": "itl_p99_s", "max": "itl_max_s"}
        out: dict[str, dict[str, Any]] = {}
        for key, target in self.slo.items():
            metric, _, pct = key.partition("_")
            val: float | None = None
            if metric == "itl" and pct in gaps_p:
                val = self.f.value(gaps_p[pct])
            else:
                col = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "itl": "itl_mean_s"}.get(metric)
                v = _col(st, col).dropna() if col else pd.Series(dtype="float64")
                if len(v):
                    if pct == "max":
                        val = float(v.max())
                    elif pct == "mean":
                        val = float(v.mean())
                    elif pct.startswith("p"):
                        val = float(np.percentile(v, float(pct[1:])))
            out[key] = {"target_s": float(target), "value_s": val, "met": None if val is None else bool(val <= target)}
        self.add("slo_checks", out, "s")

    def run(self) -> Features:
        self.populations()
        self.engine_metrics()
        self.ttft()
        self.stage_shares()
        self.series_fallback()
        self.inflight()
        self.concurrency()
        self.prompt_fit()
        self.device()
        self.kv()
        self.comm_tp()
        self.itl()
        self.cold_start_spans()
        self.network()
        self.client_health()
        self.cpu_profile()
        slope = self.f.value("ttft_prompt_slope_ms_per_token")
        itl = self.f.value("itl_p50_s")
        if slope is not None and itl:
            self.add("prompt_slope_per_itl", (slope / 1e3) / itl, "ratio",
                     source="prompt-token cost over one decode step: a parallel prefill keeps this far below 1")
        else:
            self.add("prompt_slope_per_itl", None, "ratio", "needs a prompt-length fit and ITL")
        self.slo_checks()
        return self.f


def compute_features(tables: Tables, window_ns: tuple[int, int] | None = None, slo: Mapping[str, float] | None = None,
                     *, params: Mapping[str, float] | None = None) -> Features:
    """All features of a capture (optionally only requests starting in ``window_ns``, Unix ns).

    ``slo`` maps ``"ttft_p99"``-style keys to seconds (``diag.slo.parse_slo``); ``params``
    overrides :data:`DEFAULT_PARAMS`. Never raises on missing data: such features are
    unavailable with a reason.
    """
    return _Builder(tables, window_ns, slo, params).run()


__all__ = ["Feature", "Features", "compute_features", "DEFAULT_PARAMS"]
