"""Theme: the engine's step loop. Time between engine steps while requests were inside the engine
(queued or running): the loop's own CPU work (scheduling, input preparation, detokenizing,
bookkeeping) during which the device runs nothing and every request waits.

A request is *inside the engine* from the start of its first ``queue`` span (it reached the
scheduler; tokenizing and a front end's wait come before) to the end of its request span, less
the time it was handed to another process: with disaggregated prefill/decode, from its
``kv_transfer`` span's start to the end of its decode-side ``queue`` span (``ttft.pd.side =
"decode"``), it waits for the link and the decode side's admission, not for this loop. A gap
between two consecutive steps counts for the part of it when some request was inside the engine:
an engine with work that is not stepping. Only the time from the first step to the last counts
(before its first step an engine may still be starting: that is a cold start). Needs engine-step
spans and queue spans (the bundled engine writes both, and ``ttft instrument`` on ``transformers
serve --continuous-batching``), with the steps the requests' tokens needed traced; other captures
leave every feature unavailable with the reason.

* ``loop_idle_share`` — the time some request was inside the engine with no step running, over
  the time some request was inside it: the loop's working time spent outside steps (share 0..1);
* ``loop_gap_p50_s`` — the median such gap (s); ``loop_gaps_n`` — how many there were (count);
* ``loop_idle_share_of_ttft`` / ``loop_idle_share_of_ttft_tail`` — the gaps' time inside each
  request's engine window up to its first token, over its TTFT: summed over the steady requests,
  and over the slowest ``tail_quantile`` of them (share 0..1).

Runs on the feature computation's thread, after :func:`rules.features.device.device_busy`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.capture import attribute
from rules.features.context import FeatureContext
from rules.features.numeric import Coverage, name_is, num_col

#: fewest engine-step spans, as a share of the decode steps the requests' tokens needed, for the
#: time between steps to mean a loop that did not step (not steps left out of the trace)
STEPS_TRACED_MIN = 0.8
NAMES = ("loop_idle_share", "loop_gap_p50_s", "loop_gaps_n", "loop_idle_share_of_ttft", "loop_idle_share_of_ttft_tail")
SOURCE = "engine-step spans, gaps while a request was queued or running"


def _pieces(a: np.ndarray, b: np.ndarray, off_a: np.ndarray, off_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each window [a, b] less its hand-off [off_a, off_b] (NaN: none) as two pieces per window, the
    first pieces then the second ones (an empty piece has start == end); ns."""
    none = ~(np.isfinite(off_a) & np.isfinite(off_b))
    cut_a = np.where(none, b, np.clip(off_a, a, b))
    cut_b = np.where(none, b, np.clip(off_b, a, b))
    return np.concatenate([a, cut_b]), np.concatenate([cut_a, b])


def _handoffs(ctx: FeatureContext) -> tuple[pd.Series, pd.Series]:
    """By trace id: when each request was handed to another process (its ``kv_transfer`` span's start)
    and when it came back (the end of that span or of its decode-side ``queue`` span, the later); ns."""
    sp = ctx.spans
    kv = sp.loc[name_is(sp, stages.KV_TRANSFER)]
    if kv.empty:
        return pd.Series(dtype="float64"), pd.Series(dtype="float64")
    q = sp.loc[name_is(sp, stages.QUEUE)]
    dq = q.loc[(attribute(q, stages.ATTR_PD_SIDE) == stages.PD_SIDE_DECODE).to_numpy()]
    back = pd.concat([kv[["trace_id", "end_ns"]], dq[["trace_id", "end_ns"]]])
    return (kv.groupby("trace_id", observed=True)["start_ns"].min().astype("float64"),
            back.groupby("trace_id", observed=True)["end_ns"].max().astype("float64"))


def _engine_windows(ctx: FeatureContext) -> pd.DataFrame:
    """Each request's time inside the engine: trace_id, ``in_ns`` (first queue span start), ``out_ns``
    (its request span's end), ``first_ns`` (its first token, server clock), ``off_ns`` / ``back_ns``
    (its hand-off to another process and return, NaN without one); empty without queue spans."""
    sp = ctx.spans
    req = ctx.req_all
    if sp is None or sp.empty or not len(req) or "server_end_ns" not in req.columns:
        return pd.DataFrame()
    q = sp.loc[name_is(sp, stages.QUEUE), ["trace_id", "start_ns"]]
    if q.empty:
        return pd.DataFrame()
    first_in = q.groupby("trace_id", observed=True)["start_ns"].min()
    out = pd.DataFrame({"trace_id": req["trace_id"].to_numpy(dtype=object),
                        "out_ns": num_col(req, "server_end_ns").to_numpy(dtype="float64"),
                        "first_ns": num_col(req, "first_token_ns").to_numpy(dtype="float64"),
                        "output_tokens": num_col(req, "output_tokens").to_numpy(dtype="float64")})
    out["in_ns"] = out["trace_id"].map(first_in).astype("float64")
    off, back = _handoffs(ctx)
    out["off_ns"] = out["trace_id"].map(off).astype("float64")
    out["back_ns"] = out["trace_id"].map(back).astype("float64")
    return out.loc[np.isfinite(out["in_ns"]) & np.isfinite(out["out_ns"])]


def loop(ctx: FeatureContext) -> None:
    """Time inside the engine with no step running, over the loop's working time and over TTFT."""
    busy = ctx.busy
    if busy is None or not len(ctx.steps):
        ctx.na(NAMES, "no engine-step spans")
        return
    win = _engine_windows(ctx)
    if win.empty:
        ctx.na(NAMES, "no queue spans: when requests entered the engine is unknown")
        return
    traced = _steps_traced(ctx.steps, win)
    if traced is not None and traced < STEPS_TRACED_MIN:
        ctx.na(NAMES, f"the engine-step spans hold {traced:.0%} of the decode steps the requests' tokens needed "
                      "(steps not traced, or their spans dropped): the time between them is unknown")
        return
    # the time some request was inside the engine, cut to the steps' span (a capture's ends hold no steps)
    lo, hi = float(busy.s[0]), float(busy.e[-1])
    inside = Coverage(*_pieces(win["in_ns"].to_numpy().clip(lo, hi), win["out_ns"].to_numpy().clip(lo, hi),
                               win["off_ns"].to_numpy(), win["back_ns"].to_numpy()))
    worked = inside.total
    if worked <= 0:
        ctx.na(NAMES, "no request inside the engine while it stepped")
        return
    stepping = float(busy.between(inside.s, inside.e).sum())
    ctx.add("loop_idle_share", max(worked - stepping, 0.0) / worked, source=SOURCE)
    # the gaps between steps that fell inside that time
    a, b = busy.e[:-1], busy.s[1:]
    held = inside.between(a, b)
    gaps_s = held[held > 0] / 1e9
    ctx.add("loop_gaps_n", float(len(gaps_s)), source=SOURCE)
    ctx.add("loop_gap_p50_s", float(np.median(gaps_s)) if len(gaps_s) else None,
            None if len(gaps_s) else "no gap between steps while requests waited", source=SOURCE)
    _share_of_ttft(ctx, win, busy)


def _steps_traced(steps: pd.DataFrame, win: pd.DataFrame) -> float | None:
    """Steps that overlap each request's decode (first token to end), summed, over the tokens after
    the first, summed: about 1 or more when every step was traced (each decode step emits one token
    per running request); None when no request had two or more tokens."""
    w = win.loc[np.isfinite(win["first_ns"]) & (win["output_tokens"] >= 2)]
    need = float((w["output_tokens"] - 1).sum())
    if need <= 0:
        return None
    starts = np.sort(steps["start_ns"].to_numpy(dtype="float64"))
    ends = np.sort(steps["end_ns"].to_numpy(dtype="float64"))
    a, b = w["first_ns"].to_numpy(), w["out_ns"].to_numpy()
    seen = np.searchsorted(starts, b, side="left") - np.searchsorted(ends, a, side="right")
    return float(np.clip(seen, 0, None).sum()) / need


def _share_of_ttft(ctx: FeatureContext, win: pd.DataFrame, busy: Coverage) -> None:
    """Each steady request's time inside the engine before its first token with no step running, over its TTFT."""
    st = ctx.steady
    if not len(st) or "trace_id" not in st.columns:
        ctx.na(NAMES[3:], "no completed requests")
        return
    w = win.drop_duplicates("trace_id").set_index("trace_id")
    tids = st["trace_id"].to_numpy(dtype=object)
    lo = w["in_ns"].reindex(tids).to_numpy(dtype="float64").clip(float(busy.s[0]), None)  # as loop() cuts it
    hi = w["first_ns"].reindex(tids).to_numpy(dtype="float64")
    ttft = num_col(st, "ttft_s").to_numpy(dtype="float64")
    ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(ttft) & (ttft > 0) & (hi >= lo)
    if ok.sum() < 3:
        ctx.na(NAMES[3:], "fewer than 3 completed requests with a queue span and a first token")
        return
    a, b = _pieces(lo[ok], hi[ok], w["off_ns"].reindex(tids).to_numpy(dtype="float64")[ok],
                   w["back_ns"].reindex(tids).to_numpy(dtype="float64")[ok])
    n = int(ok.sum())
    idle = ((b - a) - busy.between(a, b)).clip(0, None)
    lost = (idle[:n] + idle[n:]) / 1e9
    t = ttft[ok]
    ctx.add("loop_idle_share_of_ttft", float(lost.sum() / t.sum()), source=SOURCE)
    cut = t >= np.quantile(t, float(ctx.params["tail_quantile"]))
    ctx.add("loop_idle_share_of_ttft_tail", float(lost[cut].sum() / t[cut].sum()), source=SOURCE)
