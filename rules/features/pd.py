"""Theme: disaggregated prefill/decode. The prefill side computes the prompt's KV and the first
token, the KV moves to the decode side (``kv_transfer``), which admits the request (its own queue:
blocks and a running place) before the first token reaches the user. Each side's own TTFT looks
low; the user's is their sum.

From request spans (the bundled engine under ``ttft serve --pd``: ``ttft.pd.*`` on the request
root, the ``kv_transfer`` stage span, the decode side's ``queue`` span):

* ``pd_requests_n`` (requests): steady requests served disaggregated;
* ``pd_transfer_share`` / ``pd_transfer_share_tail`` (share): KV-transfer seconds over TTFT, over
  all of them and over the slowest ``tail_quantile``;
* ``pd_decode_queue_share`` / ``pd_decode_queue_share_tail`` (share): the decode side's queue (KV
  received to first token back) over TTFT; ``pd_admission_share`` (share): of TTFT, the part of that
  queue spent waiting for the decode side's blocks and a running place;
* ``pd_prefill_ttft_p50_s`` / ``pd_decode_ttft_p50_s`` (s): each side's own TTFT, as each instance
  would report it; ``pd_transfer_p50_s`` (s); ``pd_transfer_vs_prefill_x`` (x): the transfer's
  median over the prefill stage's, what moving the KV costs against computing it;
  ``pd_transfer_floor_vs_prefill_x`` (x): each request's transfer over its own prefill, at
  ``floor_quantile`` (the fastest transfers: those that waited for nothing else, neither an earlier
  transfer on the link nor a busy side), what the link itself takes against computing the KV.

From the engines' metrics alone (each instance's own series, entities ``role=prefill`` and
``role=decode``: the bundled engine's ``--pd`` labels them so on one endpoint, ``--metrics
prefill=URL --metrics decode=URL`` labels two instances' endpoints so; and the KV-transfer histogram):
``pd_metrics_decode_ttft_share`` (share), the decode side's own TTFT (hand-off to first token) over
both sides' together; ``pd_metrics_transfer_share`` (share), the mean transfer over both TTFTs;
``pd_metrics_admission_share`` (share), the decode side's TTFT less the transfer, less its own
compute step (its prefill-time histogram, where it has one: a vLLM decode instance computes the
prompt's last token, ``request_prefill_time_seconds`` from its SCHEDULED to its first token) and
less its front end (taken as the prefill instance's: its TTFT beyond its queue and prefill times,
the API server and its IPC with the engine), over both TTFTs: its wait for blocks and a running
place; ``pd_metrics_transfer_vs_prefill_x`` (x), the mean transfer over the prefill side's prefill
time; ``pd_metrics_prefill_ttft_s`` / ``pd_metrics_decode_ttft_s`` (s), each instance's own mean TTFT.

Runs on the feature computation's thread, on the shared :class:`~rules.features.context.FeatureContext`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import num_col

NAMES = ("pd_transfer_share", "pd_transfer_share_tail", "pd_decode_queue_share", "pd_decode_queue_share_tail",
         "pd_admission_share", "pd_prefill_ttft_p50_s", "pd_decode_ttft_p50_s", "pd_transfer_p50_s",
         "pd_transfer_vs_prefill_x", "pd_transfer_floor_vs_prefill_x")
SOURCE = "request spans (ttft.pd.*, kv_transfer)"
METRIC_NAMES = ("pd_metrics_decode_ttft_share", "pd_metrics_transfer_share", "pd_metrics_admission_share",
                "pd_metrics_transfer_vs_prefill_x", "pd_metrics_prefill_ttft_s", "pd_metrics_decode_ttft_s")


def pd_split(ctx: FeatureContext) -> None:
    """``pd_*``: the hand-off between the prefill and decode sides, as shares of TTFT."""
    _metrics(ctx)
    st = ctx.steady if ctx.steady is not None else pd.DataFrame()
    col = stages.stage_column(stages.KV_TRANSFER)
    has = num_col(st, "pd_decode_ttft_s").notna() if len(st) and "pd_decode_ttft_s" in st.columns \
        else pd.Series(False, index=st.index)
    ctx.add("pd_requests_n", float(has.sum()), source=SOURCE)
    g = st.loc[has]
    ttft = num_col(g, "ttft_s")
    ok = ttft.notna() & (ttft > 0)
    if ok.sum() < 3:
        ctx.na(NAMES, "no disaggregated prefill/decode in the request spans (ttft.pd.*): a single engine, or one "
                      "that does not report its hand-off" if not has.any() else
               "fewer than 3 completed disaggregated requests")
        return
    g, t = g.loc[ok], ttft[ok]
    tail = t >= t.quantile(float(ctx.params["tail_quantile"]))
    for name, part in (("pd_transfer_share", num_col(g, col)), ("pd_decode_queue_share", num_col(g, "pd_decode_queue_s"))):
        part = part.fillna(0.0).clip(lower=0.0)
        ctx.add(name, float(part.sum() / t.sum()), source=SOURCE)
        ctx.add(name + "_tail", float(part[tail].sum() / t[tail].sum()), source=SOURCE)
    ctx.add("pd_admission_share", float(num_col(g, "pd_admission_wait_s").fillna(0.0).sum() / t.sum()), source=SOURCE)
    for name, c in (("pd_prefill_ttft_p50_s", "pd_prefill_ttft_s"), ("pd_decode_ttft_p50_s", "pd_decode_ttft_s"),
                    ("pd_transfer_p50_s", col)):
        v = num_col(g, c).dropna()
        ctx.add(name, float(v.median()) if len(v) else None, None if len(v) else f"no {c} on the requests",
                source=SOURCE)
    transfer_s, prefill_s = num_col(g, col), num_col(g, stages.stage_column(stages.PREFILL))
    transfer, prefill = transfer_s.dropna(), prefill_s.dropna()
    ok = len(transfer) and len(prefill) and float(prefill.median()) > 0
    ctx.add("pd_transfer_vs_prefill_x", float(transfer.median() / prefill.median()) if ok else None,
            None if ok else "no prefill or transfer span to compare", source=SOURCE)
    per_request = (transfer_s / prefill_s.where(prefill_s > 0)).dropna()
    floor = float(per_request.quantile(float(ctx.params["floor_quantile"]))) if len(per_request) else None
    ctx.add("pd_transfer_floor_vs_prefill_x", floor,
            None if floor is not None else "no request with both a prefill and a transfer span", source=SOURCE)


def _role_mean(ctx: FeatureContext, series: str, role: str) -> float | None:
    d = ctx.weighted(series, stages.SERIES_REQUESTS_PER_S)
    d = d.loc[d["entity"].astype(str).str.contains(role, regex=False)]
    return float(np.average(d["value"].to_numpy(), weights=d["w"].to_numpy())) if len(d) else None


def _metrics(ctx: FeatureContext) -> None:
    pre = _role_mean(ctx, stages.SERIES_TTFT_S, stages.ENTITY_ROLE_PREFILL)
    dec = _role_mean(ctx, stages.SERIES_TTFT_S, stages.ENTITY_ROLE_DECODE)
    if pre is None or dec is None or pre + dec <= 0:
        ctx.na(METRIC_NAMES, "the engine's metrics have no TTFT per disaggregated instance (role=prefill and "
                             "role=decode)")
        return
    ctx.add("pd_metrics_decode_ttft_share", dec / (pre + dec), source="prometheus")
    ctx.add("pd_metrics_prefill_ttft_s", pre, source="prometheus")
    ctx.add("pd_metrics_decode_ttft_s", dec, source="prometheus")
    transfer = ctx.wmean(stages.SERIES_KV_TRANSFER_S)
    why = None if transfer is not None else "the engine's metrics have no KV-transfer histogram"
    ctx.add("pd_metrics_transfer_share", transfer / (pre + dec) if transfer is not None else None, why,
            source="prometheus")
    # the decode side's own compute step (vLLM: SCHEDULED -> first token, the prompt's last token computed
    # after the KV arrived) and its front end (API server and IPC: what the prefill instance's TTFT holds
    # beyond its queue and prefill); the bundled engine's decode worker observes no step, its prefill time
    # no role
    step = _role_mean(ctx, stages.SERIES_PREFILL_TIME_S, stages.ENTITY_ROLE_DECODE) or 0.0
    pre_compute = _role_mean(ctx, stages.SERIES_PREFILL_TIME_S, stages.ENTITY_ROLE_PREFILL)
    pre_queue = _role_mean(ctx, stages.SERIES_QUEUE_TIME_S, stages.ENTITY_ROLE_PREFILL) or 0.0
    front = max(pre - pre_queue - pre_compute, 0.0) if pre_compute is not None else 0.0
    ctx.add("pd_metrics_admission_share", max(dec - (transfer or 0.0) - step - front, 0.0) / (pre + dec),
            source="prometheus")
    # the prefill side's prefill time (only that side observes one: then it carries no role)
    prefill = _role_mean(ctx, stages.SERIES_PREFILL_TIME_S, stages.ENTITY_ROLE_PREFILL)
    if prefill is None:
        prefill = ctx.wmean(stages.SERIES_PREFILL_TIME_S)
    ok = transfer is not None and prefill is not None and prefill > 0
    ctx.add("pd_metrics_transfer_vs_prefill_x", transfer / prefill if ok else None,
            None if ok else why or "no prefill time of the prefill instance", source="prometheus")
