"""Theme: LoRA adapter slots. A server holds a few adapters at once (vLLM ``--max-loras``) and
batches only requests of those; a request for another waits until a slot frees and its adapter
is loaded. Requests that wait for something other than capacity show in vLLM's metrics as
``num_requests_waiting_by_reason{reason="deferred"}`` (a LoRA budget, a grammar, a KV transfer).

* client, the control (``ttft probe --lora A,B,...``'s lora sweep, or ttft diagnose's LoRA
  follow-up: segments ``lora=K``, K of the adapters asked for, at the same load):
  ``lora_mix_ttft_x`` (x), TTFT p50 with all the adapters over TTFT p50 with one;
  ``lora_mix_wait_share`` (share), the part of the mixed TTFT beyond the one-adapter control;
  ``lora_mix_above_control_frac`` (share), the mixed requests slower than the control's 90th
  percentile (chance: 10%), and ``lora_mix_n`` (requests) of them.
* client, within the mix: each request's role on its client span
  (``ttft.client.lora_role``, see :mod:`collectors.probe.lora`). ``lora_other_ttft_p50_s`` /
  ``lora_joins_ttft_p50_s`` (s): requests sent while only other adapters were in flight, and
  while their own was; their ratio ``lora_other_ttft_x`` (x); ``lora_wait_share_of_ttft``
  (share): the ``other`` requests' TTFT beyond the ``joins`` median, summed, over all the LoRA
  requests' TTFT; ``lora_adapters_n`` (count), ``lora_other_n``, ``lora_joins_n`` (requests).
* server (the bundled engine's request spans, ``ttft.lora.*``): ``lora_slot_wait_share`` /
  ``lora_slot_wait_share_tail`` (share), the seconds requests were deferred for an adapter slot over
  their TTFT (all LoRA requests, the slowest ``tail_quantile``); ``lora_load_share`` (share), the
  adapters' loads over TTFT; ``lora_server_requests_n`` (requests).
* engine metrics: ``waiting_deferred_share`` (share), the windowed mean of deferred waiting
  requests over all waiting ones (None when nothing waited).

Runs on the feature computation's thread, on the shared :class:`~rules.features.context.FeatureContext`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import num_col

CLIENT_NAMES = ("lora_other_ttft_p50_s", "lora_joins_ttft_p50_s", "lora_other_ttft_x", "lora_wait_share_of_ttft")
SERVER_NAMES = ("lora_slot_wait_share", "lora_slot_wait_share_tail", "lora_load_share")
SERVER_SOURCE = "request spans (ttft.lora.*)"
MIX_NAMES = ("lora_mix_ttft_x", "lora_mix_wait_share", "lora_mix_above_control_frac", "lora_mix_n")
#: a lora sweep point's label: ``lora=K``
LORA_SEGMENT = r"^lora=([0-9]+)$"
NO_DESIGN = ("no request is marked with a LoRA role: only a designed probe (ttft probe --lora A,B,...) says which "
             "adapters were in flight when each request was sent")


def lora(ctx: FeatureContext) -> None:
    """``lora_*`` from the designed probe's roles; ``waiting_deferred_share`` from the engine's metrics."""
    _deferred(ctx)
    _server(ctx)
    st = pd.concat([d for d in (ctx.steady, ctx.lora_design) if d is not None and len(d)], ignore_index=True) \
        if len(ctx.lora_design) else (ctx.steady if ctx.steady is not None else pd.DataFrame())
    st = _mix(ctx, st)
    roles = st["lora_role"] if len(st) and "lora_role" in st.columns else pd.Series(dtype=object)
    n = {r: int((roles == r).sum()) for r in ("alone", "joins", "other")}
    ctx.add("lora_adapters_n", float(st.loc[roles.notna(), "lora"].nunique()) if n and roles.notna().any() else 0.0)
    ctx.add("lora_joins_n", float(n["joins"]))
    ctx.add("lora_other_n", float(n["other"]))
    min_n = int(ctx.params["lora_min_role_requests"])
    if n["joins"] < min_n or n["other"] < min_n:
        why = NO_DESIGN if not any(n.values()) else (
            f"{n['joins']} requests joined their adapter in flight and {n['other']} came while only others were "
            f"(< {min_n} of each): give two or more adapters and a concurrency above 1")
        ctx.na(CLIENT_NAMES, why)
        return
    ttft = num_col(st, "ttft_s")
    joins = float(np.nanmedian(ttft[roles == "joins"]))
    other = float(np.nanmedian(ttft[roles == "other"]))
    ctx.add("lora_joins_ttft_p50_s", joins)
    ctx.add("lora_other_ttft_p50_s", other)
    ctx.add("lora_other_ttft_x", other / joins if joins > 0 else None,
            None if joins > 0 else "the joining requests' TTFT median is 0")
    excess = (ttft[roles == "other"] - joins).clip(lower=0).sum()
    total = ttft[roles.notna()].sum()
    ctx.add("lora_wait_share_of_ttft", float(excess / total) if total > 0 else None,
            None if total > 0 else "no TTFT among the LoRA requests")


def _mix(ctx: FeatureContext, st: pd.DataFrame) -> pd.DataFrame:
    """``lora_mix_*`` from the ``lora=K`` segments (the one-adapter control against the most adapters);
    returns the requests the roles are read from: the most adapters' segment when there is a sweep."""
    k = (st["segment"].astype(str).str.extract(LORA_SEGMENT)[0].astype("float64")
         if len(st) and "segment" in st.columns else pd.Series(dtype="float64"))
    min_n = int(ctx.params["lora_min_role_requests"])
    top = float(k.max()) if k.notna().any() else None
    if top is None or top < 2 or int((k == 1).sum()) < min_n or int((k == top).sum()) < min_n:
        ctx.na(MIX_NAMES, "no one-adapter control beside the mix (ttft probe --lora A,B,...: a lora sweep of one "
                          "adapter, then all)" if top is None else
               f"the lora sweep has fewer than {min_n} completed requests at one adapter or at {top:g}")
        return st
    ttft = num_col(st, "ttft_s")
    one, mixed = float(np.nanmedian(ttft[k == 1])), float(np.nanmedian(ttft[k == top]))
    ctx.add("lora_mix_ttft_x", mixed / one if one > 0 else None, None if one > 0 else "the control's TTFT median is 0")
    ctx.add("lora_mix_wait_share", max(0.0, 1.0 - one / mixed) if mixed > 0 else None,
            None if mixed > 0 else "the mix's TTFT median is 0")
    mix = ttft[k == top].dropna()
    ctx.add("lora_mix_above_control_frac", float((mix > np.nanquantile(ttft[k == 1], 0.9)).mean()))
    ctx.add("lora_mix_n", float(len(mix)))
    return st.loc[k == top]


def _server(ctx: FeatureContext) -> None:
    st = pd.concat([d for d in (ctx.steady, ctx.lora_design) if d is not None and len(d)], ignore_index=True) \
        if len(ctx.lora_design) else (ctx.steady if ctx.steady is not None else pd.DataFrame())
    has = st["lora_name"].notna() if len(st) and "lora_name" in st.columns else pd.Series(False, index=st.index)
    ctx.add("lora_server_requests_n", float(has.sum()), source=SERVER_SOURCE)
    g = st.loc[has]
    ttft = num_col(g, "ttft_s")
    ok = ttft.notna() & (ttft > 0)
    if ok.sum() < 3:
        ctx.na(SERVER_NAMES, "no request span names its adapter (ttft.lora.name): no LoRA request reached an engine "
                             "that reports its slot waits" if not has.any() else "fewer than 3 completed LoRA requests")
        return
    g, t = g.loc[ok], ttft[ok]
    wait = num_col(g, "lora_wait_s").fillna(0.0).clip(lower=0.0)
    wait = wait.where(wait <= t, t)
    tail = t >= t.quantile(float(ctx.params["tail_quantile"]))
    ctx.add("lora_slot_wait_share", float(wait.sum() / t.sum()), source=SERVER_SOURCE)
    ctx.add("lora_slot_wait_share_tail", float(wait[tail].sum() / t[tail].sum()), source=SERVER_SOURCE)
    ctx.add("lora_load_share", float(num_col(g, "lora_load_s").fillna(0.0).sum() / t.sum()), source=SERVER_SOURCE)


def _deferred(ctx: FeatureContext) -> None:
    deferred = ctx.wmean(stages.SERIES_WAITING_DEFERRED)
    waiting = ctx.wmean(stages.SERIES_WAITING)
    if deferred is None or waiting is None:
        ctx.add("waiting_deferred_share", None, "the engine's metrics do not split waiting requests by reason "
                "(vLLM num_requests_waiting_by_reason)", source="prometheus")
    elif waiting <= 0:
        ctx.add("waiting_deferred_share", None, "no request waited in the engine's metrics", source="prometheus")
    else:
        ctx.add("waiting_deferred_share", min(1.0, deferred / waiting), source="prometheus")
