"""Theme: LoRA adapter slots. A server holds a few adapters at once (vLLM ``--max-loras``) and
batches only requests of those; a request for another waits until a slot frees and its adapter
is loaded. Requests that wait for something other than capacity show in vLLM's metrics as
``num_requests_waiting_by_reason{reason="deferred"}`` (a LoRA budget, a grammar, a KV transfer).

* client (designed probe, ``ttft probe --lora A,B,...``, or ttft diagnose's LoRA follow-up): each
  request's role on its client span
  (``ttft.client.lora_role``, see :mod:`collectors.probe.lora`). ``lora_other_ttft_p50_s`` /
  ``lora_joins_ttft_p50_s`` (s): requests sent while only other adapters were in flight, and
  while their own was; their ratio ``lora_other_ttft_x`` (x); ``lora_wait_share_of_ttft``
  (share): the ``other`` requests' TTFT beyond the ``joins`` median, summed, over all the LoRA
  requests' TTFT; ``lora_adapters_n`` (count), ``lora_other_n``, ``lora_joins_n`` (requests).
* engine metrics: ``waiting_deferred_share`` (share), the windowed mean of deferred waiting
  requests over all waiting ones (None when nothing waited).

Runs on the feature computation's thread, on the shared :class:`~rules.features.context.FeatureContext`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag import stages
from rules.features.context import FeatureContext
from rules.features.numeric import num_col

CLIENT_NAMES = ("lora_other_ttft_p50_s", "lora_joins_ttft_p50_s", "lora_other_ttft_x", "lora_wait_share_of_ttft")
NO_DESIGN = ("no request is marked with a LoRA role: only a designed probe (ttft probe --lora A,B,...) says which "
             "adapters were in flight when each request was sent")


def lora(ctx: FeatureContext) -> None:
    """``lora_*`` from the designed probe's roles; ``waiting_deferred_share`` from the engine's metrics."""
    _deferred(ctx)
    st = pd.concat([d for d in (ctx.steady, ctx.lora_design) if d is not None and len(d)], ignore_index=True) \
        if len(ctx.lora_design) else (ctx.steady if ctx.steady is not None else pd.DataFrame())
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
