"""The device-busy, KV-usage and waiting/running-queue timelines behind the report's charts.

Inputs are :class:`diag.ground.tables.Tables`; times are seconds since the capture's origin
(``t_s``, from :func:`diag.analysis.report.summary.time_origin_ns`), values in each line's own unit
(busy and KV usage 0..1, queue depth in sequences). Vectorised with numpy/pandas; any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.analysis.report.summary import NS, series_frame
from diag.ground.tables import Tables


@dataclass
class Timeline:
    """One line of a timeline chart: seconds since the capture's origin and values."""

    label: str
    t_s: np.ndarray
    values: np.ndarray
    source: str  # "nvml", "engine steps", "prometheus", ...


def _bin_edges(t0_ns: float, t1_ns: float, bins: int) -> np.ndarray:
    return np.linspace(t0_ns, max(t1_ns, t0_ns + 1), bins + 1)


def busy_timeline(tables: Tables, origin_ns: float, bins: int = 240) -> Timeline | None:
    """Device busy fraction over time: NVML utilisation when sampled, else engine steps' busy
    time per bin. Bins span at least four typical step periods (start-to-start), so the line
    shows load, not the on/off of single steps; at most ``bins`` bins."""
    gpu = series_frame(tables, stages.SERIES_GPU_UTIL_PCT)
    if not gpu.empty:
        g = gpu.groupby("ts_s")["value"].mean().sort_index()
        return Timeline("GPU utilisation (NVML, mean over GPUs)", (g.index.to_numpy() * NS - origin_ns) / NS,
                        g.to_numpy() / 100.0, "nvml")
    steps = tables.steps
    if steps is None or steps.empty:
        return None
    base_ns = int(steps["start_ns"].min())
    # relative seconds: absolute ns in float64 would lose the precision the prefix sums need
    s = (steps["start_ns"].to_numpy(dtype="int64") - base_ns) / NS
    e = (steps["end_ns"].to_numpy(dtype="int64") - base_ns) / NS
    span_s = max(float(e.max()), 1e-9)
    if len(s) >= 2:
        period_s = float(np.median(np.diff(np.sort(s))))
        if period_s > 0:
            bins = int(min(bins, max(10, span_s / (4 * period_s))))
    edges = np.linspace(0.0, span_s, bins + 1)
    # B(t) = busy seconds up to t, summed over steps: sum_{s<=t}(t-s) - sum_{e<=t}(t-e)
    ss, es = np.sort(s), np.sort(e)
    cs, ce = np.concatenate([[0.0], np.cumsum(ss)]), np.concatenate([[0.0], np.cumsum(es)])
    ns_ = np.searchsorted(ss, edges, side="right")
    ne_ = np.searchsorted(es, edges, side="right")
    busy = (edges * ns_ - cs[ns_]) - (edges * ne_ - ce[ne_])
    frac = np.clip(np.diff(busy) / np.diff(edges), 0.0, 1.0)
    mids = (edges[:-1] + edges[1:]) / 2
    return Timeline("device busy (engine steps)", mids + (base_ns - origin_ns) / NS, frac, "engine steps")


def _binned_steps(steps: pd.DataFrame, col: str, origin_ns: float, bins: int, how: str) -> tuple[np.ndarray, np.ndarray] | None:
    if steps is None or steps.empty or col not in steps or not steps[col].notna().any():
        return None
    sub = steps.loc[steps[col].notna(), ["end_ns", col]]
    t = sub["end_ns"].to_numpy(dtype="float64")
    if len(sub) <= bins:
        return (t - origin_ns) / NS, sub[col].to_numpy(dtype="float64")
    edges = _bin_edges(float(t.min()), float(t.max()), bins)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    g = pd.Series(sub[col].to_numpy(dtype="float64")).groupby(idx)
    agg = g.max() if how == "max" else g.mean()
    mids = (edges[:-1] + edges[1:]) / 2
    return (mids[agg.index.to_numpy()] - origin_ns) / NS, agg.to_numpy()


def _series_line(tables: Tables, name: str, origin_ns: float, label: str) -> Timeline | None:
    ser = series_frame(tables, name)
    if ser.empty:
        return None
    g = ser.groupby("ts_s")["value"].mean().sort_index()
    return Timeline(label, (g.index.to_numpy() * NS - origin_ns) / NS, g.to_numpy(), str(ser["source"].iloc[0]))


def kv_timeline(tables: Tables, origin_ns: float, bins: int = 240) -> Timeline | None:
    """KV-cache usage (0..1) over time: the engine's gauge when scraped, else engine steps."""
    line = _series_line(tables, stages.SERIES_KV_USAGE, origin_ns, "KV-cache usage (/metrics)")
    if line is not None:
        return line
    b = _binned_steps(tables.steps, "kv_usage_ratio", origin_ns, bins, "max")
    return Timeline("KV-cache usage (engine steps)", b[0], b[1], "engine steps") if b else None


def queue_timelines(tables: Tables, origin_ns: float, bins: int = 240) -> list[Timeline]:
    """Waiting and running sequences over time (the engine's gauges, else engine steps)."""
    out = []
    for series_name, col, label in ((stages.SERIES_WAITING, "waiting_seqs", "waiting"),
                                    (stages.SERIES_RUNNING, "running_seqs", "running")):
        line = _series_line(tables, series_name, origin_ns, f"{label} (/metrics)")
        if line is None:
            b = _binned_steps(tables.steps, col, origin_ns, bins, "mean")
            line = Timeline(f"{label} (engine steps)", b[0], b[1], "engine steps") if b else None
        if line is not None:
            out.append(line)
    return out
