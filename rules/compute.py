"""Rules for the forward pass itself: prefill compute and tensor-parallel communication."""

from __future__ import annotations

from rules.base import RuleContext, Outcome, ev, rule, strength, th_text
from rules.model import Evidence, Finding

PREFILL_CHECKS = [
    "the prompt-length slope (ms per prompt token): shorter prompts, prefix caching of shared prefixes",
    "more tensor-core compute helps prefill: a faster GPU, FP8/INT8 matmuls where accuracy allows "
    "(quantization does not lower TTFT by itself)",
    "chunked prefill / max_num_batched_tokens to bound how long one long prompt holds the device",
    "compute utilisation (SM / tensor activity), not GPU utilisation alone",
]


def _share_label(ctx: RuleContext, stage: str) -> tuple[str, str]:
    """(evidence name, how it was measured) of a stage's TTFT share: spans (slowest 5%) or engine metrics."""
    if ctx.features.get(f"{stage}_share_tail").source == "prometheus":
        return (f"{stage} share of TTFT (engine metrics)",
                f"mean {stage} time / mean TTFT from the engine's histograms, request-weighted over scrape windows")
    return f"{stage} share of TTFT (slowest 5%)", ""


def _prefill_metric_rows(ctx: RuleContext) -> list[Evidence]:
    """What the engine's own counters say about prompt processing (no thresholds: context)."""
    rows: list[Evidence] = []
    busy = ctx.v("prefill_busy_ratio")
    spt = ctx.v("prefill_s_per_token")
    rate = ctx.v("prompt_tokens_per_s")
    if spt:
        rows.append(ev("prompt tokens per prompt-processing second", 1.0 / spt, None, "tokens/s",
                       f"{spt * 1e3:.3g} ms per prompt token (Δ prompt seconds / Δ prompt tokens; per slot when "
                       "the engine sums its slots' times)"))
    if rate is not None and busy is not None:
        rows.append(ev("prompt tokens computed per second", rate, None, "tokens/s",
                       "the prompt load; x seconds per prompt token = the prefill busy time"))
    return rows


@rule("prefill_compute", "prefill_compute", needs=(("prefill_share_tail",), ("ttft_prompt_r2", "ttft_prompt_explained_frac"),
                                                   ("prefill_busy_ratio",)))
def prefill_compute(ctx: RuleContext) -> Outcome:
    """TTFT rises with prompt length and the forward pass dominates it (or, from engine metrics
    alone, the engine is busy processing prompts most of the time)."""
    th = ctx.th
    r2 = ctx.v("ttft_prompt_r2")
    expl = ctx.v("ttft_prompt_explained_frac")
    slope = ctx.v("ttft_prompt_slope_ms_per_token")
    fit_ok = r2 is not None and expl is not None and r2 >= th["r2_min"] and expl >= th["explained_frac_min"]
    fit_rows = []
    if r2 is not None:
        fit_rows = [
            ev("TTFT vs prompt tokens R²", r2, th_text(">=", th["r2_min"], ""), "",
               f"requests that did not queue; slope {slope:.3g} ms/token, intercept "
               f"{ctx.v('ttft_prompt_intercept_ms', 0):.3g} ms"),
            ev("prompt-proportional part of median TTFT", expl, th_text(">=", th["explained_frac_min"], "share"), "share",
               "slope x mean prompt / mean TTFT: how much of the TTFT time is prompt processing"),
        ]
    busy = ctx.v("device_busy_frac")
    busy_row = ev("device busy fraction", busy, th_text(">=", th["device_busy_min"], "share"), "share",
                  f"from {ctx.features.get('device_busy_frac').source}: compute load") if busy is not None else None
    if ctx.has("prefill_share_tail"):
        ps = ctx.v("prefill_share_tail")
        if fit_ok and ps >= th["share_min"]:
            directness, strengths = 0.9, [strength(ps, th["share_min"]), strength(r2, th["r2_min"]),
                                          strength(expl, th["explained_frac_min"])]
        elif ps >= th["share_only_min"] and r2 is not None and (
                r2 < th["r2_contradicts_max"] or (expl is not None and expl < th["explained_frac_min"])):
            # a prompt-length fit exists and says the request's own prompt is not what costs the time
            return (f"prefill is {ps:.0%} of the slowest TTFTs but each request's own prompt length explains little "
                    f"of it (R² {r2:.2f}, prompt-proportional part {expl or 0:.0%}): other requests' prefills share "
                    "its steps (see interference)")
        elif ps >= th["share_only_min"]:
            directness, strengths = 0.7, [strength(ps, th["share_only_min"])]
        else:
            why = (f"prefill share of TTFT in the engine's metrics is {ps:.0%}" if _share_label(ctx, "prefill")[1]
                   else f"prefill share of the slowest 5% is {ps:.0%}")
            if r2 is None:
                return why + f" (< {th['share_only_min']:.0%} without a prompt-length sweep: {ctx.features.get('ttft_prompt_r2').reason})"
            return why + f"; TTFT vs prompt length R² {r2:.2f}, prompt-proportional part {expl:.0%}"
        label, how = _share_label(ctx, "prefill")
        evid = [ev(label, ps, th_text(">=", th["share_min"] if fit_ok else th["share_only_min"], "share"), "share",
                   "forward passes over the prompt tokens" + (f" ({how})" if how else ""))] + fit_rows
        pb = ctx.v("prefill_busy_ratio")
        if pb is not None:
            evid.append(ev("prefill busy: prompt-processing seconds per second", pb, None, "s/s",
                           "from the engine's counters: how much of the time the engine spends on prompts"))
        evid += _prefill_metric_rows(ctx)
        note = None
        if busy is not None:
            evid.append(busy_row)
            if busy < th["device_busy_min"]:
                directness *= 0.7
                note = f"the device is busy only {busy:.0%} of the time: prefill is long but the device is not saturated"
        s, pct = ctx.explained(ps)
        title = ("Prefill compute: the forward pass dominates TTFT (engine metrics)" if how and not fit_ok
                 else "Prefill compute: TTFT grows with prompt length and the forward pass dominates it")
        return Finding("prefill_compute", "prefill_compute", title,
                       ctx.confidence(directness, strengths), s, pct, evid, PREFILL_CHECKS, note=note)
    if r2 is None and ctx.has("prefill_busy_ratio"):
        return _prefill_busy(ctx, busy_row)
    # black box: TTFT linear in prompt length at concurrency 1, at a per-token cost a parallel prefill can have
    if not fit_ok:
        return f"TTFT vs prompt length: R² {r2:.2f}, prompt-proportional part {expl:.0%}"
    per_itl = ctx.v("prompt_slope_per_itl")
    if per_itl is not None and per_itl >= th["bb_slope_per_itl_max"]:
        return (f"a prompt token costs {per_itl:.2f} of a decode step (>= {th['bb_slope_per_itl_max']:g}): "
                "too slow for a parallel prefill (see tokenize)")
    if per_itl is not None:
        fit_rows.append(ev("TTFT per prompt token / ITL p50", per_itl, th_text("<", th["bb_slope_per_itl_max"], "x"), "x",
                           "a prompt token costs a small part of a decode step, as a parallel prefill does"))
    s, pct = ctx.explained(min(expl, 1.0))
    return Finding("prefill_compute", "prefill_compute",
                   "TTFT grows linearly with prompt length at low concurrency: prefill compute (black box)",
                   ctx.confidence(0.85, [strength(r2, th["r2_min"]), strength(expl, th["explained_frac_min"])],
                                  black_box=True), s, pct, fit_rows, PREFILL_CHECKS, black_box=True,
                   note="client-only evidence: the prompt-length sweep shows the cost; the device load is not observed")


def _prefill_busy(ctx: RuleContext, busy_row: Evidence | None) -> Outcome:
    """Engine metrics only (llama.cpp): no TTFT split, but the engine's prompt-seconds counter says
    the device is busy with prefill most of the time, so new requests' TTFT is prompt processing
    (their own and the prompts ahead of them)."""
    th = ctx.th
    pb = ctx.v("prefill_busy_ratio")
    if pb < th["busy_ratio_min"]:
        return (f"the engine spends {pb:.2f} s per s processing prompts (< {th['busy_ratio_min']:g}); "
                "no prefill share or prompt-length sweep to say more")
    evid = [ev("prefill busy: prompt-processing seconds per second", pb, th_text(">=", th["busy_ratio_min"], "s/s"), "s/s",
               "from the engine's prompt-seconds counter: the engine is processing prompts most of the time, so "
               "new requests wait behind prompt processing (summed over slots: above 1 means several slots' "
               "prompts at once)")]
    evid += _prefill_metric_rows(ctx)
    waiting = ctx.v("waiting_seqs_max")
    if waiting:
        evid.append(ev("requests waiting (max)", waiting, None, "requests",
                       f"requests deferred while the slots process prompts ({ctx.features.get('waiting_seqs_max').source})"))
    directness = 0.6
    note = "TTFT is not split into stages here, so the share of TTFT it explains is unknown"
    busy = ctx.v("device_busy_frac")
    if busy_row is not None:
        evid.append(busy_row)
        if busy < th["device_busy_min"]:
            directness *= 0.7
            note += f"; the device is busy only {busy:.0%} of the time"
    return Finding("prefill_compute", "prefill_compute",
                   "Prefill compute: the engine spends most of its time processing prompts (engine metrics)",
                   ctx.confidence(directness, [strength(pb, th["busy_ratio_min"])]), None, None, evid, PREFILL_CHECKS,
                   note=note)


COMM_CHECKS = [
    "comm share of prefill and link counters (NVLink / PCIe throughput in the NVML series)",
    "GPU topology (nvidia-smi topo -m): NVLink / NVSwitch against PCIe, cross-node links",
    "a faster interconnect and a better parallel strategy (smaller TP, pipeline stages, data-parallel "
    "replicas) rather than more GPUs",
]


@rule("comm", "comm", needs=(("comm_share_of_prefill",), ("tp_ttft_ratio",)))
def comm(ctx: RuleContext) -> Outcome:
    """Tensor-parallel communication takes a large part of prefill, or TP>1 is slower than TP=1."""
    th = ctx.th
    share = ctx.v("comm_share_of_prefill")
    ratio = ctx.v("tp_ttft_ratio")
    evid = []
    strengths = []
    if share is not None and share >= th["share_of_prefill_min"]:
        evid.append(ev("comm share of prefill", share, th_text(">=", th["share_of_prefill_min"], "share"), "share",
                       f"all-reduces inside the prefill passes (TP={ctx.v('tp_size', 0):g})"))
        strengths.append(strength(share, th["share_of_prefill_min"]))
    if ratio is not None and ratio >= th["tp_ratio_min"]:
        by = ctx.v("ttft_by_tp") or {}
        evid.append(ev("TTFT per prompt token, highest / lowest TP", ratio, th_text(">=", th["tp_ratio_min"], "x"), "x",
                       "more GPUs made TTFT worse: " + ", ".join(f"TP={k}: {v * 1e3:.0f} ms" for k, v in by.items())))
        strengths.append(strength(ratio, th["tp_ratio_min"]))
    if not evid:
        parts = []
        if share is not None:
            parts.append(f"comm share of prefill {share:.0%} (< {th['share_of_prefill_min']:.0%})")
        if ratio is not None:
            parts.append(f"TP ratio {ratio:.2f} (< {th['tp_ratio_min']:g})")
        return "; ".join(parts)
    cs = ctx.v("comm_share_tail")
    if cs is None and share is not None:
        cs = share * (ctx.v("prefill_share_tail") or 0.0) / max(1e-9, 1.0 - share)
    if cs is None and ratio is not None:
        cs = 1.0 - 1.0 / ratio
    s, pct = ctx.explained(cs)
    bb = share is None
    return Finding("comm", "comm", "Multi-GPU communication: tensor-parallel collectives stretch prefill",
                   ctx.confidence(0.9 if not bb else 0.75, strengths, black_box=bb and ctx.black_box), s, pct, evid,
                   COMM_CHECKS, black_box=bb and ctx.black_box,
                   note=(("client-only evidence: " if ctx.black_box else "")
                         + "TP degrees compared across runs in this capture; collective time itself not observed")
                   if bb else None)
