"""Rules about tokens after the first: decode speed and prefill-decode interference.

Their findings explain ITL, not TTFT (``explained_s`` is None); the engine ranks them with
``general.itl_weight`` and demotes ``decode`` when TTFT itself is not fine.
"""

from __future__ import annotations

from rules import evidence
from rules.base import Outcome, RuleContext, Triage, finding, reason, rule, strength
from rules.features.itl import MIXED_SOURCE
from rules.registry import Kind

DECODE_CHECKS = [
    "ITL percentiles against running sequences and the decode step time",
    "the number of concurrent requests (max_num_seqs): fewer sequences per step, faster tokens per stream",
    "KV-cache access efficiency: decode reads every active request's KV cache each step (memory "
    "bandwidth, FP8 KV cache, GQA/MQA)",
    "the scheduling policy: prefill-first protects TTFT at the cost of running requests' ITL",
]
INTERFERENCE_CHECKS = [
    "chunked prefill (a bounded number of prefill tokens per step) so running decodes keep stepping",
    "the scheduling policy: prefill-first lowers new requests' TTFT but stalls running requests' "
    "tokens; protecting decode makes new requests queue longer",
    "prefill-decode disaggregation when long prompts and long generations share the replicas",
]


@rule("decode", "decode", needs=(("itl_p50_s", "ttft_p50_s"),), kind=Kind.ITL)
def decode(ctx: RuleContext) -> Outcome:
    """TTFT fine, ITL bad: the tokens after the first come slowly."""
    itl = ctx.v("itl_p50_s")
    ttft = ctx.v("ttft_p50_s")
    t = Triage(ctx)
    ratio = itl / ttft if ttft else None
    t.crossed(evidence.ITL_OVER_TTFT, ratio, "itl_ttft_ratio_min", "x",
              f"each later token ({itl * 1e3:.1f} ms) takes as long as the first")
    hold = ctx.v("decode_speed_hold_ratio")
    t.below(evidence.DECODE_HOLD, hold, "decode_hold_max", "x",
            "streams slow down as concurrency grows")
    for key, target in (ctx.slo or {}).items():
        metric = key.split("_")[0]
        if metric in ("itl", "tpot"):
            check = (ctx.v("slo_checks") or {}).get(key) or {}
            if check.get("met") is False:
                # the SLO's target as the user gave it; the row fires when the value is over it
                t.judged(evidence.slo(key), check.get("value_s"), None, "s", "ITL SLO broken", op=">", threshold=target,
                         weigh=True)
    if not t.evidence:
        head = (reason("ITL p50 {itl_ms:.1f} ms is {ratio:.2f}x TTFT p50", itl_ms=itl * 1e3, ratio=ratio)
                if ratio is not None else "ITL within bounds")
        return head if hold is None else reason("{head}; decode speed holds x{hold:.2f} across concurrency",
                                                head=head, hold=hold)
    if all(e.key == evidence.DECODE_HOLD for e in t.evidence):
        # streams slowing as the batch grows is what batching costs on any engine: slow tokens are
        # a problem against the users' ITL/TPOT target or against TTFT, not against a lone stream
        return reason("per-stream decode speed falls to x{hold:.2f} under load (what a growing batch costs), but ITL "
                      "p50 {itl_ms:.1f} ms is {ratio:.2f}x TTFT p50 and no ITL/TPOT target is broken: give --slo "
                      "tpot_p99=... (or itl_p99) to judge the tokens", hold=hold, itl_ms=itl * 1e3, ratio=ratio or 0)
    for name, row, unit, meaning in (
            ("running_seqs_p95", evidence.RUNNING_P95, "requests", "running sequences per step (p95)"),
            ("decode_step_p50_s", evidence.DECODE_STEP_P50, "s", "decode-only engine step time"),
            ("itl_p99_s", evidence.ITL_P99, "s", "ITL p99 over all token gaps")):
        val = ctx.v(name)
        if val is not None:
            t.context(row, val, unit, meaning)
    return finding("Decode: TTFT is fine but the tokens after the first come slowly (ITL)",
                   # the client measures token gaps as directly as the engine does: no black-box scale
                   t.confidence(0.85), None, None, t.evidence, DECODE_CHECKS,
                   note="explains ITL, not TTFT" + ("; client-only evidence" if ctx.black_box else ""),
                   black_box=ctx.black_box)


@rule("interference", "interference", needs=(("itl_interference_ratio", "itl_prefill_stall_share"),), kind=Kind.ITL)
def interference(ctx: RuleContext) -> Outcome:
    """ITL spikes while other requests prefill (prefill-decode interference)."""
    th = ctx.th
    ratio = ctx.v("itl_interference_ratio")
    stall = ctx.v("itl_prefill_stall_share")
    tail = ctx.v("itl_tail_during_prefill_frac")
    bb = "black box" in (ctx.features.get("itl_interference_ratio").source or "")
    # with the client's stand-ins for prefill windows (other requests' TTFT windows, which also
    # hold their queueing) the tail must be made of enough gaps to mean something
    tail_n = ctx.v("itl_tail_gaps_n", 0) or 0
    # The tail criterion explains a broken ITL/TPOT SLO (the tail users were promised); without
    # one, only the share of decode time lost counts.
    checks = ctx.v("slo_checks") or {}
    # ttft diagnose's mixed follow-up: the windows are the long prompts' own, not every request's
    # TTFT standing in for its prefill; its gaps meet the users' ITL target or not
    designed = MIXED_SOURCE in (ctx.features.get("itl_interference_ratio").source or "")
    mixed = ctx.v("itl_mixed_slo") or {}
    itl_slo_broken = any(k.startswith(("itl", "tpot")) and c.get("met") is False for k, c in checks.items()) or any(
        c.get("met") is False for c in mixed.values())
    tail_caused = (itl_slo_broken and tail is not None and tail >= th["tail_during_prefill_min"]
                   and (not bb or designed or tail_n >= th["bb_tail_gaps_min"]))
    if ratio < th["itl_ratio_min"] or (stall < th["stall_share_min"] and not tail_caused):
        return reason("token gaps during other requests' prefills are {ratio:.1f}x the others (threshold "
                      "{ratio_min:g}x) and cost {stall:.0%} of decode time (threshold {stall_min:.0%}); {tail:.0%} of "
                      "the slowest 1% of gaps overlap a prefill (threshold {tail_min:.0%})", ratio=ratio,
                      ratio_min=th["itl_ratio_min"], stall=stall, stall_min=th["stall_share_min"], tail=tail or 0,
                      tail_min=th["tail_during_prefill_min"])
    src = ctx.features.get("itl_interference_ratio").source or ""
    t = Triage(ctx)
    t.judged(evidence.ITL_DURING_PREFILL_X, ratio, "itl_ratio_min", "x",
             f"mean gap {ctx.v('itl_during_prefill_mean_s', 0) * 1e3:.1f} ms against a median "
             f"{ctx.v('itl_without_prefill_p50_s', 0) * 1e3:.1f} ms ({src})", weigh=True)
    t.judged(evidence.PREFILL_STALL_SHARE, stall, "stall_share_min", "share",
             "running requests wait while new prompts are prefilled")
    if tail_caused:
        t.judged(evidence.ITL_TAIL_DURING_PREFILL, tail, "tail_during_prefill_min", "share",
                 "the ITL tail that breaks its SLO is made of stalls behind other requests' prefills")
    for key, c in mixed.items():
        if c.get("met") is False:
            t.judged(evidence.slo_mixed(key), c.get("value_s"), None, "s",
                     "the users' ITL target, over the token gaps of ttft diagnose's mixed follow-up", op=">",
                     threshold=c.get("target_s"))
    # client only: stalls that end as another request's first token arrives were that request's prefill,
    # seen as directly as a designed experiment shows it (the TTFT windows alone also hold queueing)
    aligned = False
    if bb and not designed:
        frac, chance = ctx.v("itl_stall_end_first_token_frac"), ctx.v("itl_stall_end_first_token_chance")
        n_st = ctx.v("itl_stall_gaps_n", 0) or 0
        if frac is not None and chance is not None and n_st >= th["bb_aligned_gaps_min"]:
            aligned = t.judged(evidence.STALLS_ALIGNED_EXCESS, frac - chance,
                               "bb_aligned_excess_min", "share",
                               f"{frac:.0%} of {n_st:g} stalls end within a few steps of a first token, against "
                               f"{chance:.0%} by chance: the stall was that request's prefill")
    t.context(evidence.GAPS_DURING_PREFILL, ctx.v("itl_during_prefill_frac"), "share", "how often it happens")
    # the time lost, or (an ITL SLO broken) the tail made of stalls: whichever says it louder
    t.add_strength(max(strength(stall, th["stall_share_min"], bound=1.0),
                       strength(tail, th["tail_during_prefill_min"], bound=1.0) if tail_caused else 0.0))
    # the long prompts were diagnose's own and the users gave no ITL target: what a long prompt would do
    own = designed and not mixed
    if designed:
        how = "; client-only evidence (ttft diagnose's mixed follow-up: long prompts among short streams)"
    elif aligned:
        how = "; client-only evidence (stalls end as other requests' first tokens arrive)"
    else:
        how = "; client-only evidence (other requests' TTFT windows stand in for their prefills)" if bb else ""
    # ttft diagnose's mixed follow-up is a designed experiment: the long prompts' own TTFT windows
    # are their prefills, so the client's reading is nearly as direct as the engine's; so are stalls
    # that end at other requests' first tokens
    directness = 0.85 if not bb else (0.8 if designed or aligned else 0.7)
    conf = t.confidence(directness, black_box=bb and not (designed or aligned)) * (
        float(th["own_test_scale"]) if own else 1.0)
    return finding(OWN_TITLE if own else "Prefill-decode interference: running requests' tokens stall while new prompts "
                   "prefill", conf, None, None, t.evidence, INTERFERENCE_CHECKS,
                   note=(OWN_NOTE + "; " if own else "") + "explains ITL spikes, not TTFT" + how,
                   black_box=bb, conditional=own)


#: the titles and note when the long prompts were ttft diagnose's own test and no ITL target was given
OWN_TITLE = ("A long prompt stalls the running streams for its whole prefill: if your prompts mix lengths, "
             "streaming users see those stalls")
OWN_NOTE = ("the long prompts were ttft diagnose's own test and no ITL target was given: a conditional finding, "
            "ranked after what was measured (confidence x [interference] own_test_scale; give --slo itl_p99=... "
            "to judge the stalls)")
