"""Admission features: short requests held behind long prompts (head-of-line), and requests
waiting while KV usage stays low and the batch has room (admission by worst-case reservation).

Head-of-line (any side): a *long* request has at least ``hol_long_factor`` x the median prompt;
a *short* one at most ``hol_short_factor`` x the median. A short request is *behind a long one*
when a long request arrived before it and had no first token yet when it arrived. Arrival and
first token are the client's times when the client was seen, else the server's, so the same
comparison holds client-only (the designed probe's ``--inject-long``) and server-side. Besides the
median ratio, ``hol_blocked_lost_frac`` / ``hol_unblocked_lost_frac`` count the short requests behind
a long one, and those with none ahead, that took ``hol_lost_factor`` x the baseline or more. Server
spans add how the blocked short requests waited: their queue share, the engine steps that ran
while they queued, and KV usage and running sequences meanwhile.

Reservation (server): the engine steps that ran while requests waited: their KV usage, running
sequences against the engine's running cap (``meta.json`` ``engine_config.max_running``, the
bundled engine's; unknown elsewhere) and whether any prefill work ran in them.

Runs on the calling thread, on the shared :class:`~rules.features.context.FeatureContext`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rules.features.context import FeatureContext
from rules.features.itl import emission_times_ns, gaps_of
from rules.features.numeric import NS, num_col

HOL_NAMES = ("hol_short_ttft_ratio", "hol_blocked_short_n", "hol_unblocked_short_n", "hol_long_prompt_ratio",
             "hol_blocked_queue_share", "hol_blocked_wait_steps", "hol_blocked_kv_usage_max",
             "hol_blocked_running_max", "hol_baseline_own_wait", "hol_wait_share_all", "hol_blocked_others_steps",
             "hol_blocked_lost_frac", "hol_unblocked_lost_frac", "running_cap")
KVR_NAMES = ("kvr_waiting_steps_frac", "kvr_kv_usage_while_waiting_p95", "kvr_running_while_waiting_p50",
             "kvr_prefill_steps_while_waiting_frac", "kvr_prefill_bound_while_waiting_frac")
#: a step's prefill is at its limit from this share of its per-step prefill budget
PREFILL_BOUND_FRAC = 0.9


def _running_cap(ctx: FeatureContext) -> float | None:
    cfg = ctx.meta.get("engine_config") if isinstance(ctx.meta, dict) else None
    cap = cfg.get("max_running") if isinstance(cfg, dict) else None
    return float(cap) if isinstance(cap, (int, float)) and cap > 0 else None


def _steps_in(steps: pd.DataFrame, a_ns: np.ndarray, b_ns: np.ndarray) -> list[np.ndarray]:
    """For each wait (a, b): the indices of the steps overlapping it (steps sorted by start)."""
    st = steps["start_ns"].to_numpy(dtype="float64")
    en = steps["end_ns"].to_numpy(dtype="float64")
    out = []
    for a, b in zip(a_ns, b_ns):
        lo = max(0, int(np.searchsorted(st, a, side="left")) - 1)
        hi = int(np.searchsorted(st, b, side="left"))
        idx = np.arange(lo, hi)
        out.append(idx[(en[idx] > a) & (st[idx] < b)])
    return out


def _steps_while_waiting(ctx: FeatureContext, req: pd.DataFrame, a_ns: np.ndarray, b_ns: np.ndarray) -> float | None:
    """The median number of engine steps the other streams took inside the waits (a, b) (ns): each
    step emits the running streams' tokens together, so token times closer than half the median
    gap are one step. None without token times."""
    gaps = gaps_of(ctx, req)
    if gaps is None or gaps.empty or not len(a_ns):
        return None
    times = emission_times_ns(gaps)
    half = 0.5 * float(np.median(gaps["gap_s"].to_numpy())) * NS
    steps = times[np.concatenate([[True], np.diff(times) > half])]
    inside = np.searchsorted(steps, b_ns, side="left") - np.searchsorted(steps, a_ns, side="right")
    return float(np.median(inside))


def head_of_line(ctx: FeatureContext) -> None:
    """``hol_*``: TTFT of short requests behind an unfinished long one against the other short ones;
    on ttft diagnose's mixed follow-up when the capture holds one (``mixed_by_diagnose``)."""
    designed = len(ctx.mixed) > 0
    req = ctx.mixed if designed else ctx.steady
    ctx.add("mixed_by_diagnose", 1.0 if designed else 0.0)
    p = ctx.params
    ctx.add("running_cap", _running_cap(ctx), None if _running_cap(ctx) is not None else
            "the engine's running cap is unknown (bundled engine: meta.json engine_config.max_running)")
    names = HOL_NAMES[:-1]
    if req is None or len(req) < int(p["min_fit_requests"]):
        ctx.na(names, "too few completed requests")
        return
    tokens = num_col(req, "input_tokens").to_numpy(dtype="float64")
    start = num_col(req, "start_ns").to_numpy(dtype="float64")
    ttft = num_col(req, "ttft_s").to_numpy(dtype="float64")
    ok = np.isfinite(tokens) & np.isfinite(start) & np.isfinite(ttft)
    if ok.sum() < int(p["min_fit_requests"]):
        ctx.na(names, "needs prompt lengths (gen_ai.usage.input_tokens) and TTFTs")
        return
    med = float(np.median(tokens[ok]))
    is_long = ok & (tokens >= float(p["hol_long_factor"]) * med)
    is_short = ok & (tokens <= float(p["hol_short_factor"]) * med)
    if not is_long.any() or is_short.sum() < 2 * int(p["min_bin_requests"]):
        ctx.na(names, f"needs long prompts (>= {p['hol_long_factor']:g}x the median {med:.0f} tokens) among short ones")
        return
    first = start + ttft * NS
    ls, lf = start[is_long], first[is_long]
    si = np.flatnonzero(is_short)
    s_start = start[si]
    # behind a long one: a long request arrived before and had no first token yet
    blocked = ((ls[None, :] < s_start[:, None]) & (lf[None, :] > s_start[:, None])).any(axis=1)
    nb, nu = int(blocked.sum()), int((~blocked).sum())
    ctx.add("hol_blocked_short_n", float(nb))
    ctx.add("hol_unblocked_short_n", float(nu))
    ctx.add("hol_long_prompt_ratio", float(np.median(tokens[is_long]) / max(np.median(tokens[is_short]), 1.0)))
    need = int(p["min_bin_requests"])
    t_short = ttft[si]
    queue = num_col(req, "queue_s").to_numpy(dtype="float64")[si][blocked]
    if nb >= need and nu >= need:
        base = float(np.median(t_short[~blocked]))
        ctx.add("hol_baseline_own_wait", 0.0)
    elif nb >= need and np.isfinite(queue).sum() >= need:
        # a long prompt was always unfinished (no short request ran without one ahead): the baseline is the
        # blocked requests' own TTFT without their queue wait (server spans)
        fin = np.isfinite(queue)
        base = float(np.median(t_short[blocked][fin] - queue[fin]))
        ctx.add("hol_baseline_own_wait", 1.0)
    else:
        ctx.na(("hol_short_ttft_ratio", "hol_blocked_queue_share", "hol_blocked_wait_steps", "hol_blocked_kv_usage_max",
                "hol_blocked_running_max", "hol_baseline_own_wait", "hol_wait_share_all", "hol_blocked_lost_frac",
                "hol_unblocked_lost_frac"),
               f"needs {need} short requests both behind an unfinished long one ({nb}) and not ({nu}), or the "
               "queue times of those behind one (server spans)")
        return
    ctx.add("hol_short_ttft_ratio", float(np.median(t_short[blocked]) / base) if base > 0 else None)
    # how many lost their TTFT (at least hol_lost_factor x the baseline): the median misses a loss that only
    # part of them took -- on vLLM those arriving just before the long prompt is scheduled run beside its first
    # chunk, those arriving after wait for its whole prefill
    if base > 0:
        bar = float(p["hol_lost_factor"]) * base
        ctx.add("hol_blocked_lost_frac", float((t_short[blocked] >= bar).mean()))
        ctx.add("hol_unblocked_lost_frac", float((t_short[~blocked] >= bar).mean()) if nu else None,
                None if nu else "no short request arrived with none ahead")
    # who waits: the blocked short requests' TTFT above the baseline, summed, over every request's TTFT summed
    total = float(ttft[ok].sum())
    ctx.add("hol_wait_share_all", float(np.clip(t_short[blocked] - base, 0, None).sum() / total) if total > 0 else None,
            None if total > 0 else "TTFT is zero")
    # how the engine spent the wait of those that lost most of their TTFT (over twice the baseline):
    # many steps of the other streams = it kept stepping without them (admission order); one or two
    # = a single long step held everyone (a whole prefill: interference)
    lost = t_short[blocked] > 2.0 * base
    a_ns = s_start[blocked][lost]
    others = _steps_while_waiting(ctx, req, a_ns, a_ns + t_short[blocked][lost] * NS)
    ctx.add("hol_blocked_others_steps", others, None if others is not None else
            "needs token times and short requests that lost over half their TTFT behind a long one")
    # server side: how the blocked short requests waited
    if not np.isfinite(queue).any():
        ctx.na(("hol_blocked_queue_share", "hol_blocked_wait_steps", "hol_blocked_kv_usage_max",
                "hol_blocked_running_max"), "needs server queue spans")
        return
    tb = t_short[blocked]
    fin = np.isfinite(queue)
    # of what they lost against the baseline, the part spent queued: admission order puts the loss in the
    # queue, a step shared with the long prefill puts it in the prefill. Pooled over the requests, not a
    # median of each one's share: those that arrived late in the long prefill, or before the long prompt
    # reached the engine, lost little and say nothing about how the others lost theirs
    excess = float(np.clip(tb[fin] - base, 0, None).sum())
    ctx.add("hol_blocked_queue_share", float(min(np.clip(queue[fin], 0, None).sum() / excess, 1.0)) if excess > 0 else None,
            None if excess > 0 else "the short requests behind long prompts lost no TTFT", source="spans")
    steps = ctx.steps
    if not len(steps) or "start_ns" not in steps.columns:
        ctx.na(("hol_blocked_wait_steps", "hol_blocked_kv_usage_max", "hol_blocked_running_max"),
               "needs engine-step spans")
        return
    steps = steps.sort_values("start_ns", kind="stable").reset_index(drop=True)
    sv = num_col(req, "server_start_ns").to_numpy(dtype="float64")[si][blocked]
    tok = np.nan_to_num(num_col(req, "tokenize_s").to_numpy(dtype="float64")[si][blocked])
    a = sv + tok * NS
    b = a + np.nan_to_num(queue) * NS
    good = np.isfinite(a) & np.isfinite(b) & (b > a)
    if not good.any():
        ctx.na(("hol_blocked_wait_steps", "hol_blocked_kv_usage_max", "hol_blocked_running_max"),
               "the blocked requests did not queue")
        return
    over = _steps_in(steps, a[good], b[good])
    st = steps["start_ns"].to_numpy(dtype="float64")
    # steps that started while it queued (the one admitting it starts at the end of its wait)
    started = [int(((st[i] > x) & (st[i] < y)).sum()) for i, x, y in zip(over, a[good], b[good])]
    ctx.add("hol_blocked_wait_steps", float(np.median(started)), source="engine_steps")
    idx = np.unique(np.concatenate(over)) if over else np.array([], dtype=int)
    kv = num_col(steps, "kv_usage_ratio").to_numpy(dtype="float64")[idx]
    run = num_col(steps, "running_seqs").to_numpy(dtype="float64")[idx]
    ctx.add("hol_blocked_kv_usage_max", float(np.nanmax(kv)) if np.isfinite(kv).any() else None,
            None if np.isfinite(kv).any() else "steps carry no KV usage")
    ctx.add("hol_blocked_running_max", float(np.nanmax(run)) if np.isfinite(run).any() else None,
            None if np.isfinite(run).any() else "steps carry no running count")


def reservation(ctx: FeatureContext) -> None:
    """``kvr_*``: what the engine steps looked like while requests waited."""
    steps = ctx.steps
    if not len(steps) or "waiting_seqs" not in steps.columns:
        ctx.na(KVR_NAMES, "needs engine-step spans with waiting and running counts")
        return
    w = num_col(steps, "waiting_seqs").to_numpy(dtype="float64")
    kv = num_col(steps, "kv_usage_ratio").to_numpy(dtype="float64")
    run = num_col(steps, "running_seqs").to_numpy(dtype="float64")
    pre = num_col(steps, "prefill_tokens").to_numpy(dtype="float64")
    waiting = np.isfinite(w) & (w >= 1)
    ctx.add("kvr_waiting_steps_frac", float(waiting.mean()), source="engine_steps")
    if waiting.sum() < int(ctx.params["min_bin_requests"]):
        ctx.na(KVR_NAMES[1:], "requests hardly waited (too few engine steps with a waiting request)")
        return
    k = kv[waiting]
    ctx.add("kvr_kv_usage_while_waiting_p95", float(np.nanpercentile(k, 95)) if np.isfinite(k).any() else None,
            None if np.isfinite(k).any() else "steps carry no KV usage")
    r = run[waiting]
    ctx.add("kvr_running_while_waiting_p50", float(np.nanmedian(r)) if np.isfinite(r).any() else None,
            None if np.isfinite(r).any() else "steps carry no running count")
    ctx.add("kvr_prefill_steps_while_waiting_frac", float((np.nan_to_num(pre[waiting]) > 0).mean()))
    _prefill_bound(ctx, steps, waiting, pre)


def _prefill_bound(ctx: FeatureContext, steps: pd.DataFrame, waiting: np.ndarray, pre: np.ndarray) -> None:
    """``kvr_prefill_bound_while_waiting_frac``: of the steps that ran while a request waited, the
    share whose prefill was at its per-step limit (prefill tokens >= 90% of the budget: the chunk
    under chunked prefill, else the step's token budget; or prefill sequences at the partial-prefill
    cap), from the engine's configuration in meta.json. A request waits for prefill budget only when
    nearly every step is at that limit. Unit: share."""
    cfg = ctx.meta.get("engine_config") if isinstance(ctx.meta, dict) else None
    if not isinstance(cfg, dict):
        ctx.na(("kvr_prefill_bound_while_waiting_frac",), "the engine's prefill budget per step is unknown "
                                                          "(no engine_config in meta.json)")
        return
    budget = cfg.get("chunk_size") if cfg.get("policy") == "chunked" else cfg.get("max_batched_tokens")
    if not isinstance(budget, (int, float)) or budget <= 0:
        ctx.na(("kvr_prefill_bound_while_waiting_frac",), "the engine's prefill budget per step is unknown")
        return
    bound = np.nan_to_num(pre[waiting]) >= PREFILL_BOUND_FRAC * float(budget)
    cap = cfg.get("max_partial_prefills")
    if isinstance(cap, (int, float)) and cap > 0 and "prefill_seqs" in steps.columns:
        bound |= np.nan_to_num(num_col(steps, "prefill_seqs").to_numpy(dtype="float64")[waiting]) >= cap
    ctx.add("kvr_prefill_bound_while_waiting_frac", float(bound.mean()), source="engine_steps")
