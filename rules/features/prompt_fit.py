"""Theme: TTFT against prompt length. A least-squares line of TTFT on prompt tokens over the
requests that did not queue, less a shared prefix's repeats (slope in ms per token, intercept in
ms, the intercept's standard error, R², the prompt-proportional share of TTFT), and the cost of a prompt
token against one decode step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import bool_col, linear_fit, linear_fit_se, num_col, segment_numbers


def prompt_fit(ctx: FeatureContext) -> None:
    """TTFT = intercept + slope x prompt tokens on comparable requests (needs a prompt-length sweep)."""
    st = ctx.steady
    prompt_sweep_points(ctx)
    names = ("ttft_prompt_slope_ms_per_token", "ttft_prompt_intercept_ms", "ttft_prompt_intercept_se_ms",
             "ttft_prompt_slope_t", "ttft_prompt_r2",
             "ttft_prompt_explained_frac", "ttft_prompt_fit_n", "ttft_prompt_fit_ttft_p50_s",
             "ttft_prompt_fit_itl_p50_s", "ttft_prompt_fit_alone_frac")
    if len(st) == 0:
        ctx.na(names, "no completed requests")
        return
    tokens = num_col(st, "input_tokens")
    if tokens.notna().sum() == 0:
        ctx.na(names, "no request carries its prompt token count (gen_ai.usage.input_tokens)")
        return
    has_server = bool_col(st, "has_server")
    y = num_col(st, "server_ttft_s").where(has_server, num_col(st, "ttft_s"))
    queue = num_col(st, "queue_s")
    if queue.notna().any():
        mask = queue.fillna(0) <= float(ctx.params["queue_small_frac"]) * y
        how = "requests that did not queue"
    else:
        seg = segment_numbers(st["segment"]) if "segment" in st.columns else pd.DataFrame(index=st.index)
        prompt_seg = seg["prompt"].notna() if "prompt" in seg.columns else pd.Series(False, index=st.index)
        mask = (ctx.inflight_at <= 1) | prompt_seg
        how = "requests alone in flight (concurrency 1) or in a prompt sweep"
        inflight = ctx.inflight_at.dropna()
        steady_load = len(inflight) and float(inflight.quantile(0.9) - inflight.quantile(0.1)) <= 1.0
        if int((mask & tokens.notna()).sum()) < int(ctx.params["min_fit_requests"]) and steady_load:
            # a closed loop at a fixed concurrency: every request met the same load
            mask = pd.Series(True, index=st.index)
            how = f"requests at a steady concurrency (~{float(inflight.median()):g} in flight, closed loop)"
    mask &= tokens.notna() & y.notna()
    if "prefix_role" in st.columns:  # a shared prefix's repeats: a cache may serve the prefix, so their
        mask &= st["prefix_role"].ne("repeat")  # prompt length is not what they computed
    if "schema_role" in st.columns:  # a schema's first use waits for its grammar, whatever its length
        mask &= ~st["schema_role"].isin(["first", "concurrent"])
    x = tokens[mask].to_numpy()
    yy = y[mask].to_numpy()
    min_n = int(ctx.params["min_fit_requests"])
    if x.size < min_n:
        ctx.na(names, f"only {x.size} {how} with a token count (needs {min_n})")
        return
    spread = (x.max() - x.min()) / max(x.mean(), 1e-9)
    lengths, counts = np.unique(x, return_counts=True)
    # two lengths far enough apart, each sent several times (a two-point sweep): every request is a
    # point, so the scatter within each length measures how well the line is pinned
    two = lengths.size == 2 and counts.min() >= int(ctx.params["fit_two_length_min_requests"]) \
        and spread >= float(ctx.params["fit_range_min"])
    if lengths.size < 3 and not two \
            or spread < float(ctx.params["fit_range_min"]) and not _slope_resolved(ctx, x, yy, spread):
        ctx.na(names, f"only {lengths.size} distinct prompt lengths ({x.min():g}..{x.max():g} tokens, a "
               f"{spread:.0%} range) and TTFT does not resolve a slope within them; needs a prompt-length sweep")
        return
    # When prompt lengths repeat (a sweep, a prompt file), fit the median TTFT of each length:
    # robust to the few requests that waited behind another one.
    # Two lengths: every request, as for lengths that do not repeat (below).
    repeated = counts >= 2
    if not two and repeated.sum() >= 3 and counts[repeated].sum() >= 0.8 * x.size:
        fx = lengths[repeated].astype("float64")
        fy = np.array([np.median(yy[x == v]) for v in lengths[repeated]])
        slope, intercept, r2 = linear_fit(fx, fy)
        weights = counts[repeated]
        expl = slope * float((weights * fx).sum()) / max(float((weights * fy).sum()), 1e-12)
        how += ", median TTFT per prompt length"
    elif not two and (point := _sweep_points(st, mask)) is not None:
        # a prompt sweep whose token counts vary a little per request (the server's tokenizer, a
        # chat template): the median of each sweep point, robust the same way; requests outside its
        # points (a load ramp's that happened to be alone in flight) are left out of it
        mask &= point.notna()
        x, yy = tokens[mask].to_numpy(), y[mask].to_numpy()
        labels = point[mask].to_numpy()
        keys, counts = np.unique(labels, return_counts=True)
        fx = np.array([np.median(x[labels == k]) for k in keys])
        fy = np.array([np.median(yy[labels == k]) for k in keys])
        slope, intercept, r2 = linear_fit(fx, fy)
        expl = slope * float((counts * fx).sum()) / max(float((counts * fy).sum()), 1e-12)
        how += ", median TTFT per prompt-sweep point"
    else:
        fx, fy = x.astype("float64"), yy.astype("float64")
        slope, intercept, r2 = linear_fit(fx, fy)
        expl = None
        if two:
            how += f", every request at two lengths ({counts.min()}+ each)"
    ctx.add("ttft_prompt_slope_ms_per_token", slope * 1e3, source=how)
    ctx.add("ttft_prompt_intercept_ms", intercept * 1e3, source=how)
    # how well the points pin the intercept: a narrow range far from zero tokens leaves it an
    # extrapolation (the network rule asks how far below it the points allow)
    slope_se, se = linear_fit_se(fx, fy)
    if np.isfinite(se):
        ctx.add("ttft_prompt_intercept_se_ms", se * 1e3, source=f"over {fx.size} fit points ({how})")
    else:
        ctx.add("ttft_prompt_intercept_se_ms", None, f"{fx.size} fit points leave no scatter to measure it with")
    # how many standard errors the slope stands above zero: over a narrow prompt range R² stays low
    # however exactly TTFT follows the prompt, while this still says the slope is there
    if np.isfinite(slope_se) and slope_se > 0:
        ctx.add("ttft_prompt_slope_t", slope / slope_se, source=f"over {fx.size} fit points ({how})")
    else:
        ctx.add("ttft_prompt_slope_t", None, f"{fx.size} fit points leave no scatter to measure it with")
    ctx.add("ttft_prompt_r2", max(0.0, r2), source=how)
    # time-weighted (means, not medians): in a mixed workload most requests are short, yet
    # the long ones carry most of the TTFT time
    mean_y = float(np.mean(yy))
    if expl is None:
        expl = slope * float(np.mean(x)) / mean_y if mean_y > 0 else None
    expl_how = how
    users = ctx.users_prompt_tokens
    if users is not None and slope > 0 and ctx.features.value("designed_by_diagnose"):
        # ttft diagnose's ladder runs lengths of its own choosing: the share that matters is the one
        # at the users' typical prompt, on the fitted line
        mid = (users[0] + users[1]) / 2.0
        at_mid = intercept + slope * mid
        if at_mid > 0:
            expl, expl_how = slope * mid / at_mid, f"on the fit at your users' {mid:g}-token prompts"
    # clipped to 0..1: a negative intercept (a narrow range, extrapolated) would put it above 1
    ctx.add("ttft_prompt_explained_frac", min(1.0, max(0.0, expl)) if expl is not None else None, source=expl_how)
    ctx.add("ttft_prompt_fit_n", float(x.size))
    # what the fit's own requests waited and how many were in flight with them: the fixed part is
    # judged against these (a diagnose capture holds its ramp too, whose TTFT load inflated)
    ctx.add("ttft_prompt_fit_ttft_p50_s", float(np.median(yy)), source=how)
    # ... and their decode step: a prompt token's cost and the fixed part are counted in the decode
    # steps of these requests, not in those of a load ramp's batches (slower the more in flight)
    itl = num_col(st, "itl_p50_s")[mask].dropna()
    itl = itl if len(itl) else num_col(st, "tpot_s")[mask].dropna()
    ctx.add("ttft_prompt_fit_itl_p50_s", float(itl.median()) if len(itl) else None,
            None if len(itl) else "the fit's requests have no inter-token times (one output token each)", source=how)
    inflight = ctx.inflight_at[mask].dropna() if len(ctx.inflight_at) else pd.Series(dtype="float64")
    ctx.add("ttft_prompt_fit_alone_frac", float((inflight <= 1).mean()) if len(inflight) else None,
            None if len(inflight) else "no in-flight count at arrival")


def prompt_sweep_points(ctx: FeatureContext) -> None:
    """``prompt_sweep_points_n``: the prompt lengths a designed sweep varied (``prompt=N`` segments of
    a ``ttft probe --sweep prompt`` or ttft diagnose's ladder, 2+ steady requests each); 0 without one."""
    st = ctx.steady
    if len(st) == 0 or "segment" not in st.columns:
        ctx.add("prompt_sweep_points_n", 0.0)
        return
    counts = segment_numbers(st["segment"])["prompt"].value_counts()
    ctx.add("prompt_sweep_points_n", float((counts >= 2).sum()))


def _slope_resolved(ctx: FeatureContext, x: np.ndarray, y: np.ndarray, spread: float) -> bool:
    """Prompt lengths within a narrow range (a fixed workload with some spread) still carry a
    slope when the fit resolves it: the range at least ``fit_narrow_range_min`` of the mean, and
    the slope at least ``fit_slope_t_min`` standard errors from zero (a positive slope: TTFT
    grows with the prompt). A flat or noisy TTFT over the range stays unresolved."""
    if spread < float(ctx.params["fit_narrow_range_min"]) or x.size < 3:
        return False
    slope, _, _ = linear_fit(x, y)
    se = linear_fit_se(x, y)[0]
    if slope <= 0 or not np.isfinite(se):
        return False
    return se == 0 or slope / se >= float(ctx.params["fit_slope_t_min"])


def prompt_slope_per_itl(ctx: FeatureContext) -> None:
    """TTFT cost of one prompt token / one decode step (the fit's own requests' ITL p50, else all
    requests'), x; runs after the ITL theme."""
    slope = ctx.features.value("ttft_prompt_slope_ms_per_token")
    itl = ctx.features.value("ttft_prompt_fit_itl_p50_s") or ctx.features.value("itl_p50_s")
    if slope is not None and itl:
        ctx.add("prompt_slope_per_itl", (slope / 1e3) / itl,
                source="prompt-token cost over one decode step: a parallel prefill keeps this far below 1")
    else:
        ctx.add("prompt_slope_per_itl", None, "needs a prompt-length fit and ITL")
    prompt_work_steps(ctx, itl)


def prompt_work_steps(ctx: FeatureContext, itl: float | None) -> None:
    """How long the median request's prompt work holds its first token back, in decode steps
    (``prompt_work_steps_p50``): its prefill (+comm) stage seconds with server spans, else the
    prompt fit's slope x its prompt tokens (the users' typical prompt when ttft diagnose knows it);
    over ITL p50 (the fit's own requests' when known)."""
    st = ctx.steady
    itl = itl or ctx.features.value("itl_p50_s")
    if not itl or len(st) == 0:
        ctx.add("prompt_work_steps_p50", None, "needs ITL and completed requests")
        return
    prefill = num_col(st, stages.stage_column(stages.PREFILL))
    work = prefill.add(num_col(st, stages.stage_column(stages.COMM)).fillna(0.0))
    work = work[bool_col(st, "has_server") & prefill.notna()]
    if len(work) >= max(3, 0.5 * len(st)):
        ctx.add("prompt_work_steps_p50", float(work.median()) / itl, source="prefill stage spans / ITL p50")
        return
    slope = ctx.features.value("ttft_prompt_slope_ms_per_token")
    tokens = num_col(st, "input_tokens").dropna()
    mid = ctx.features.value("users_prompt_mid_tokens") or (float(tokens.median()) if len(tokens) else None)
    if slope is None or mid is None:
        ctx.add("prompt_work_steps_p50", None, "needs prefill spans, or a prompt-length fit and prompt token counts")
        return
    ctx.add("prompt_work_steps_p50", max(0.0, slope / 1e3 * mid) / itl,
            source=f"prompt fit: slope x {mid:g} prompt tokens / ITL p50")


def _sweep_points(st: pd.DataFrame, mask: pd.Series) -> pd.Series | None:
    """The prompt-sweep point of each request: its ``prompt=N`` segment, and ``concurrency=1`` (ttft
    diagnose's lone-request baseline) as one more point; NaN for the others. None unless at least 3
    prompt points of 2+ fitted requests each, with the baseline, hold at least half of them."""
    if "segment" not in st.columns:
        return None
    seg = segment_numbers(st["segment"])
    if "prompt" not in seg.columns:
        return None
    point = seg["prompt"].copy()
    base = seg["conc"].eq(1) & point.isna()
    point[base] = -1.0  # the baseline: its own point, at its own prompt length
    fitted = point[mask]
    counts = fitted[fitted.ge(0)].value_counts()
    counts = counts[counts >= 2]
    n_base = int(base[mask].sum())
    if len(counts) < 3 or counts.sum() + (n_base if n_base >= 2 else 0) < 0.5 * len(fitted):
        return None
    keep = point.isin(list(counts.index)) | (base & (n_base >= 2))
    return point.where(keep)
