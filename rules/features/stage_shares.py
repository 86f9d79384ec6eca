"""Theme: where TTFT goes. Each stage's share of TTFT among the slowest requests (at or above
``tail_quantile``), around the median (``median_band``) and over every request (``stage_shares_all``:
the stage's seconds summed over the requests / their TTFT summed: who waits, weighted by how many),
from server-side stage spans.
Units: shares 0..1 of TTFT; ``stage_tail_mean_s`` in seconds.
"""

from __future__ import annotations

import numpy as np

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import bool_col, num_col

#: stage -> (its share among median requests, its share among the slowest), one per ``stages.DECOMPOSITION_STAGES``
SHARE_NAMES: dict[str, tuple[str, str]] = {
    stages.TOKENIZE: ("tokenize_share_median", "tokenize_share_tail"),
    stages.QUEUE: ("queue_share_median", "queue_share_tail"),
    stages.PREFILL: ("prefill_share_median", "prefill_share_tail"),
    stages.COMM: ("comm_share_median", "comm_share_tail"),
    stages.SAMPLE: ("sample_share_median", "sample_share_tail"),
    stages.KV_TRANSFER: ("kv_transfer_share_median", "kv_transfer_share_tail"),
    stages.DETOKENIZE: ("detokenize_share_median", "detokenize_share_tail"),
    stages.LUMPED: ("lumped_share_median", "lumped_share_tail"),
    stages.NETWORK: ("network_share_median", "network_share_tail"),
}


def stage_shares(ctx: FeatureContext) -> None:
    """Stage shares of TTFT (median band and slowest tail), the tail's mean stage times, the unattributed rest."""
    st = ctx.steady
    stage_names = [s for s in stages.DECOMPOSITION_STAGES]
    scalar = tuple(n for s in stage_names for n in SHARE_NAMES[s])
    server = st.loc[bool_col(st, "has_server")] if len(st) else st
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
    if "network_s" in st.columns and num_col(st, "network_s").notna().any() and why == "":
        present.append(stages.NETWORK)
    if why:
        ctx.na(("stage_shares_median", "stage_shares_tail", "stage_shares_all", "stage_tail_mean_s",
                "unattributed_share_tail"), why)
        ctx.na(scalar, why)
        return
    ttft = num_col(server, "ttft_s")
    tq = float(ctx.params["tail_quantile"])
    band = float(ctx.params["median_band"])
    lo, mid_lo, mid_hi, hi = np.nanquantile(ttft, [tq, 0.5 - band, 0.5 + band, 1.0])
    tail_m = ttft >= lo
    mid_m = (ttft >= mid_lo) & (ttft <= mid_hi)
    shares: dict[str, dict[str, float]] = {"median": {}, "tail": {}}
    tail_mean: dict[str, float] = {}
    for which, m in (("median", mid_m), ("tail", tail_m)):
        denom = float(ttft[m].sum())
        for s in present:
            vals = num_col(server, stages.stage_column(s))[m]
            if denom > 0:
                shares[which][s] = float(vals.fillna(0).sum() / denom)
            if which == "tail" and m.any():
                tail_mean[s] = float(vals.fillna(0).mean())
    total = float(ttft.sum())
    ctx.add("stage_shares_all", {s: float(num_col(server, stages.stage_column(s)).fillna(0).sum() / total)
                                 for s in present} if total > 0 else None,
            None if total > 0 else "TTFT is zero")
    ctx.add("stage_shares_median", shares["median"])
    ctx.add("stage_shares_tail", shares["tail"])
    ctx.add("stage_tail_mean_s", tail_mean)
    ctx.add("unattributed_share_tail", max(0.0, 1.0 - sum(shares["tail"].values())))
    for s in stage_names:
        for which, name in zip(("median", "tail"), SHARE_NAMES[s]):
            if s in shares[which]:
                ctx.add(name, shares[which][s])
            else:
                ctx.add(name, None, f"no request has a {s} stage span"
                        + (" (needs both client and server sides)" if s == stages.NETWORK else ""))
