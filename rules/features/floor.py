"""Theme: what a request's own work costs on this server (its TTFT floor), and how far TTFT sits above it.

The floor is the evidence ``healthy`` stands on (``rules.verdict``): when nothing waits, each
TTFT is close to its floor, whatever the prompt costs.

* With server stage spans, a request's floor is the sum of its own stages (tokenize, prefill,
  comm, sample, detokenize, and an engine's unsplit ``lumped`` work): its TTFT less the queue, a
  front end's wait and the network.
* Client only, it is the TTFT of the requests that arrived alone (nothing else in flight), at the
  request's prompt length: a line through the lone requests when their prompts span a range and
  TTFT rises with them, else their median TTFT (then only requests whose prompt is within
  ``floor_prompt_x`` of the lone ones' median are compared). A lone request waited for no other:
  it counts at 1x (its scatter is no wait).

Features: ``ttft_floor_p50_s`` (s), ``ttft_over_floor_p50`` / ``ttft_over_floor_p90`` (x: per-request
TTFT / floor, median and 90th percentile), ``ttft_floor_n`` (requests the floor was measured on),
``ttft_floor_compared_n`` (requests compared with it). Each TTFT is compared with its floor plus
``floor_steps_allowance`` decode steps (ITL p50): a batching engine admits a new request within a
step or two, the step in flight. When the users' concurrency is known (``users_concurrency``, from
``ttft diagnose --workload concurrency=N``) only requests that arrived with at most that many in
flight are compared: the verdict's "nothing waits" is about their load. The source says which floor
it is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import bool_col, linear_fit, num_col

NAMES = ("ttft_floor_p50_s", "ttft_over_floor_p50", "ttft_over_floor_p90", "ttft_floor_n", "ttft_floor_compared_n")
#: the server stages that are a request's own work (not waiting for others, not the network)
OWN_STAGES: tuple[str, ...] = (stages.TOKENIZE, stages.PREFILL, stages.COMM, stages.SAMPLE, stages.DETOKENIZE,
                               stages.LUMPED)
SOURCE_SPANS = "engine spans: each request's own stages (its TTFT less queue, front-end wait and network)"
SOURCE_LONE = "client: requests that arrived alone (nothing else in flight), at the request's prompt length"
#: fewest lone requests to measure a client-side floor
MIN_LONE = 3
#: a lone-request line needs prompts spanning this share of their mean and R² at least this
LINE_SPREAD_MIN = 0.20
LINE_R2_MIN = 0.5


def floor(ctx: FeatureContext) -> None:
    """Each steady request's TTFT against its own-work floor (server spans, else lone requests)."""
    st = ctx.steady
    if len(st) == 0:
        ctx.na(NAMES, "no completed requests")
        return
    server = bool_col(st, "has_server")
    own = _own_stages_s(st)
    if (server & own.notna()).sum() >= max(3, 0.5 * len(st)):
        m = server & own.notna() & (own > 0)
        ttft = num_col(st, "ttft_s")[m]
        _add(ctx, ttft, own[m], int(m.sum()), SOURCE_SPANS)
        return
    _client_floor(ctx, st)


def _own_stages_s(st: pd.DataFrame) -> pd.Series:
    """Sum of each request's own stage seconds (NaN when it has none of them)."""
    cols = [stages.stage_column(s) for s in OWN_STAGES if stages.stage_column(s) in st.columns]
    if not cols:
        return pd.Series(np.nan, index=st.index, dtype="float64")
    vals = pd.concat([num_col(st, c) for c in cols], axis=1)
    total = vals.sum(axis=1, min_count=1)
    return total.where(vals.notna().any(axis=1))


def _client_floor(ctx: FeatureContext, st: pd.DataFrame) -> None:
    inflight = ctx.inflight_at.reindex(st.index)
    ttft = num_col(st, "ttft_s")
    tokens = num_col(st, "input_tokens")
    lone = (inflight <= 1) & ttft.notna()
    if "prefix_role" in st.columns:  # a cache may serve a repeat's prefix: its own work is not its prompt's
        lone &= st["prefix_role"].ne("repeat")
    if "schema_role" in st.columns:  # a schema's first use also waits for its grammar: not its prompt's work
        lone &= ~st["schema_role"].isin(["first", "concurrent"])
    n_lone = int(lone.sum())
    if n_lone < MIN_LONE:
        ctx.na(NAMES, f"only {n_lone} requests arrived alone (needs {MIN_LONE}): no lone-request TTFT to compare with "
                      "(a run at concurrency 1, or a sweep from 1, measures it)")
        return
    lx, ly = tokens[lone].to_numpy(dtype="float64"), ttft[lone].to_numpy(dtype="float64")
    known = np.isfinite(lx)
    base = float(np.median(ly))
    line = None
    if known.sum() >= MIN_LONE and np.unique(lx[known]).size >= 3:
        spread = (lx[known].max() - lx[known].min()) / max(lx[known].mean(), 1e-9)
        if spread >= LINE_SPREAD_MIN:
            slope, intercept, r2 = linear_fit(lx[known], ly[known])
            if slope > 0 and r2 >= LINE_R2_MIN:
                line = (slope, intercept)
    if line is not None:
        slope, intercept = line
        # never below the fastest lone request: the line's intercept can dip under zero
        fl = (intercept + slope * tokens).clip(lower=float(ly.min()))
        compared = fl.notna() & ttft.notna()
    else:
        mid = float(np.median(lx[known])) if known.any() else np.nan
        fl = pd.Series(base, index=st.index, dtype="float64")
        x = float(ctx.params.get("floor_prompt_x", 1.5))
        near = (tokens >= mid / x) & (tokens <= mid * x) if np.isfinite(mid) else pd.Series(True, index=st.index)
        compared = near & ttft.notna()
    if int(compared.sum()) < MIN_LONE:
        ctx.na(NAMES, "too few requests have a prompt like the lone requests' to compare with their TTFT")
        return
    # a request that arrived alone waited for no other: its TTFT is its own work (the floor itself, up
    # to the scatter of lone requests), so it counts at 1x and only the others are compared with it
    fl = fl.where(~lone, ttft)
    _add(ctx, ttft[compared], fl[compared], n_lone, SOURCE_LONE + (" (a line through them)" if line else " (their median)"))


def _add(ctx: FeatureContext, ttft: pd.Series, fl: pd.Series, n_floor: int, source: str) -> None:
    users = ctx.features.value("users_concurrency")
    if users is not None and len(ctx.inflight_at):
        # the users keep at most this many in flight (ttft diagnose --workload concurrency=N): whether
        # anything waits is judged at their load; the ramp's levels above it measure capacity, not them
        theirs = (ctx.inflight_at.reindex(ttft.index) <= users).to_numpy()
        if int(theirs.sum()) >= MIN_LONE:
            ttft, fl = ttft[theirs], fl[theirs]
            source += f"; at your users' load (<= {users:g} in flight)"
    # a batching engine admits a new request within a step or two: that much beyond its own work is
    # the step in flight, not a wait (``floor_steps_allowance`` decode steps, ITL p50)
    step = ctx.features.value("itl_p50_s")
    allowance = float(step) * float(ctx.params.get("floor_steps_allowance", 2.0)) if step else 0.0
    ratio = (ttft / (fl + allowance)).replace([np.inf, -np.inf], np.nan).dropna()
    if ratio.empty:
        ctx.na(NAMES, "no request has both a TTFT and a floor")
        return
    ctx.add("ttft_floor_p50_s", float(fl.median()), source=source)
    ctx.add("ttft_over_floor_p50", float(ratio.median()), source=source)
    ctx.add("ttft_over_floor_p90", float(ratio.quantile(0.9)), source=source)
    ctx.add("ttft_floor_n", float(n_floor), source=source)
    ctx.add("ttft_floor_compared_n", float(len(ratio)), source=source)
