"""Prefix-cache features: whether prompts that repeat a prefix are spared its prefill.

Which requests repeat a prefix is known only by design: the probe's ``--shared-prefix N:R``
marks each request ``first`` (a fresh prefix), ``repeat`` (the same prefix again) or
``control`` (the suffix alone: what a repeat costs when its prefix is cached) on its client
span (``ttft.client.prefix_role``). Nothing else in a capture says that prompts share text
(prompt text is never recorded), so without that design the features are unavailable and the
rule is skipped with the reason.

* client (any side): TTFT p50 of each role; ``prefix_cost_share`` = (first - control) / first,
  the prefix's share of an uncached TTFT; ``prefix_repeat_saving_frac`` = (first - repeat) /
  (first - control), the part of that cost repeats were spared (1: all, 0: none).
* server: ``prefix_repeat_cached_frac``, the repeats' cached prompt tokens (the bundled
  engine's and vLLM's ``gen_ai.usage.cached_tokens`` on the request span) over their prefix
  tokens; ``prefix_cached_tokens_frac``, cached over all prompt tokens of the ok requests;
  ``prefix_caching_enabled`` from ``meta.json`` ``engine_config.prefix_caching`` (bundled
  engine only).
* engine metrics: ``prefix_cache_hit_ratio_metrics``, the windowed mean of the canonical
  ``prefix_cache_hit_ratio`` series (vLLM hits/queries or by-source, SGLang, llama.cpp and
  TensorRT-LLM adapters); with the design, ``prefix_metrics_cached_frac`` = that ratio over the
  one a working cache gives the design's prompts (the repeats' prefix tokens over all prompt
  tokens: 1 = as cached as the design allows); ``engines_seen`` (populations), the engines seen (to word
  the next checks).

Runs on the calling thread, on the shared :class:`~rules.features.context.FeatureContext`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import num_col

CLIENT_NAMES = ("prefix_first_ttft_p50_s", "prefix_repeat_ttft_p50_s", "prefix_control_ttft_p50_s",
                "prefix_cost_share", "prefix_repeat_saving_frac", "prefix_shared_tokens", "prefix_metrics_cached_frac")
NO_DESIGN = ("no request is marked as repeating a prefix: prompt text is not recorded, so only a designed "
             "probe (ttft probe --shared-prefix N:R) tells which prompts share one")


def _roles(ctx: FeatureContext) -> pd.Series:
    req = ctx.steady
    if req is None or req.empty or "prefix_role" not in req.columns:
        return pd.Series(dtype=object)
    return req["prefix_role"].where(req["prefix_role"].notna(), None)


def prefix_cache(ctx: FeatureContext) -> None:
    """``prefix_*``: the designed probe's roles against TTFT, cached tokens on spans, engine hit ratios."""
    p = ctx.params
    cfg = ctx.meta.get("engine_config") if isinstance(ctx.meta, dict) else None
    on = cfg.get("prefix_caching") if isinstance(cfg, dict) else None
    ctx.add("prefix_caching_enabled", float(on) if isinstance(on, bool) else None,
            None if isinstance(on, bool) else "the engine's configuration does not say (bundled engine: meta.json)")
    hit = ctx.wmean(stages.SERIES_PREFIX_CACHE_HIT_RATIO)
    ctx.add("prefix_cache_hit_ratio_metrics", hit, None if hit is not None else
            "the engine's metrics have no prefix-cache hit ratio (vLLM prefix_cache_hits/queries, SGLang "
            "cached_tokens_total, llama.cpp prompt_tokens_cached_total, TensorRT-LLM kv_cache_hit_rate)",
            source="prometheus")
    req = ctx.steady if ctx.steady is not None else pd.DataFrame()
    cached = num_col(req, "cached_tokens") if len(req) else pd.Series(dtype="float64")
    inp = num_col(req, "input_tokens") if len(req) else pd.Series(dtype="float64")
    known = cached.notna() & (inp > 0)
    ctx.add("prefix_cached_tokens_frac", float(cached[known].sum() / inp[known].sum()) if known.any() else None,
            None if known.any() else "no request span carries cached prompt tokens (gen_ai.usage.cached_tokens)",
            source="spans")
    roles = _roles(ctx)
    n = {r: int((roles == r).sum()) for r in ("first", "repeat", "control")}
    ctx.add("prefix_first_n", float(n["first"]))
    ctx.add("prefix_repeat_n", float(n["repeat"]))
    ctx.add("prefix_control_n", float(n["control"]))
    min_n = int(p["prefix_min_role_requests"])
    if n["repeat"] < min_n or n["first"] < 1:
        why = NO_DESIGN if not any(n.values()) else (
            f"{n['first']} first uses and {n['repeat']} repeats of a shared prefix (< {min_n} repeats)")
        ctx.na(CLIENT_NAMES + ("prefix_repeat_cached_frac",), why)
        return
    ttft = num_col(req, "ttft_s")
    med = {r: float(np.nanmedian(ttft[roles == r])) if n[r] else None for r in n}
    ptok = num_col(req, "prefix_tokens")
    ctx.add("prefix_shared_tokens", float(np.nanmedian(ptok[roles.isin(["first", "repeat"])])))
    ctx.add("prefix_first_ttft_p50_s", med["first"])
    ctx.add("prefix_repeat_ttft_p50_s", med["repeat"])
    rep = roles == "repeat"
    inp_all = num_col(req, "input_tokens").where(lambda x: x > 0, ptok)
    expected = float(ptok[rep].sum() / inp_all[roles.notna()].sum()) if inp_all[roles.notna()].sum() > 0 else 0.0
    ctx.add("prefix_metrics_cached_frac", min(1.5, hit / expected) if hit is not None and expected > 0 else None,
            None if hit is not None and expected > 0 else "the engine's metrics have no prefix-cache hit ratio",
            source="prometheus")
    rk = rep & cached.notna() & (ptok > 0)
    served = rep & (req["has_server"].astype(bool) if "has_server" in req.columns else False)
    if rk.any():
        ctx.add("prefix_repeat_cached_frac", float(np.clip(cached[rk] / ptok[rk], 0, 1).mean()), source="spans")
    elif on is False and served.any():  # the engine ran with its prefix cache off: nothing was cached
        ctx.add("prefix_repeat_cached_frac", 0.0, source="engine_config")
    else:
        ctx.add("prefix_repeat_cached_frac", None, "the server spans carry no cached prompt tokens "
                "(gen_ai.usage.cached_tokens): not reported, or no server side in the capture")
    if n["control"] < 1:
        ctx.na(("prefix_control_ttft_p50_s", "prefix_cost_share", "prefix_repeat_saving_frac"),
               "no control request (the suffix alone): use --shared-prefix N:R")
        return
    first, repeat, control = med["first"], med["repeat"], med["control"]
    ctx.add("prefix_control_ttft_p50_s", control)
    cost = first - control
    ctx.add("prefix_cost_share", max(0.0, cost / first) if first > 0 else None)
    ctx.add("prefix_repeat_saving_frac", float(np.clip((first - repeat) / cost, -1.0, 2.0)) if cost > 0 else None,
            None if cost > 0 else f"a first use (TTFT p50 {first * 1e3:.1f} ms) costs no more than a control "
            f"({control * 1e3:.1f} ms): the prefix's prefill is not seen in TTFT")
