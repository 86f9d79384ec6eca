"""Rules for the forward pass itself: prefill compute and tensor-parallel communication.

prefill_compute's paths, tried in order: the engine's prefill share of TTFT (its spans, or its
prefill-time histogram), the client's prompt fit, the engine's prompt-seconds counter alone.
comm's checks, tried in order: ``comm.spans``, the engine's collective time over prefill + collective
time (with the capture's TP degrees compared beside it); ``comm.tp``, when that does not fire, TTFT per
prompt token at the highest TP degree over the lowest. Shares are fractions of TTFT (0..1) unless said
otherwise, prompt work in decode steps. Pure functions of the features, run on the caller's thread."""

from __future__ import annotations

from rules import evidence
from rules.base import (LONE_SWEEP_NOTE, Outcome, RuleContext, Triage, check, checked_rule, finding, lone_sweep,
                        reason, strength)
from rules.registry import Kind

PREFILL_CHECKS = [
    "the prompt-length slope (ms per prompt token): shorter prompts, prefix caching of shared prefixes",
    "more tensor-core compute helps prefill: a faster GPU, FP8/INT8 matmuls where accuracy allows "
    "(quantization does not lower TTFT by itself)",
    "chunked prefill / max_num_batched_tokens to bound how long one long prompt holds the device",
    "compute utilisation (SM / tensor activity), not GPU utilisation alone",
]


def _share_label(ctx: RuleContext, stage: str) -> tuple[str, str]:
    """(evidence row key, how it was measured) of a stage's TTFT share: spans (slowest 5%) or engine metrics."""
    if ctx.features.get(f"{stage}_share_tail").source == "prometheus":
        return (evidence.stage_share_metrics(stage),
                f"mean {stage} time / mean TTFT from the engine's histograms, request-weighted over scrape windows")
    return evidence.stage_share_tail(stage), ""


def _prefill_metric_rows(t: Triage) -> None:
    """What the engine's own counters say about prompt processing (no thresholds: context)."""
    ctx = t.ctx
    busy = ctx.v("prefill_busy_ratio")
    spt = ctx.v("prefill_s_per_token")
    rate = ctx.v("prompt_tokens_per_s")
    if spt:
        t.context(evidence.PROMPT_TOKENS_PER_BUSY_S, 1.0 / spt, "tokens/s",
                  f"{spt * 1e3:.3g} ms per prompt token (Δ prompt seconds / Δ prompt tokens; per slot when "
                  "the engine sums its slots' times)")
    if rate is not None and busy is not None:
        t.context(evidence.PROMPT_TOKENS_PER_S, rate, "tokens/s",
                  "the prompt load; x seconds per prompt token = the prefill busy time")


def _fit_rows(t: Triage, weigh: bool) -> None:
    """TTFT vs prompt tokens: R² and the prompt-proportional part, judged against their minimums."""
    ctx = t.ctx
    r2 = ctx.v("ttft_prompt_r2")
    if r2 is None:
        return
    fit = (f"slope {ctx.v('ttft_prompt_slope_ms_per_token'):.3g} ms/token, intercept "
           f"{ctx.v('ttft_prompt_intercept_ms', 0):.3g} ms")
    if r2 < ctx.th["r2_min"] and _slope_resolved(ctx):
        t.context(evidence.PROMPT_FIT_R2, r2, "", f"requests that did not queue; {fit}: low over a narrow prompt range")
        t.judged(evidence.PROMPT_SLOPE_T, ctx.v("ttft_prompt_slope_t"), "slope_t_min", "",
                 "TTFT rises with the prompt within the range the prompts span", weigh=weigh)
    else:
        t.judged(evidence.PROMPT_FIT_R2, r2, "r2_min", "", f"requests that did not queue; {fit}", weigh=weigh,
                 bound=1.0)
    t.judged(evidence.PROMPT_PART_P50, ctx.v("ttft_prompt_explained_frac"), "explained_frac_min",
             "share", "slope x mean prompt / mean TTFT: how much of the TTFT time is prompt processing", weigh=weigh)


def _slope_resolved(ctx: RuleContext) -> bool:
    """Whether the prompt fit's slope stands ``slope_t_min`` standard errors above zero."""
    t = ctx.v("ttft_prompt_slope_t")
    return t is not None and t >= ctx.th["slope_t_min"]


def _steps_row(t: Triage, weigh: bool = False) -> None:
    """The median request's prompt work in decode steps (a gate: the rule passes under it): how far
    prompt work holds the first token back, against what a short prompt costs. ``weigh``: also one of
    the checks whose strength makes the confidence (the black-box fit, where it is part of the case)."""
    steps = t.ctx.v("prompt_work_steps_p50")
    if steps is not None:
        t.judged(evidence.PROMPT_WORK_P50, steps, "prompt_steps_min", "steps",
                 f"its first token held back this many decode steps ({t.ctx.features.get('prompt_work_steps_p50').source})",
                 weigh=weigh)


def _busy_row(t: Triage) -> None:
    """The device busy fraction against the level that supports "compute load high" (when measured)."""
    busy = t.ctx.v("device_busy_frac")
    if busy is not None:
        t.judged(evidence.DEVICE_BUSY, busy, "device_busy_min", "share",
                 f"from {t.ctx.features.get('device_busy_frac').source}: compute load")


def _had_batch_mates(ctx: RuleContext) -> bool:
    """Whether other requests were in flight when requests arrived (so could share their prefill
    steps). Alone (at most one in flight, itself), a prefill that prompt length explains poorly
    is still the request's own forward pass, slowed by something else on the device. Unknown
    counts as yes."""
    most = ctx.v("inflight_at_arrival_max")
    return most is None or most > 1


checked_rule("prefill_compute", "prefill_compute",
             "TTFT rises with prompt length and the forward pass dominates it (or, from engine metrics alone, the "
             "engine is busy processing prompts most of the time)", kind=Kind.TTFT)

#: the thresholds every path reads before its own evidence (:func:`_not_prompt_work`)
GATE_READS = ("prefix_cache.saving_max", "prompt_steps_min")
#: the thresholds the prompt fit's verdict reads (:func:`_fit_ok`, :func:`_fit_rows`)
FIT_READS = ("explained_frac_min", "r2_min", "slope_t_min")


def _not_prompt_work(ctx: RuleContext) -> str | None:
    """Why TTFT is not prompt work holding the first token back, whichever path judges it: the
    probe's shared-prefix test without a prompt sweep, or the median request's prompt work under
    ``prompt_steps_min`` decode steps. None when neither holds."""
    th = ctx.th
    saving, works = ctx.v("prefix_repeat_saving_frac"), float(ctx.th_of("prefix_cache")["saving_max"])
    if saving is not None and saving > works and (ctx.v("prompt_sweep_points_n") or 0) < 3:
        # the probe's shared-prefix design, and no prompt sweep: its long prompts are its own first
        # uses, and the cache spares the repeats; what a first use pays is what no cache can avoid,
        # not a bottleneck (a sweep of prompt lengths beside it still shows prompt work)
        return reason("the long prompts are the shared-prefix test's own first uses, and the server's prefix cache "
                      "spares its repeats {saving:.0%} of the prefix's cost: a first use's prefill is what no cache "
                      "avoids", saving=saving)
    steps = ctx.v("prompt_work_steps_p50")
    if steps is not None and steps < th["prompt_steps_min"]:
        return reason("the median request's prompt work holds its first token back {steps:.1f} decode steps (< "
                      "{min:g}): TTFT is what a short prompt costs, not prefill holding it back",
                      steps=steps, min=th["prompt_steps_min"])
    return None


def _fit_ok(ctx: RuleContext) -> bool:
    """Whether the prompt fit names prompt work: its prompt-proportional part reaches
    ``explained_frac_min`` and TTFT follows the prompt (R² at ``r2_min``, or a resolved slope)."""
    th = ctx.th
    r2, expl = ctx.v("ttft_prompt_r2"), ctx.v("ttft_prompt_explained_frac")
    return (r2 is not None and expl is not None and expl >= th["explained_frac_min"]
            and (r2 >= th["r2_min"] or _slope_resolved(ctx)))


@check("prefill_compute.spans", needs=("prefill_share_tail",), before=("prefill_compute.fit",),
       reads=GATE_READS + FIT_READS + ("share_min", "share_only_min", "r2_contradicts_max", "device_busy_min"))
def _prefill_spans(ctx: RuleContext) -> Outcome:
    """The engine's prefill share of TTFT (its spans over the slowest 5%, or its prefill-time
    histogram), with the prompt fit when there is one: with a fit that names prompt work from
    ``share_min``, without one from ``share_only_min``; a fit that says the request's own prompt
    does not cost the time hands it to interference."""
    not_prompt = _not_prompt_work(ctx)
    if not_prompt is not None:
        return not_prompt
    th = ctx.th
    r2 = ctx.v("ttft_prompt_r2")
    expl = ctx.v("ttft_prompt_explained_frac")
    fit_ok = _fit_ok(ctx)
    busy = ctx.v("device_busy_frac")
    ps = ctx.v("prefill_share_tail")
    if fit_ok and ps >= th["share_min"]:
        directness, by_fit = 0.9, True
    elif ps >= th["share_only_min"] and r2 is not None and _had_batch_mates(ctx) and (
            r2 < th["r2_contradicts_max"] or (expl is not None and expl < th["explained_frac_min"])):
        # a prompt-length fit exists and says the request's own prompt is not what costs the time
        return reason("prefill is {ps:.0%} of the slowest TTFTs but each request's own prompt length explains "
                      "little of it (R² {r2:.2f}, prompt-proportional part {expl:.0%}): other requests' prefills "
                      "share its steps (see interference)", ps=ps, r2=r2, expl=expl or 0)
    elif ps >= th["share_only_min"]:
        # no prompt fit: the prefill span is a request's own forward pass when it ran alone, and
        # may hold batch-mates' prompts when others were in flight
        directness, by_fit = (0.7 if _had_batch_mates(ctx) else 0.9), False
    else:
        over = "TTFT in the engine's metrics" if _share_label(ctx, "prefill")[1] else "the slowest 5%"
        if r2 is None:
            return reason("prefill share of {over} is {ps:.0%} (< {min:.0%} without a prompt-length sweep: "
                          "{why})", over=over, ps=ps, min=th["share_only_min"],
                          why=ctx.features.get("ttft_prompt_r2").reason)
        return reason("prefill share of {over} is {ps:.0%}; TTFT vs prompt length R² {r2:.2f}, "
                      "prompt-proportional part {expl:.0%}", over=over, ps=ps, r2=r2, expl=expl)
    label, how = _share_label(ctx, "prefill")
    t = Triage(ctx)
    t.judged(label, ps, "share_min" if fit_ok else "share_only_min", "share",
             "forward passes over the prompt tokens" + (f" ({how})" if how else ""), weigh=by_fit)
    if not by_fit:
        t.add_strength(strength(ps, th["share_only_min"], bound=1.0))
    _fit_rows(t, weigh=by_fit)
    _steps_row(t)
    pb = ctx.v("prefill_busy_ratio")
    if pb is not None:
        t.context(evidence.PREFILL_BUSY_RATIO, pb, "s/s",
                  "from the engine's counters: how much of the time the engine spends on prompts")
    _prefill_metric_rows(t)
    note = None
    if busy is not None:
        _busy_row(t)
        if busy < th["device_busy_min"]:
            directness *= 0.7
            note = f"the device is busy only {busy:.0%} of the time: prefill is long but the device is not saturated"
    s, pct = ctx.explained(ps)
    title = ("Prefill compute: TTFT grows with prompt length and the forward pass dominates it" if fit_ok
             else "Prefill compute: the forward pass dominates TTFT" + (" (engine metrics)" if how else ""))
    conf = t.confidence(directness)
    if by_fit and ps >= th["share_only_min"] and not _had_batch_mates(ctx):
        # the share alone names a lone request's own forward pass (the share-only branch above): a fit that
        # agrees only loosely supports it, and never makes it less sure than the share alone
        conf = max(conf, ctx.confidence(directness, [strength(ps, th["share_only_min"], bound=1.0)]))
    return finding(title, conf, s, pct, t.evidence, PREFILL_CHECKS, note=note,
                   population_share=ctx.stage_population(("prefill", "comm")))


@check("prefill_compute.fit", needs=("ttft_prompt_r2", "ttft_prompt_explained_frac"), before=("prefill_compute.busy",),
       reads=GATE_READS + FIT_READS + ("bb_slope_per_itl_max", "share_min", "bb_alone_frac_min"))
def _prefill_fit(ctx: RuleContext) -> Outcome:
    """No prefill share: the client's prompt fit, TTFT linear in prompt length at a per-token cost a
    parallel prefill can have (under ``bb_slope_per_itl_max`` of a decode step); the engine's
    prefill-time histogram, when scraped beside it, measures what the fit infers."""
    not_prompt = _not_prompt_work(ctx)
    if not_prompt is not None:
        return not_prompt
    th = ctx.th
    r2 = ctx.v("ttft_prompt_r2")
    expl = ctx.v("ttft_prompt_explained_frac")
    fit_ok = _fit_ok(ctx)
    # black box: TTFT linear in prompt length at concurrency 1, at a per-token cost a parallel prefill can have
    if not fit_ok:
        return reason("TTFT vs prompt length: R² {r2:.2f}, prompt-proportional part {expl:.0%}", r2=r2, expl=expl)
    per_itl = ctx.v("prompt_slope_per_itl")
    if per_itl is not None and per_itl >= th["bb_slope_per_itl_max"]:
        return reason("a prompt token costs {per_itl:.2f} of a decode step (>= {max:g}): too slow for a parallel "
                      "prefill (see tokenize)", per_itl=per_itl, max=th["bb_slope_per_itl_max"])
    # from the client the case is four checks, each weighed: TTFT follows the prompt (R²), the prompt
    # part is most of it, it holds the first token back many steps, at a parallel prefill's per-token
    # cost (not a tokenizer's)
    t = Triage(ctx)
    _fit_rows(t, weigh=True)
    _steps_row(t, weigh=True)
    if per_itl is not None:
        t.judged(evidence.SLOPE_PER_ITL, per_itl, "bb_slope_per_itl_max", "x",
                 "a prompt token costs a small part of a decode step, as a parallel prefill does", op="<", weigh=True)
    s, pct = ctx.explained(min(expl, 1.0))
    # vLLM and SGLang also measure it: their prefill-time histogram's share of TTFT, judged like a span's
    mp = ctx.v("metrics_prefill_share")
    if mp is not None and t.judged(evidence.PREFILL_SHARE_METRICS, mp, "share_min", "share",
                                   "mean prefill time / mean TTFT from the engine's own histograms, request-weighted "
                                   "over scrape windows: the prompt cost the fit infers, measured by the engine",
                                   weigh=True):
        _prefill_metric_rows(t)
        return finding("Prefill compute: TTFT grows with prompt length and the engine's prefill time holds most of it "
                       "(engine metrics)", t.confidence(0.85), s, pct, t.evidence, PREFILL_CHECKS,
                       population_share=min(expl, 1.0),
                       note="the prompt fit from the client, and the prefill time from the engine's /metrics")
    # every fitted request alone in flight: no batch-mate to share a step with, as designed as a sweep
    lone = lone_sweep(t, th["bb_alone_frac_min"])
    return finding("TTFT grows linearly with prompt length at low concurrency: prefill compute (black box)",
                   t.confidence(0.85, black_box=True, designed=lone), s, pct, t.evidence, PREFILL_CHECKS,
                   black_box=True, population_share=min(expl, 1.0),
                   note="client-only evidence: TTFT against prompt length (a sweep, or the spread of one workload) "
                   "shows the cost; the device load is not observed"
                   + (LONE_SWEEP_NOTE if lone else ""))


@check("prefill_compute.busy", needs=("prefill_busy_ratio",),
       reads=GATE_READS + FIT_READS + ("busy_ratio_min", "device_busy_min", "bb_slope_per_itl_max", "share_min",
                                       "bb_alone_frac_min"))
def _prefill_busy(ctx: RuleContext) -> Outcome:
    """Engine metrics only (llama.cpp): no TTFT split, but the engine's prompt-seconds counter says
    the device is busy with prefill most of the time, so new requests' TTFT is prompt processing
    (their own and the prompts ahead of them). A prompt fit without its prompt-proportional part
    is judged by :func:`_prefill_fit` instead."""
    if ctx.has("ttft_prompt_r2"):
        return _prefill_fit(ctx)
    not_prompt = _not_prompt_work(ctx)
    if not_prompt is not None:
        return not_prompt
    t = Triage(ctx)
    th = ctx.th
    pb = ctx.v("prefill_busy_ratio")
    if not t.crossed(evidence.PREFILL_BUSY_RATIO, pb, "busy_ratio_min", "s/s",
                     "from the engine's prompt-seconds counter: the engine is processing prompts most of the time, so "
                     "new requests wait behind prompt processing (summed over slots: above 1 means several slots' "
                     "prompts at once)"):
        return reason("the engine spends {pb:.2f} s per s processing prompts (< {min:g}); no prefill share or "
                      "prompt-length sweep to say more", pb=pb, min=th["busy_ratio_min"])
    _prefill_metric_rows(t)
    waiting = ctx.v("waiting_seqs_max")
    if waiting:
        t.context(evidence.WAITING_MAX, waiting, "requests",
                  f"requests deferred while the slots process prompts ({ctx.features.get('waiting_seqs_max').source})")
    directness = 0.6
    note = "TTFT is not split into stages here, so the share of TTFT it explains is unknown"
    busy = ctx.v("device_busy_frac")
    if busy is not None:
        _busy_row(t)
        if busy < th["device_busy_min"]:
            directness *= 0.7
            note += f"; the device is busy only {busy:.0%} of the time"
    return finding("Prefill compute: the engine spends most of its time processing prompts (engine metrics)",
                   t.confidence(directness), None, None, t.evidence, PREFILL_CHECKS, note=note)


COMM_CHECKS = [
    "comm share of prefill and link counters (NVLink / PCIe throughput in the NVML series)",
    "GPU topology (nvidia-smi topo -m): NVLink / NVSwitch against PCIe, cross-node links",
    "a faster interconnect and a better parallel strategy (smaller TP, pipeline stages, data-parallel "
    "replicas) rather than more GPUs",
]


checked_rule("comm", "comm", "Tensor-parallel communication takes a large part of prefill, or TP>1 is slower than TP=1.",
             kind=Kind.TTFT)


def _tp_row(ctx: RuleContext, t: Triage) -> bool:
    """TTFT per prompt token at the highest TP degree over the lowest (feature ``tp_ttft_ratio``):
    a crossed row when at least ``tp_ratio_min``; whether it crossed."""
    by = ctx.v("ttft_by_tp") or {}
    return t.crossed(evidence.TP_SLOPE_X, ctx.v("tp_ttft_ratio"), "tp_ratio_min", "x",
                     "more GPUs made TTFT worse: " + ", ".join(f"TP={k}: {v * 1e3:.0f} ms" for k, v in by.items()),
                     miss="TP ratio {value:.2f} (< {threshold:g})")


@check("comm.spans", needs=("comm_share_of_prefill",), before=("comm.tp",), final=False,
       reads=("share_of_prefill_min", "tp_ratio_min"))
def _comm_spans(ctx: RuleContext) -> Outcome:
    """The engine's collective time inside the prefill passes, over prefill + collective time; with
    the capture's TP degrees compared beside it when it has them. A pass lets ``comm.tp`` try."""
    t = Triage(ctx)
    if not t.crossed(evidence.COMM_SHARE_PREFILL, ctx.v("comm_share_of_prefill"), "share_of_prefill_min", "share",
                     f"all-reduces inside the prefill passes (TP={ctx.v('tp_size', 0):g})",
                     miss="comm share of prefill {value:.0%} (< {threshold:.0%})"):
        return t.pass_reason()
    _tp_row(ctx, t)
    return _comm_finding(ctx, t)


@check("comm.tp", needs=("tp_ttft_ratio",), reads=("tp_ratio_min",))
def _comm_tp(ctx: RuleContext) -> Outcome:
    """TP degrees compared in one capture: TTFT per prompt token at the highest degree over the lowest."""
    t = Triage(ctx)
    if not _tp_row(ctx, t):
        return t.pass_reason()
    return _comm_finding(ctx, t)


def _comm_finding(ctx: RuleContext, t: Triage) -> Outcome:
    """The finding from the rows so far: the collectives' share of TTFT (of the requests that ran
    the TP degrees compared, of the slowest 5%, or derived from the share of prefill or the TP
    ratio). Client evidence (designed: one thing varied) when the engine's collective time is unknown."""
    share = ctx.v("comm_share_of_prefill")
    ratio = ctx.v("tp_ttft_ratio")
    cs = ctx.v("comm_share_tail")
    if len(ctx.v("ttft_by_tp") or {}) >= 2 and ctx.v("comm_share_tp_ttft") is not None:
        # TP degrees compared in one capture: what TP costs is measured on the requests that ran it
        cs = ctx.v("comm_share_tp_ttft")
    if cs is None and share is not None:
        cs = share * (ctx.v("prefill_share_tail") or 0.0) / max(1e-9, 1.0 - share)
    if cs is None and ratio is not None:
        cs = 1.0 - 1.0 / ratio
    s, pct = ctx.explained(cs)
    bb = share is None
    # TP degrees compared at the same load are a designed comparison (one thing varied): the article's
    # "single GPU fine, multi-GPU TTFT clearly higher" row, which a client sees as directly as the
    # engine's own ITL comparisons (0.85); the collective time itself only the engine's spans show (0.9)
    return finding("Multi-GPU communication: tensor-parallel collectives stretch prefill",
                   t.confidence(0.9 if not bb else 0.85, black_box=bb and ctx.black_box, designed=bb), s, pct,
                   t.evidence,
                   COMM_CHECKS, black_box=bb and ctx.black_box,
                   note=(("client-only evidence: " if ctx.black_box else "")
                         + "TP degrees compared across runs in this capture; collective time itself not observed")
                   if bb else None)
