"""Theme: latency percentiles of the steady requests: TTFT (either side), end-to-end, the
client-server gap, and the SLO checks. Units: seconds (``client_server_ttft_ratio``: x).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from rules.features.context import FeatureContext
from rules.features.itl import gaps_of
from rules.features.numeric import bool_col, num_col


def ttft(ctx: FeatureContext) -> None:
    """TTFT p50/p95/p99 (as seen, server side, client side), TTFT mean and e2e p50, in seconds."""
    st = ctx.steady
    for col, names in (("ttft_s", ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s")),
                       ("server_ttft_s", ("server_ttft_p50_s", "server_ttft_p95_s", "server_ttft_p99_s")),
                       ("client_ttft_s", ("client_ttft_p50_s", "client_ttft_p95_s", "client_ttft_p99_s"))):
        v = num_col(st, col).dropna().to_numpy()
        if v.size == 0:
            why = "no completed requests" if len(st) == 0 else f"no request has {col} (that side was not captured)"
            ctx.na(names, why)
            continue
        q = np.percentile(v, [50, 95, 99])
        for name, x in zip(names, q):
            ctx.add(name, x)
    v = num_col(st, "ttft_s").dropna()
    ctx.add("ttft_mean_s", float(v.mean()) if len(v) else None, None if len(v) else "no completed requests")
    e2e = num_col(st, "e2e_s").dropna()
    ctx.add("e2e_p50_s", float(e2e.median()) if len(e2e) else None, None if len(e2e) else "no request end times")


def network(ctx: FeatureContext) -> None:
    """Client TTFT minus server TTFT on requests seen by both sides (seconds), and their ratio."""
    st = ctx.steady
    both = st.loc[bool_col(st, "has_server") & bool_col(st, "has_client")] if len(st) else st
    names = ("client_server_gap_p50_s", "client_server_gap_p95_s", "client_server_ttft_ratio",
             "client_server_gap_frontend_frac")
    if len(both) == 0:
        ctx.na(names, "needs requests seen by both the client and the server (join a client and a server capture)")
        return
    gap = num_col(both, "client_ttft_s") - num_col(both, "server_ttft_s")
    ctx.add("client_server_gap_p50_s", float(gap.median()))
    ctx.add("client_server_gap_p95_s", float(np.percentile(gap.dropna(), 95)) if gap.notna().any() else None)
    srv = float(num_col(both, "server_ttft_s").median())
    ctx.add("client_server_ttft_ratio", float(num_col(both, "client_ttft_s").median()) / srv if srv > 0 else None)
    # engines whose TTFT starts after their own front end (vLLM's arrival_time: after the chat
    # template and tokenization) put that front-end work in this gap too
    ctx.add("client_server_gap_frontend_frac", float(bool_col(both, "gap_includes_frontend").mean()),
            source="requests whose server TTFT starts after the engine's front end (diag.ground.external_spans)")


#: a request counts as sent at the users' prompt lengths within this factor of their range: the
#: probe reaches a length through words per token, calibrated, not exactly (x)
USERS_PROMPT_TOLERANCE_X = 1.25


def slo_population(ctx: FeatureContext) -> tuple[pd.DataFrame, str | None]:
    """The requests an SLO is judged on, and what they are (None: the steady requests, as always).

    In a ttft diagnose capture whose users' prompt lengths are known (``--workload
    prompt_tokens=MIN-MAX``), only the requests sent at those lengths: the ladder's rungs and the
    prefix follow-up send lengths of the design's choosing, and a TTFT target broken by a
    2,000-token rung says nothing of users who send 10 tokens. None at those lengths (the ladder
    stopped below them): all steady requests, and the SLO rows say so.
    """
    st = ctx.steady
    users = ctx.users_prompt_tokens
    if users is None or not ctx.features.value("designed_by_diagnose") or len(st) == 0 or "input_tokens" not in st.columns:
        return st, None
    lo, hi = users[0] / USERS_PROMPT_TOLERANCE_X, users[1] * USERS_PROMPT_TOLERANCE_X
    tokens = num_col(st, "input_tokens")
    mine = st.loc[(tokens >= lo) & (tokens <= hi)]
    span = f"{users[0]:g}-{users[1]:g} tokens"
    if len(mine) == 0:
        return st, f"all {len(st)} requests: none was sent at your users' prompt lengths ({span})"
    return mine.reset_index(drop=True), f"{len(mine)} of {len(st)} requests, those at your users' prompt lengths ({span})"


def slo_checks(ctx: FeatureContext) -> None:
    """Each SLO given (``ctx.slo``): target, measured value (seconds), whether it is met, and over
    which requests (:func:`slo_population`; ``over`` when not all steady ones, or when the worst of
    several load levels broke what the pooled requests meet: :func:`_worst_segment`). Runs last (reads ITL)."""
    if not ctx.slo:
        ctx.add("slo_checks", None, "no SLO given")
        return
    st, over = slo_population(ctx)
    gaps_p = {"p50": "itl_p50_s", "p90": "itl_p90_s", "p99": "itl_p99_s", "max": "itl_max_s"}
    gaps = None
    out: dict[str, dict[str, Any]] = {}
    for key, target in ctx.slo.items():
        metric, _, pct = key.partition("_")
        val: float | None = None
        if metric == "itl" and pct in gaps_p and st is not ctx.steady:  # the gaps of those requests only
            if gaps is None:
                gaps = gaps_of(ctx, st)
            g = gaps["gap_s"].to_numpy() if gaps is not None and len(gaps) else None
            if g is not None:
                val = float(g.max()) if pct == "max" else float(np.percentile(g, float(pct[1:])))
        elif metric == "itl" and pct in gaps_p:
            val = ctx.features.value(gaps_p[pct])
        else:
            col = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "itl": "itl_mean_s"}.get(metric)
            v = num_col(st, col).dropna() if col else pd.Series(dtype="float64")
            if len(v):
                if pct == "max":
                    val = float(v.max())
                elif pct == "mean":
                    val = float(v.mean())
                elif pct.startswith("p"):
                    val = float(np.percentile(v, float(pct[1:])))
        worst = _worst_segment(st, metric, pct) if val is not None and val <= target else None
        if worst is not None and worst[1] > target:  # met pooled, broken at one load level of a sweep
            seg, seg_val, seg_n = worst
            over = (f"{over}; " if over else "") + (f"the worst load level, {seg} ({seg_n} requests; "
                                                    f"{val * 1e3:.0f} ms over all levels pooled)")
            val = seg_val
        out[key] = {"target_s": float(target), "value_s": val, "met": None if val is None else bool(val <= target)}
        if over is not None:
            out[key]["over"] = over
    ctx.add("slo_checks", out)


#: fewest requests of a load level (a capture segment) whose own percentile an SLO is held to
MIN_SEGMENT_REQUESTS = 5
#: the segments that are load levels (a concurrency or rate sweep's points, ttft diagnose's baseline and ramp)
LOAD_SEGMENTS = ("concurrency=", "rate=")


def _worst_segment(st: pd.DataFrame, metric: str, pct: str) -> tuple[str, float, int] | None:
    """In a capture of several load levels (a sweep's or ``ttft diagnose``'s segments), the level whose
    ``metric`` percentile is highest: (segment, seconds, requests). An SLO is met only where it holds at
    every level measured: pooled, the lone requests of a ladder hide the level where it broke. Only load
    levels count (:data:`LOAD_SEGMENTS`; a prompt rung is judged with the users' lengths instead). None
    for one level, ITL targets (judged on the gaps) and levels of fewer than :data:`MIN_SEGMENT_REQUESTS`."""
    col = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}.get(metric)
    if col is None or "segment" not in st.columns or not (pct == "max" or pct.startswith("p")):
        return None
    vals = pd.DataFrame({"segment": st["segment"].astype(str), "v": num_col(st, col)}).dropna()
    vals = vals.loc[vals["segment"].str.startswith(LOAD_SEGMENTS)]  # a prompt sweep's rungs are not load levels
    q = 100.0 if pct == "max" else float(pct[1:])
    levels = [(str(seg), float(np.percentile(g["v"], q)), len(g)) for seg, g in vals.groupby("segment")
              if len(g) >= MIN_SEGMENT_REQUESTS]
    return max(levels, key=lambda lv: lv[1]) if len(levels) >= 2 else None
