"""Theme: TTFT against load. Requests in flight at each arrival (writes ``ctx.inflight_at``),
the TTFT-vs-concurrency curve, its knee and flat region, and per-stream decode speed by level.
Units: requests in flight, seconds, x (ratios of TTFT or speed), tokens/s, decode steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rules.features.context import FeatureContext
from rules.features.numeric import NS, as_float, num_col, segment_numbers


def inflight(ctx: FeatureContext) -> None:
    """In-flight requests at each arrival (itself included), from start/end intervals."""
    req = ctx.req_all
    ctx.inflight_at = pd.Series(np.nan, index=ctx.steady.index, dtype="float64")
    if len(req) == 0:
        return
    start = num_col(req, "start_ns").to_numpy()
    e2e = num_col(req, "e2e_s").to_numpy()
    ttft = num_col(req, "ttft_s").to_numpy()
    dur = np.where(np.isfinite(e2e), e2e, ttft)
    good = np.isfinite(start) & np.isfinite(dur)
    s = np.sort(start[good])
    e = np.sort(start[good] + dur[good] * NS)
    q = num_col(ctx.steady, "start_ns").to_numpy()
    n_started = np.searchsorted(s, q, side="right")
    n_ended = np.searchsorted(e, q, side="right")
    ctx.inflight_at = pd.Series(np.maximum(n_started - n_ended, 1).astype("float64"), index=ctx.steady.index)


def concurrency(ctx: FeatureContext) -> None:
    """Median TTFT by in-flight level (or labelled sweep point), the knee, and decode speed by level."""
    st = ctx.steady
    names = ("inflight_at_arrival_p50", "inflight_at_arrival_max", "ttft_by_inflight", "ttft_concurrency_ratio",
             "concurrency_knee", "ttft_knee_jump_ratio", "ttft_pre_knee_rise", "concurrency_flat_levels",
             "itl_at_top_concurrency_s", "ttft_rise_per_itl", "decode_speed_by_inflight", "decode_speed_hold_ratio")
    if len(st) == 0:
        ctx.na(names, "no completed requests")
        return
    x = ctx.inflight_at
    ctx.add("inflight_at_arrival_p50", float(x.median()))
    ctx.add("inflight_at_arrival_max", float(x.max()))
    seg = segment_numbers(st["segment"]) if "segment" in st.columns else None
    # A labelled concurrency sweep is the better x when the probe wrote one.
    if seg is not None and seg["conc"].notna().sum() >= 0.8 * len(st) and seg["conc"].nunique() >= 3:
        x = seg["conc"]
        source = "segments"
    else:
        source = "measured"
    levels = x.dropna()
    min_bin = int(ctx.params["min_bin_requests"])
    if levels.nunique() > int(ctx.params["max_inflight_bins"]):
        bins = pd.qcut(levels, int(ctx.params["max_inflight_bins"]), duplicates="drop")
        key = levels.groupby(bins, observed=True).transform("median")
    else:
        key = levels
    ttft = num_col(st, "ttft_s").loc[key.index]
    g = ttft.groupby(key)
    counts = g.size()
    curve = g.median()[counts >= min_bin].sort_index()
    tpot = num_col(st, "tpot_s").loc[key.index]
    speed = (1.0 / tpot.where(tpot > 0))
    sg = speed.groupby(key)
    scurve = sg.median()[(sg.count() >= min_bin)].sort_index()
    if len(curve) < 3:
        why = (f"in-flight requests at arrival hardly vary ({levels.min():g}..{levels.max():g}); "
               "needs a concurrency sweep or varied load") if len(levels) else "no arrival times"
        ctx.na(names[2:], why)
        return
    ctx.add("ttft_by_inflight", {f"{k:g}": float(v) for k, v in curve.items()}, source=source)
    y = curve.to_numpy()
    xs = curve.index.to_numpy(dtype="float64")
    base = max(y[0], 1e-9)
    ctx.add("ttft_concurrency_ratio", float(y[-1] / base), source=source)
    # The knee is the steepest step between adjacent levels. It is a *sharp* knee (a cliff,
    # "TTFT suddenly worsens") when that single step is steeper than every step before it by
    # ``knee_sharpness`` and larger than the whole rise before it; a curve that climbs from
    # the lowest level on (a serialising server) has none.
    steps = y[1:] / np.maximum(y[:-1], 1e-9)
    k = int(np.argmax(steps))
    before = float(steps[:k].max()) if k > 0 else 1.0
    flat = float(ctx.params["flat_factor"])
    sharp = k >= 1 and steps[k] >= float(ctx.params["knee_sharpness"]) * max(before, 1.0) and steps[k] >= y[k] / base
    b = k if sharp else 0
    if not sharp:
        while b + 1 < len(y) and y[b + 1] <= flat * base:
            b += 1
    if b < len(y) - 1:
        ctx.add("concurrency_knee", float(xs[b]), source=source)
        ctx.add("ttft_knee_jump_ratio", float(y[-1] / max(y[b], 1e-9)), source=source)
    else:
        ctx.add("concurrency_knee", None, "TTFT stays flat across the concurrency range")
        ctx.add("ttft_knee_jump_ratio", 1.0, source=source)
    ctx.add("ttft_pre_knee_rise", float(y[b] / base), source=source)
    ctx.add("concurrency_flat_levels", float(b), source=source)
    itl_req = num_col(st, "itl_p50_s").loc[key.index].groupby(key).median()
    top_itl = as_float(itl_req.get(curve.index[-1]))
    if top_itl:
        ctx.add("itl_at_top_concurrency_s", top_itl, source=source)
        ctx.add("ttft_rise_per_itl", float((y[-1] - y[0]) / top_itl), source=source)
    else:
        ctx.na(("itl_at_top_concurrency_s", "ttft_rise_per_itl"),
               "no ITL at the highest concurrency level")
    if len(scurve) >= 2:
        ctx.add("decode_speed_by_inflight", {f"{k:g}": float(v) for k, v in scurve.items()}, source=source)
        ctx.add("decode_speed_hold_ratio", float(scurve.iloc[-1] / scurve.iloc[0]) if scurve.iloc[0] > 0 else None)
    else:
        ctx.na(names[-2:], "too few requests with two or more output tokens per concurrency level")
