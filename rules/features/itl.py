"""Theme: tokens after the first. Inter-token gaps from token emission times (client first, else
server; else per-request statistics, else the engine's ITL histogram), TPOT, and prefill-decode
interference: gaps that overlap another request's prefill against those that do not.
Units: seconds, x, shares 0..1 of decode time or of gaps, counts of gaps.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import NS, Coverage, name_is, num_col


#: the interference features' source on ttft diagnose's mixed follow-up (read by the rule)
MIXED_SOURCE = "long prompts' TTFT windows vs client token times (black box; ttft diagnose's mixed follow-up)"


def token_gaps(ctx: FeatureContext, span_name: str, pop: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """Gaps between consecutive tokens of steady requests (or of ``pop``'s) (ns start/end, ``gap_s``), or None."""
    pop = ctx.steady if pop is None else pop
    sp = ctx.spans
    key = stages.ATTR_TOKEN_TIMES_NS
    if sp is None or sp.empty or key not in sp.columns:
        return None
    rows = sp.loc[name_is(sp, span_name), ["trace_id", key]]
    rows = rows.loc[rows[key].notna()]
    if rows.empty:
        return None
    tids = rows["trace_id"].to_numpy(dtype=object)
    # keep steady requests only: drop the (usually few) excluded ones by set lookup; string
    # isin on pyarrow strings is a Python loop in pandas, far slower at 1M spans
    all_ids = ctx.tables.requests["trace_id"].to_numpy(dtype=object) if "trace_id" in ctx.tables.requests.columns else []
    steady_ids = set(pop["trace_id"].to_numpy(dtype=object)) if "trace_id" in pop.columns else set()
    excluded = set(all_ids) - steady_ids if len(steady_ids) != len(all_ids) else set()
    keep = np.fromiter((t not in excluded and t in steady_ids for t in tids), dtype=bool, count=len(tids)) \
        if excluded or not steady_ids else np.ones(len(tids), dtype=bool)
    if ctx.window_ns is not None or len(steady_ids) < len(all_ids):
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
    seg_by_tid = dict(zip(pop["trace_id"].to_numpy(dtype=object), pop["segment"].to_numpy(dtype=object))) \
        if "segment" in pop.columns and "trace_id" in pop.columns else {}
    seg = np.array([seg_by_tid.get(t) for t in tid_of], dtype=object)
    return pd.DataFrame({"start_ns": g_start.astype("float64"), "end_ns": g_end.astype("float64"),
                         "gap_s": (g_end - g_start) / NS,
                         "req": owner[1:][same],
                         "segment": seg[owner[1:][same]]})


def gaps_of(ctx: FeatureContext, pop: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """Token gaps of ``pop`` (steady requests by default): from the client's token times when it
    has them, else the server's (as :func:`itl` chooses)."""
    client = token_gaps(ctx, stages.SPAN_CLIENT_REQUEST, pop)
    return client if client is not None and len(client) else token_gaps(ctx, stages.SPAN_REQUEST, pop)


def itl(ctx: FeatureContext) -> None:
    """ITL percentiles and max, TPOT p50/p99 (seconds), then the interference comparison."""
    client = token_gaps(ctx, stages.SPAN_CLIENT_REQUEST)
    server = token_gaps(ctx, stages.SPAN_REQUEST)
    gaps = client if client is not None and len(client) else server
    names = ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s")
    if gaps is None or gaps.empty:
        ctx.na(STALL_NAMES, "needs token emission times (ttft.token_times_ns)")
        p50 = num_col(ctx.steady, "itl_p50_s").dropna()
        if len(p50):  # per-request statistics when the raw token times are gone
            ctx.add("itl_p50_s", float(p50.median()), source="per-request medians")
            p99 = num_col(ctx.steady, "itl_p99_s").dropna()
            p99 = p99 if len(p99) else p50  # a capture with per-request medians only
            top = num_col(ctx.steady, "itl_max_s").dropna()
            ctx.add("itl_p90_s", float(np.percentile(p99, 90)))
            ctx.add("itl_p99_s", float(np.percentile(p99, 99)))
            ctx.add("itl_max_s", float(top.max() if len(top) else p99.max()))
        elif not _itl_from_series(ctx, names):
            ctx.na(names, "needs token emission times (ttft.token_times_ns) with two or more tokens, "
                   "or an itl_s series from the engine's metrics")
    else:
        q = np.percentile(gaps["gap_s"].to_numpy(), [50, 90, 99])
        src = "client token times" if gaps is client else "server token times"
        for n, v in zip(names, q):
            ctx.add(n, v, source=src)
        ctx.add("itl_max_s", float(gaps["gap_s"].max()), source=src)
        stream_stalls(ctx, gaps, float(q[0]), src)
    tpot = num_col(ctx.steady, "tpot_s").dropna()
    ctx.add("tpot_p50_s", float(tpot.median()) if len(tpot) else None, None if len(tpot) else "no request with 2+ output tokens")
    ctx.add("tpot_p99_s", float(np.percentile(tpot, 99)) if len(tpot) else None, None if len(tpot) else "no request with 2+ output tokens")
    interference(ctx, server, client)


STALL_NAMES = ("stream_stall_frac", "stream_stall_steps_p50", "stream_stall_n")


def emission_times_ns(gaps: pd.DataFrame, by_req: pd.api.typing.DataFrameGroupBy | None = None) -> np.ndarray:
    """Every token's emission time (ns), sorted: each gap's start, and each stream's last token.
    ``by_req``: ``gaps.groupby("req")`` when the caller has it."""
    by_req = gaps.groupby("req") if by_req is None else by_req
    return np.sort(np.concatenate([gaps["start_ns"].to_numpy(), by_req["end_ns"].max().to_numpy()]))


def stream_stalls(ctx: FeatureContext, gaps: pd.DataFrame, itl_p50_s: float, src: str) -> None:
    """Streams stopped mid-answer while others went on: an engine that evicted them (preempted, to
    free KV blocks) and later resumed them. A stream stalls when its longest token gap is at least
    ``[features] stall_steps_min`` decode steps (ITL p50) and the other streams emitted tokens in at
    least ``stall_others_min`` of those steps: the engine kept stepping, without it. A pause of the
    whole engine (a long prefill, a collection) stops every stream at once and is not one.

    * ``stream_stall_frac`` — the share of streams (steady, 2+ token gaps) that stalled;
    * ``stream_stall_steps_p50`` — their longest gaps' median, in decode steps;
    * ``stream_stall_n`` — how many streams were judged.
    Units: share, steps, requests. Runs in :func:`itl`, with its gaps (ns start/end, ``req``)."""
    if not itl_p50_s or itl_p50_s <= 0 or gaps.empty:
        ctx.na(STALL_NAMES, "needs token emission times with a positive ITL p50")
        return
    by_req = gaps.groupby("req")  # one grouping for the counts, the last tokens and the longest gaps
    counts = by_req.size()
    judged = counts >= 2
    if not judged.any():
        ctx.na(STALL_NAMES, "no stream with three or more tokens")
        return
    times = emission_times_ns(gaps, by_req)
    longest = gaps.loc[by_req["gap_s"].idxmax()[judged]]
    steps = longest["gap_s"].to_numpy() / itl_p50_s
    inside = (np.searchsorted(times, longest["end_ns"].to_numpy(), side="left")
              - np.searchsorted(times, longest["start_ns"].to_numpy(), side="right"))
    p = ctx.params
    stalled = (steps >= float(p["stall_steps_min"])) & (inside >= float(p["stall_others_min"]) * steps)
    how = f"{src}: a stream's longest gap >= {p['stall_steps_min']} decode steps while others streamed"
    ctx.add("stream_stall_frac", float(stalled.mean()), source=how)
    ctx.add("stream_stall_steps_p50", float(np.median(steps[stalled])) if stalled.any() else None,
            None if stalled.any() else "no stream stalled", source=how)
    ctx.add("stream_stall_n", float(judged.sum()), source=src)


def _itl_from_series(ctx: FeatureContext, names: tuple[str, ...]) -> bool:
    """ITL from the engine's itl_s histogram (windowed p50/p99, else the windowed mean), weighted by
    generated tokens per window; False when the engine exports no ITL."""
    S = stages
    w = S.SERIES_GENERATION_TOKENS_PER_S
    p50 = ctx.wmean(S.SERIES_ITL_S + "_p50", w)
    how = "prometheus"
    if p50 is None:
        p50 = ctx.wmean(S.SERIES_ITL_S, w)  # e.g. llama.cpp: Δ generation s / Δ tokens (a mean)
    if p50 is None:
        return False
    ctx.add("itl_p50_s", p50, source=how)
    p99 = ctx.wmean(S.SERIES_ITL_S + "_p99", w)
    ctx.add("itl_p99_s", p99, None if p99 is not None else "no itl_s_p99 series (ITL histogram buckets)",
            source=how)
    ctx.na(names[1:2] + names[3:], "the engine's metrics give ITL p50/p99 only")
    return True


def interference(ctx: FeatureContext, server: pd.DataFrame | None, client: pd.DataFrame | None) -> None:
    """Token gaps overlapping a prefill (engine steps, prefill spans, or other requests' TTFT windows)
    against the others; called by :func:`itl` with its gaps."""
    names = ("itl_during_prefill_p50_s", "itl_during_prefill_mean_s", "itl_without_prefill_p50_s",
             "itl_interference_ratio", "itl_prefill_stall_share", "itl_tail_during_prefill_frac", "itl_tail_gaps_n",
             "itl_during_prefill_frac")
    steps = ctx.steps
    windows: tuple[np.ndarray, np.ndarray] | None = None
    gaps = None
    src = ""
    if server is not None and len(server) and len(steps) and (num_col(steps, "prefill_tokens") > 0).any():
        ps = steps.loc[num_col(steps, "prefill_tokens") > 0]
        windows = (ps["start_ns"].to_numpy(dtype="float64"), ps["end_ns"].to_numpy(dtype="float64"))
        gaps, src = server, "engine steps with prefill tokens vs server token times"
    elif server is not None and len(server) and ctx.spans is not None and len(ctx.spans):
        pre = ctx.spans.loc[name_is(ctx.spans, stages.PREFILL)]
        if len(pre):
            windows = (pre["start_ns"].to_numpy(dtype="float64"), pre["end_ns"].to_numpy(dtype="float64"))
            gaps, src = server, "prefill stage spans vs server token times"
    mixed = token_gaps(ctx, stages.SPAN_CLIENT_REQUEST, ctx.mixed) if windows is None and len(ctx.mixed) else None
    if mixed is not None and len(mixed):
        # ttft diagnose's mixed follow-up: the long prompts' TTFT windows (queue and prefill) are the prefills
        # that matter; the short streams' gaps during them against their gaps otherwise
        mx = ctx.mixed
        tok = num_col(mx, "input_tokens").to_numpy(dtype="float64")
        long = tok >= float(ctx.params["hol_long_factor"]) * float(np.nanmedian(tok)) if np.isfinite(tok).any() else tok > 0
        a = num_col(mx, "start_ns").to_numpy()[long]
        b = a + num_col(mx, "ttft_s").to_numpy()[long] * NS
        good = np.isfinite(a) & np.isfinite(b)
        windows = (a[good], b[good])
        gaps, src = mixed, MIXED_SOURCE
    if mixed is not None and len(mixed):  # the users' ITL target on its gaps, however few overlap a long prefill
        _mixed_slo(ctx, mixed["gap_s"].to_numpy())
    else:
        ctx.na(("itl_mixed_slo",), "no mixed follow-up (ttft diagnose) in the capture")
    if windows is None and client is not None and len(client):
        st = ctx.steady
        a = num_col(st, "start_ns").to_numpy()
        b = (a + num_col(st, "ttft_s").to_numpy() * NS)
        good = np.isfinite(a) & np.isfinite(b)
        windows = (a[good], b[good])
        gaps, src = client, "other requests' TTFT windows vs client token times (black box)"
        stall_ends(ctx, client, np.sort(b[good]))
    else:
        ctx.na(ALIGNED_NAMES, "judged from the client's token times only when the server's prefill windows are unknown")
    if windows is None or gaps is None:
        ctx.na(names, "needs token times and prefill windows (engine steps, prefill spans or other requests' arrivals)")
        return
    cov = Coverage(*windows)
    overlap = cov.between(gaps["start_ns"].to_numpy(), gaps["end_ns"].to_numpy())
    during = overlap > 0
    min_n = int(ctx.params["min_itl_gaps"])
    n_d, n_w = int(during.sum()), int((~during).sum())
    ctx.add("itl_during_prefill_frac", float(during.mean()), source=src)
    if n_d < min_n or n_w < min_n:
        ctx.na(names[:5], f"too few token gaps to compare ({n_d} during prefills, {n_w} without; needs {min_n} each)")
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
    ctx.add("itl_during_prefill_p50_s", d50, source=src)
    ctx.add("itl_during_prefill_mean_s", dmean, source=src)
    ctx.add("itl_without_prefill_p50_s", w50, source=src)
    # mean, not median, of the gaps during prefills: a few long prompts stall many gaps a lot
    ctx.add("itl_interference_ratio", dmean / w50 if w50 > 0 else None, source=src)
    total = float(g.sum())
    lost = float(np.clip(g[during] - w50, 0, None).sum())
    ctx.add("itl_prefill_stall_share", lost / total if total > 0 else None, source=src)
    # the ITL tail: which share of the slowest 1% of token gaps overlap a prefill
    tail = g >= np.percentile(g, 99)
    ctx.add("itl_tail_during_prefill_frac", float(during[tail].mean()) if tail.any() else None, source=src)
    ctx.add("itl_tail_gaps_n", float(tail.sum()), source=src)


ALIGNED_NAMES = ("itl_stall_end_first_token_frac", "itl_stall_end_first_token_chance", "itl_stall_gaps_n")


def stall_ends(ctx: FeatureContext, gaps: pd.DataFrame, first_ns: np.ndarray) -> None:
    """Client only: do the streams' stalls end as another request's first token arrives? A prefill
    that stalls the running streams ends with its own first token, and the stalled streams' next
    token follows within a step or two; a stall from anything else ends at no particular first token.

    A stall is a token gap of ``[features] stall_gap_steps`` decode steps (ITL p50) or more; it
    *ends at a first token* when some steady request's first token (``first_ns``, sorted, client ns)
    lies in its last stretch: max(3 decode steps, a quarter of the gap) before its end. The chance
    of that with first tokens at their mean rate is the Poisson 1 - exp(-rate x stretch), averaged
    over the stalls. Units: shares 0..1, count of stalls."""
    g = gaps["gap_s"].to_numpy()
    p50 = float(np.median(g)) if len(g) else 0.0
    if p50 <= 0 or len(first_ns) < 2:
        ctx.na(ALIGNED_NAMES, "needs a positive ITL p50 and two or more first tokens")
        return
    stall = g >= float(ctx.params["stall_gap_steps"]) * p50
    n = int(stall.sum())
    ctx.add("itl_stall_gaps_n", float(n), source="client token times")
    if n == 0:
        ctx.na(ALIGNED_NAMES[:2], "no token gap is a stall")
        return
    end = gaps["end_ns"].to_numpy()[stall]
    stretch = np.maximum(3.0 * p50, 0.25 * g[stall]) * NS
    hit = np.searchsorted(first_ns, end, side="right") - np.searchsorted(first_ns, end - stretch, side="left") > 0
    rate = (len(first_ns) - 1) / max(float(first_ns[-1] - first_ns[0]), 1.0)  # first tokens per ns
    how = "client token times: stalls ending within max(3 steps, a quarter of the stall) after a first token"
    ctx.add("itl_stall_end_first_token_frac", float(hit.mean()), source=how)
    ctx.add("itl_stall_end_first_token_chance", float(np.mean(1.0 - np.exp(-rate * stretch))), source=how)


def _mixed_slo(ctx: FeatureContext, gaps_s: np.ndarray) -> None:
    """``itl_mixed_slo``: each ITL target given, against the mixed follow-up's token gaps (seconds)."""
    out: dict[str, dict[str, float | bool]] = {}
    for key, target in (ctx.slo or {}).items():
        metric, _, pct = key.partition("_")
        if metric != "itl" or not (pct == "max" or (pct.startswith("p") and pct[1:].replace(".", "", 1).isdigit())):
            continue
        val = float(gaps_s.max() if pct == "max" else np.percentile(gaps_s, float(pct[1:])))
        out[key] = {"target_s": float(target), "value_s": val, "met": bool(val <= target)}
    ctx.add("itl_mixed_slo", out or None, None if out else "no ITL target given")
