"""Theme: the front end before the engine (HTTP workers, tokenizer threads, API-server IPC).

* Server spans of the bundled server (``stages.ATTR_FRONTEND_*`` on the request span): the
  front-end wait's share of TTFT (slowest 5%, median), its median, and the share of it spent
  waiting for an HTTP worker rather than a tokenizer thread.
* Client + server joined: client TTFT - server TTFT by in-flight level. A gap that grows with
  load is work queued outside the engine's clock (an external engine whose TTFT starts after
  its front end); a network delay is the same at every level.
* Client + the engine's gauges: at each scrape, requests the client had in flight that the engine
  did not count (client in flight then - the engine's running + waiting), the mean over scrapes.
* Dynamo: the front end's own time (``frontend_time_s``) against its TTFT, from /metrics.

Units: shares 0..1, seconds, x, decode steps, requests. Reads what the ``latency``,
``concurrency`` and ``device`` themes wrote (runs after them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.capture import attribute
from rules.features.context import FeatureContext
from rules.features.numeric import bool_col, num_col

WAIT_NAMES = ("frontend_wait_share_tail", "frontend_wait_share_median", "frontend_wait_p50_s", "frontend_http_wait_frac")
GAP_NAMES = ("client_server_gap_by_inflight", "client_server_gap_concurrency_ratio", "client_server_gap_rise_per_itl")


def frontend(ctx: FeatureContext) -> None:
    """Every front-end feature (see the module doc)."""
    _server_wait(ctx)
    _gap_by_load(ctx)
    _unseen_by_engine(ctx)
    _dynamo(ctx)


def _server_wait(ctx: FeatureContext) -> None:
    st = ctx.steady
    spans = ctx.spans
    if len(st) == 0 or len(spans) == 0 or "trace_id" not in st.columns:
        ctx.na(WAIT_NAMES, "no completed requests with server spans")
        return
    roots = spans.loc[spans["name"] == stages.SPAN_REQUEST]
    wait = pd.to_numeric(attribute(roots, stages.ATTR_FRONTEND_WAIT_S), errors="coerce")
    if wait.notna().sum() == 0:
        ctx.na(WAIT_NAMES, "no request span carries ttft.frontend.wait_s (the bundled server writes it)")
        return
    http = pd.to_numeric(attribute(roots, stages.ATTR_FRONTEND_HTTP_WAIT_S), errors="coerce")
    by_trace = pd.DataFrame({"trace_id": roots["trace_id"].astype(str).to_numpy(), "fe_wait_s": wait.to_numpy(),
                             "fe_http_s": http.to_numpy()}).drop_duplicates("trace_id")
    server = st.loc[bool_col(st, "has_server")] if "has_server" in st.columns else st
    j = server[["trace_id", "ttft_s"]].assign(trace_id=server["trace_id"].astype(str)).merge(by_trace, on="trace_id")
    j = j.loc[num_col(j, "fe_wait_s").notna() & num_col(j, "ttft_s").notna()]
    if len(j) == 0:
        ctx.na(WAIT_NAMES, "no steady request has a front-end wait")
        return
    ttft = num_col(j, "ttft_s").to_numpy(dtype="float64")
    w = num_col(j, "fe_wait_s").to_numpy(dtype="float64")
    tq = float(ctx.params["tail_quantile"])
    band = float(ctx.params["median_band"])
    lo, mid_lo, mid_hi = np.quantile(ttft, [tq, 0.5 - band, 0.5 + band])
    for name, m in (("frontend_wait_share_tail", ttft >= lo), ("frontend_wait_share_median", (ttft >= mid_lo) & (ttft <= mid_hi))):
        denom = float(ttft[m].sum())
        ctx.add(name, float(w[m].sum() / denom) if denom > 0 else None, None if denom > 0 else "TTFT is zero")
    ctx.add("frontend_wait_p50_s", float(np.median(w)))
    total = float(w.sum())
    h = num_col(j, "fe_http_s").fillna(0.0).to_numpy(dtype="float64")
    ctx.add("frontend_http_wait_frac", float(h.sum() / total) if total > 0 else None,
            None if total > 0 else "no request waited in the front end")


def _gap_by_load(ctx: FeatureContext) -> None:
    st = ctx.steady
    if len(st) == 0 or not len(ctx.inflight_at):
        ctx.na(GAP_NAMES, "no completed requests")
        return
    both = bool_col(st, "has_server") & bool_col(st, "has_client")
    gap = (num_col(st, "client_ttft_s") - num_col(st, "server_ttft_s")).where(both)
    x = ctx.inflight_at.reindex(st.index)
    ok = gap.notna() & x.notna()
    if ok.sum() == 0:
        ctx.na(GAP_NAMES, "needs requests seen by both the client and the server (join a client and a server capture)")
        return
    gap, x = gap[ok], x[ok]
    if x.nunique() > int(ctx.params["max_inflight_bins"]):
        key = x.groupby(pd.qcut(x, int(ctx.params["max_inflight_bins"]), duplicates="drop"), observed=True).transform("median")
    else:
        key = x
    g = gap.groupby(key)
    curve = g.median()[g.size() >= int(ctx.params["min_bin_requests"])].sort_index()
    if len(curve) < 2:
        ctx.na(GAP_NAMES, "the client-server gap is known at one load level only: needs a concurrency sweep")
        return
    ctx.add("client_server_gap_by_inflight", {f"{k:g}": float(v) for k, v in curve.items()})
    base = float(curve.iloc[0])
    top = float(curve.iloc[-1])
    ctx.add("client_server_gap_concurrency_ratio", top / base if base > 0 else (None if top <= 0 else float("inf")),
            None if base > 0 or top > 0 else "no client-server gap at any level")
    itl = ctx.features.value("itl_p50_s")
    ctx.add("client_server_gap_rise_per_itl", (top - base) / itl if itl else None, None if itl else "no ITL")


def _unseen_by_engine(ctx: FeatureContext) -> None:
    """At each scrape of the engine's gauges: the client's requests in flight then, less the engine's
    running + waiting; the mean over the scrapes with two or more in flight (requests), and its share
    of the client's requests in flight at those scrapes."""
    names = ("engine_unseen_inflight", "engine_unseen_share")
    wait = ctx.series_values(stages.SERIES_WAITING)
    run = ctx.series_values(stages.SERIES_RUNNING)
    req = ctx.req_all
    if not len(wait) or not len(run) or not len(req) or not bool(bool_col(req, "has_client").any()):
        ctx.na(names, f"needs client requests and the engine's {stages.SERIES_WAITING} and {stages.SERIES_RUNNING} series")
        return
    g = pd.DataFrame({"ts_s": pd.to_numeric(wait["ts_s"], errors="coerce"), "entity": wait["entity"].astype(str),
                      "w": pd.to_numeric(wait["value"], errors="coerce")}).merge(
        pd.DataFrame({"ts_s": pd.to_numeric(run["ts_s"], errors="coerce"), "entity": run["entity"].astype(str),
                      "r": pd.to_numeric(run["value"], errors="coerce")}), on=["ts_s", "entity"])
    seen = g.groupby("ts_s")[["w", "r"]].sum().sum(axis=1)  # every replica's count at that scrape
    cl = req.loc[bool_col(req, "has_client")]
    start = num_col(cl, "start_ns").to_numpy(dtype="float64") / 1e9
    e2e = num_col(cl, "e2e_s").to_numpy(dtype="float64")
    good = np.isfinite(start) & np.isfinite(e2e)
    s_sorted, e_sorted = np.sort(start[good]), np.sort(start[good] + e2e[good])
    ts = seen.index.to_numpy(dtype="float64")
    inflight = np.searchsorted(s_sorted, ts, side="right") - np.searchsorted(e_sorted, ts, side="right")
    busy = inflight >= 2
    if busy.sum() < 3:
        ctx.na(names, "fewer than 3 scrapes while the client had two or more requests in flight")
        return
    unseen = np.maximum(inflight[busy] - seen.to_numpy(dtype="float64")[busy], 0.0)
    ctx.add("engine_unseen_inflight", float(unseen.mean()), source="prometheus")
    ctx.add("engine_unseen_share", float(unseen.sum() / inflight[busy].sum()), source="prometheus")


def _dynamo(ctx: FeatureContext) -> None:
    fe = ctx.series_values(stages.SERIES_FRONTEND_TIME_S)
    ttft = ctx.series_values(stages.SERIES_TTFT_S)
    if not len(fe) or not len(ttft):
        ctx.na(("metrics_frontend_share",), f"needs {stages.SERIES_FRONTEND_TIME_S} and {stages.SERIES_TTFT_S} "
               "series (a Dynamo front end and its workers scraped together)")
        return
    t = float(pd.to_numeric(ttft["value"]).mean())
    f = float(pd.to_numeric(fe["value"]).clip(lower=0).mean())
    ctx.add("metrics_frontend_share", min(f / t, 1.0) if t > 0 else None, None if t > 0 else "TTFT series is zero",
            source="prometheus")
