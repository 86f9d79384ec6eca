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
    """In-flight requests at each arrival (itself included), from start/end intervals; and
    ``starts_after_end_frac``, the share of the ``starts_n`` steady requests sent within
    ``closed_loop_gap_s`` after another's end (high in a closed loop, where the client holds the
    concurrency), and ``starts_after_end_control``, the same window two gaps earlier (what
    chance gives: an open loop's arrivals do not wait for ends)."""
    req = ctx.req_all
    ctx.inflight_at = pd.Series(np.nan, index=ctx.steady.index, dtype="float64")
    if len(req) == 0:
        ctx.na(("starts_after_end_frac", "starts_after_end_control", "starts_n"), "no requests")
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
    # closed or open loop, from the arrivals themselves (any load generator): a closed loop sends
    # the next request the moment one ends, so starts follow ends within a small gap far more
    # often than the same window a little earlier does (the control: what chance gives)
    gap_ns = float(ctx.params["closed_loop_gap_s"]) * NS
    qs = q[np.isfinite(q)]
    names = ("starts_after_end_frac", "starts_after_end_control", "starts_n")
    if len(qs) < int(ctx.params["min_fit_requests"]) or not len(e):
        ctx.na(names, "too few requests to tell a closed loop from an open one")
        return

    def share_after_end(at: np.ndarray) -> float:
        i = np.searchsorted(e, at, side="right") - 1
        last = np.where(i >= 0, e[np.clip(i, 0, None)], -np.inf)
        return float(np.mean(at - last <= gap_ns))

    ctx.add("starts_after_end_frac", share_after_end(qs))
    ctx.add("starts_after_end_control", share_after_end(qs - 2 * gap_ns))
    ctx.add("starts_n", int(len(qs)))


def decoding_at_once(df: pd.DataFrame, level: pd.Series) -> pd.Series:
    """By level (requests in flight): the 90th percentile, over the level's first tokens, of how
    many of its streams were decoding at that instant (between their first token and their end,
    itself included). A server that admits L at a time keeps it near L however many are in flight;
    one that runs all of them (sharing compute) lets it follow the level."""
    start = num_col(df, "start_ns").to_numpy()
    first = start + num_col(df, "ttft_s").to_numpy() * NS
    end = start + num_col(df, "e2e_s").to_numpy() * NS
    lv = level.to_numpy()
    out = {}
    for v in np.unique(lv[np.isfinite(lv)]):
        m = (lv == v) & np.isfinite(first) & np.isfinite(end)
        f, e = first[m], end[m]
        if len(f):
            counts = ((f[None, :] <= f[:, None]) & (e[None, :] > f[:, None])).sum(axis=1)
            out[float(v)] = float(np.percentile(counts, 90))
    return pd.Series(out, dtype="float64").sort_index()


def decode_cap(at_once: pd.Series, share: float) -> float | None:
    """The most streams decoding at once over a ramp's levels, when its top level had at least
    1 / ``share`` times as many in flight (and 4 or more): a limit on what runs at once; None
    when decoding followed the load."""
    if at_once.empty:
        return None
    cap, top = float(at_once.max()), float(at_once.index[-1])
    return cap if top >= 4 and cap <= share * top else None


def long_ramp(ctx: FeatureContext) -> None:
    """ttft diagnose's long ramp (``ctx.long_ramp``: N in flight at a prompt several times the
    ramp's) against the short ramp (segments ``concurrency=N``, the baseline at 1).

    * ``long_ramp_decode_cap`` / ``long_ramp_short_decode_cap`` — the most streams decoding at
      once (:func:`decoding_at_once`) when that stays at most ``long_ramp_cap_share`` of the
      requests in flight at the ramp's top (:func:`decode_cap`): the server admits that many at a
      time. At the long / short prompt; the short one is None when decoding followed the load
      (then ``long_ramp_short_flat`` = 1 and its most decoding at once is a lower bound);
      ``long_ramp_decode_max`` / ``long_ramp_top`` — the long ramp's most decoding at once and
      its highest level, capped or not (the most is None when the ramp stopped under 4 in flight
      with no more than that share decoding at once: too few levels to tell a cap from none).
    * ``long_ramp_knee_ratio`` — short / long cap (the short ramp's most decoding at once when
      uncapped): how many times fewer requests are admitted at the long prompt.
    * ``long_ramp_token_ratio`` — (long prompt + output) / (short prompt + output) tokens: how
      many times more each request holds. A limit in tokens held (KV capacity) gives a knee
      ratio near it; a limit in requests, near 1.
    * ``long_ramp_wait_share`` — at the long ramp's top level, the part of TTFT p50 above its
      lone request's: what waiting costs there.
    Units: requests, x, tokens, share.
    """
    names = ("long_ramp_decode_cap", "long_ramp_short_decode_cap", "long_ramp_knee_ratio", "long_ramp_token_ratio",
             "long_ramp_short_flat", "long_ramp_prompt_tokens", "long_ramp_wait_share",
             "long_ramp_decode_max", "long_ramp_top")
    lr = ctx.long_ramp
    if len(lr) == 0:
        ctx.na(names, "no long ramp (ttft diagnose runs one when prompt work, a KV limit or a queue leads)")
        return
    short = ctx.steady
    seg = segment_numbers(short["segment"]) if "segment" in short.columns else None
    if seg is None:
        ctx.na(names, "the short ramp is not labelled")
        return
    short = short.loc[seg["conc"].notna() & seg["prompt"].isna()]
    s_level = seg.loc[short.index, "conc"]
    l_level = pd.to_numeric(lr["segment"].astype(str).str.split("=").str[1], errors="coerce")
    if l_level.nunique() < 3 or s_level.nunique() < 3:
        ctx.na(names, f"too few levels (long ramp {l_level.nunique()}, short ramp {s_level.nunique()}; 3 each)")
        return
    share = float(ctx.params["long_ramp_cap_share"])
    l_once, s_once = decoding_at_once(lr, l_level), decoding_at_once(short, s_level)
    lc, sc = decode_cap(l_once, share), decode_cap(s_once, share)
    l_tok = float(num_col(lr, "input_tokens").median())
    s_tok = float(num_col(short, "input_tokens").median())
    out = float(num_col(pd.concat([short, lr]), "output_tokens").median())
    lone = float(num_col(lr, "ttft_s")[l_level == 1].median())
    top = float(num_col(lr, "ttft_s")[l_level == l_level.max()].median())
    ctx.add("long_ramp_prompt_tokens", l_tok)
    ctx.add("long_ramp_token_ratio", (l_tok + out) / (s_tok + out) if s_tok + out > 0 else None)
    ctx.add("long_ramp_wait_share", max(0.0, 1.0 - lone / top) if top > 0 else None)
    # the most decoding at once, where it followed the load (no cap); a ramp that stopped under 4 in
    # flight with fewer decoding at once than that share says neither (too few to tell a cap)
    followed = float(l_once.max()) > share * float(l_level.max())
    ctx.add("long_ramp_decode_max", float(l_once.max()) if lc is not None or followed else None,
            None if lc is not None or followed else
            f"the long ramp stopped at {l_level.max():g} in flight with {l_once.max():g} decoding at once: too few "
            "levels to tell a cap from none")
    ctx.add("long_ramp_top", float(l_level.max()))
    ctx.add("long_ramp_short_decode_cap", sc, None if sc is not None else
            f"the short ramp's streams decoded together up to {s_once.max():g} at once (to {s_level.max():g} in flight)")
    if lc is None:
        ctx.na(("long_ramp_decode_cap", "long_ramp_knee_ratio", "long_ramp_short_flat"),
               f"the long ramp's streams decoded together up to {l_once.max():g} at once at {l_level.max():g} in "
               "flight: no limit on what runs at once shows")
        return
    ctx.add("long_ramp_decode_cap", lc)
    ctx.add("long_ramp_knee_ratio", (sc if sc is not None else float(s_once.max())) / lc)
    ctx.add("long_ramp_short_flat", 1.0 if sc is None else 0.0)


def long_outputs(ctx: FeatureContext) -> None:
    """ttft diagnose's longout follow-up (``ctx.long_out``: the long ramp's prompt at one level in
    flight with answers several times longer). ``long_out_decode_max``: the most of its streams
    decoding at once (:func:`decoding_at_once`); ``long_out_output_x``: its median answer / the long
    ramp's (a server that stops at EOS, ignoring min_tokens, may not lengthen them). A limit on what
    runs at once holds as many or fewer; a stage that takes prompts one at a time before the
    engine lets more of the longer decode windows overlap. Units: requests, x."""
    names = ("long_out_decode_max", "long_out_output_x")
    lo, lr = ctx.long_out, ctx.long_ramp
    if len(lo) == 0 or len(lr) == 0:
        ctx.na(names, "no longout follow-up (ttft diagnose runs one when a cap in the long ramp leads)")
        return
    once = decoding_at_once(lo, pd.Series(1.0, index=lo.index))
    out_lo, out_lr = float(num_col(lo, "output_tokens").median()), float(num_col(lr, "output_tokens").median())
    if once.empty or not out_lr > 0:
        ctx.na(names, "no completed longout request with its answer's length")
        return
    ctx.add("long_out_decode_max", float(once.max()))
    ctx.add("long_out_output_x", out_lo / out_lr)


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


#: the one-level line features besides ``single_level``'s first names (left out together)
LINE_EXTRA = ("decode_alone_frac", "first_token_after_end_n", "first_token_after_end_order_frac",
              "first_token_after_end_order_control")


def _clusters(t_ns: np.ndarray, merge_ns: float) -> np.ndarray:
    """The first time of each cluster of sorted times (times within ``merge_ns`` of the one
    before belong to its cluster)."""
    if len(t_ns) == 0:
        return t_ns
    keep = np.concatenate(([True], np.diff(t_ns) > merge_ns))
    return t_ns[keep]


def _after_end_in_order(ends_ns: np.ndarray, firsts_ns: np.ndarray, start_ns: np.ndarray, first_ns: np.ndarray,
                        merge_ns: float) -> tuple[float, float]:
    """(share, chance): of the waiting requests, the share whose first token's preceding event
    (stream ends and other streams' first tokens, each clustered within ``merge_ns``: one
    engine step) is a stream end during their wait; and the share of end clusters among all
    clusters, what the preceding event is by chance. Served in line, ends and first tokens
    alternate, however long the prefill between them (a cohort's can outlast its decode)."""
    end_c = _clusters(ends_ns, merge_ns)
    first_c = _clusters(firsts_ns, merge_ns)
    if len(end_c) == 0 or len(first_c) == 0:
        return 0.0, 0.0
    i = np.searchsorted(end_c, first_ns + merge_ns, side="right") - 1
    last_end = np.where(i >= 0, end_c[np.clip(i, 0, None)], -np.inf)
    j = np.searchsorted(first_c, first_ns - merge_ns, side="left") - 1  # other first tokens, not its own step's
    last_first = np.where(j >= 0, first_c[np.clip(j, 0, None)], -np.inf)
    hit = (last_end > start_ns) & (last_end > last_first)
    return float(hit.mean()), float(len(end_c) / (len(end_c) + len(first_c)))


def _end_cluster_gap_ns(ends_ns: np.ndarray, merge_ns: float) -> float:
    """The median time between clusters of stream ends (ends within ``merge_ns`` of each other
    are one cluster: streams that ended in the same step or two), ns; 0 with fewer than two."""
    if len(ends_ns) < 2:
        return 0.0
    gaps = np.diff(ends_ns)
    gaps = gaps[gaps > merge_ns]
    return float(np.median(gaps)) if len(gaps) else 0.0


def single_level(ctx: FeatureContext) -> None:
    """What one load level shows about waiting in line (runs after ``itl``: reads ITL p50).

    * ``ttft_in_itl_steps_p50`` — TTFT p50 in decode steps (ITL p50): a batching engine starts
      a new request within a step or two; many steps means it waited. ``ttft_in_itl_steps_p95``:
      the same at the 95th percentile (the tail), and ``ttft_tail_prompt_x``: the median prompt
      (tokens) of the slowest 5% against every request's, about 1 when the tail's prompts are
      like the others' (its TTFT is not its own longer prompt).
    * ``ttft_inline_ratio`` — median TTFT / median((in flight at arrival − 1) × the others'
      service time, e2e − TTFT): about 1 when each request waits for every one ahead of it to
      finish, as a server that runs one request at a time makes it; far below 1 when batched.
    * ``first_token_after_end_frac`` — of the requests that waited (TTFT ≥ 5 decode steps) with
      others in flight, the share whose first token came within a window (max(3 ITL,
      ``line_window_service_frac`` x the service time, half the median time between clusters of
      stream ends): room for its own prefill, or its cohort's when several are admitted together)
      after another request ended during its wait: first tokens one after another, each when a
      stream ends. ``first_token_after_end_control`` is the same share one window earlier: what
      chance alone gives at this load. ``decode_alone_frac``: of those waiting requests, the share
      that streamed alone (no other stream's first-to-last-token window overlaps theirs): one
      request served at a time. ``first_token_after_end_n``: how many waiting requests those
      shares are over (a count: the rules judge "beyond chance" by it). ``service_s_p50``: the
      median e2e − TTFT, seconds.
    Units: decode steps, x, shares. Closed or open loop alike; needs ITL and e2e times.
    """
    names = ("ttft_in_itl_steps_p50", "ttft_inline_ratio", "first_token_after_end_frac",
             "first_token_after_end_control", "service_s_p50")
    st = ctx.steady
    itl_p50 = ctx.features.value("itl_p50_s")
    if len(st) == 0:
        ctx.na(names + LINE_EXTRA, "no completed requests")
        return
    ttft = num_col(st, "ttft_s").to_numpy()
    if itl_p50 and itl_p50 > 0:
        ctx.add("ttft_in_itl_steps_p50", float(np.nanmedian(ttft) / itl_p50))
        ctx.add("ttft_in_itl_steps_p95", float(np.nanpercentile(ttft, 95) / itl_p50))
    else:
        ctx.na(names[:1] + ("ttft_in_itl_steps_p95",), "needs ITL (two or more streamed tokens per request)")
    tokens = num_col(st, "input_tokens").to_numpy()
    both = np.isfinite(ttft) & np.isfinite(tokens) & (tokens > 0)
    if both.sum() >= int(ctx.params["min_fit_requests"]):
        tail = ttft[both] >= np.percentile(ttft[both], 95)
        ctx.add("ttft_tail_prompt_x", float(np.median(tokens[both][tail]) / np.median(tokens[both])))
    else:
        ctx.na(("ttft_tail_prompt_x",), "needs prompt token counts on enough requests")
    e2e = num_col(st, "e2e_s").to_numpy()
    service = e2e - ttft
    good_service = service[np.isfinite(service) & (service > 0)]
    if len(good_service) < int(ctx.params["min_fit_requests"]):
        ctx.na(names[1:] + LINE_EXTRA, "needs end-to-end times of streamed requests (e2e − TTFT)")
        return
    svc = float(np.median(good_service))
    ctx.add("service_s_p50", svc)
    ahead = ctx.inflight_at.reindex(st.index).to_numpy(dtype="float64") - 1.0
    lined = np.isfinite(ahead) & (ahead >= 1) & np.isfinite(ttft)
    if lined.sum() < int(ctx.params["min_fit_requests"]):
        ctx.na(names[1:4] + LINE_EXTRA, "too few requests arrived with others in flight (a single stream at a time)")
        return
    ctx.add("ttft_inline_ratio", float(np.median(ttft[lined]) / max(np.median(ahead[lined]) * svc, 1e-9)))
    if not itl_p50:
        ctx.na(names[2:4] + LINE_EXTRA, "needs ITL to tell a waiting request from a prompt one")
        return
    req = ctx.req_all
    start_all = num_col(req, "start_ns").to_numpy()
    e2e_all = num_col(req, "e2e_s").to_numpy()
    ok_end = np.isfinite(start_all) & np.isfinite(e2e_all)
    ends = np.sort(start_all[ok_end] + e2e_all[ok_end] * NS)
    start = num_col(st, "start_ns").to_numpy()
    first = start + ttft * NS
    waited = lined & (ttft >= 5.0 * itl_p50) & np.isfinite(start)
    if waited.sum() < int(ctx.params["min_fit_requests"]):  # nobody waited: nothing follows a stream end
        why = f"only {int(waited.sum())} request(s) waited 5 decode steps or more"
        for name in ("first_token_after_end_frac", "first_token_after_end_control", "decode_alone_frac",
                     "first_token_after_end_order_frac", "first_token_after_end_order_control"):
            ctx.add(name, 0.0, source=why)
        ctx.add("first_token_after_end_n", int(waited.sum()), source=why)
        return
    window_ns = max(3.0 * itl_p50, float(ctx.params["line_window_service_frac"]) * svc) * NS
    # requests admitted together (a cohort: a KV or batch cap above one) get their first tokens
    # a whole cohort's prefill after the ends that freed them: the window grows to half the time
    # between clusters of ends, and the control looks one window earlier, so the two never overlap
    window_ns = max(window_ns, 0.5 * _end_cluster_gap_ns(ends, itl_p50 * NS))

    def share_after_end(at: np.ndarray) -> float:
        # the last end at or before ``at`` (strictly after the request's own start)
        i = np.searchsorted(ends, at, side="right") - 1
        last = np.where(i >= 0, ends[np.clip(i, 0, None)], -np.inf)
        hit = (last > start[waited]) & (at - last <= window_ns)
        return float(hit.mean())

    ctx.add("first_token_after_end_n", int(waited.sum()))
    ctx.add("first_token_after_end_frac", share_after_end(first[waited]))
    ctx.add("first_token_after_end_control", share_after_end(first[waited] - window_ns))
    # streams that decode alone: no other stream's tokens between this one's first and last token
    ttft_all = num_col(req, "ttft_s").to_numpy()
    ok_dec = ok_end & np.isfinite(ttft_all)
    ft_all = np.sort(start_all[ok_dec] + ttft_all[ok_dec] * NS)
    end_all = np.sort(start_all[ok_dec] + e2e_all[ok_dec] * NS)
    eps = itl_p50 * NS
    lo, hi = first[waited] + eps, (start + e2e * NS)[waited] - eps
    others = np.searchsorted(ft_all, hi, side="left") - np.searchsorted(end_all, lo, side="right")
    ctx.add("decode_alone_frac", float(np.mean(others <= 1)))  # itself only
    frac, chance = _after_end_in_order(ends, ft_all, start[waited], first[waited], eps)
    ctx.add("first_token_after_end_order_frac", frac)
    ctx.add("first_token_after_end_order_control", chance)
