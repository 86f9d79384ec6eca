"""The queue rule: TTFT spent waiting for the scheduler. Its paths, tried in order: the engine's
queue time (spans or queue-time histogram), the client's concurrency sweep, one load level (in line
by the order of first tokens and stream ends; at the running cap by the engine's gauges), and ttft
diagnose's long ramp when it shows a limit in requests. Also the in-line readings the network rule
shares (:func:`served_in_line`) and the closed-loop test kv_cache reads (:func:`closed_loop`).
Shares are fractions of TTFT (0..1), waits in seconds or decode steps."""

from __future__ import annotations

from rules import evidence
from rules.base import Outcome, RuleContext, Triage, beyond_chance, check, checked_rule, finding, reason, strength
from rules.long_ramp import LONG_RAMP, long_out_refutes, long_ramp_limit, long_ramp_rows, long_ramp_uncapped
from rules.registry import Kind

QUEUE_IDLE_CHECKS = [
    "queue wait share and the scheduler thread: take a CPU profile of the serving process (py-spy) "
    "around the step loop, the request parser and the tokenizer",
    "request parsing, JSON serialization, networking and scheduler threads under concurrency "
    "(the article's CPU-side causes); resource allocation per request",
    "GPU utilisation alone says little: here the device sits idle while requests wait",
]
QUEUE_BUSY_CHECKS = [
    "arrival rate against capacity: add replicas or rate-limit admission; P95/P99 under random "
    "arrivals differ from offline throughput",
    "batch limits (max_num_seqs, max_num_batched_tokens) and the scheduling policy: prefill-first "
    "lowers new requests' TTFT, decode-first makes them queue longer",
    "GPU utilisation alone says little: 90% utilisation can coexist with long queue waits and bad P99 TTFT",
    "KV usage and preemptions (see kv_cache) before adding GPUs",
]


def _queue_metric_rows(t: Triage, share_from_metrics: bool) -> None:
    """Queue depth and the engine's own queue-time histogram, as context (no thresholds)."""
    ctx = t.ctx
    for name, label in (("waiting_seqs_p95", evidence.WAITING_P95), ("waiting_seqs_max", evidence.WAITING_MAX)):
        val = ctx.v(name)
        if val is not None:
            src = ctx.features.get(name).source
            t.context(label, val, "requests", "the engine's waiting-requests gauge (num_waiting)" if src == "prometheus"
                      else f"waiting sequences per engine step ({src})")
    q_mean = ctx.v("metrics_queue_time_mean_s")
    if q_mean is not None:
        q95 = ctx.v("metrics_queue_time_p95_s")
        t.context(evidence.QUEUE_TIME_METRICS_MEAN, q_mean, "s",
                  "the engine's queue-time histogram (queue_time_s), request-weighted over scrape windows"
                  + (f"; windowed p95 {q95 * 1e3:.0f} ms" if q95 is not None else ""))
    waiting_for_capacity_row(t)
    share = ctx.v("metrics_queue_share")
    if share is not None and not share_from_metrics:
        t.context(evidence.QUEUE_SHARE_METRICS, share, "share",
                  "mean queue time / mean TTFT from the engine's own histograms: the same story from /metrics")


def waiting_for_capacity_row(t: Triage) -> None:
    """The engine's reason for its waiting requests, as context (no threshold): held for capacity
    (a batch cap, the step's token budget or KV blocks: the gauge does not say which) or deferred."""
    share = t.ctx.v("waiting_for_capacity_share")
    if share is not None:
        t.context(evidence.WAITING_FOR_CAPACITY, share, "share",
                  "vLLM num_requests_waiting_by_reason{reason=capacity} / num_requests_waiting: every waiting "
                  "request not deferred (LoRA, KV transfer), whichever limit holds it: max_num_seqs, the token "
                  "budget or KV blocks")


def _judged_metrics_queue_share(t: Triage, mq: float, what: str) -> bool:
    """The engine's queue-time share of TTFT judged against ``share_min`` (weighed): whether it
    measures the wait ``what`` (the sweep, the long ramp) infers."""
    return t.judged(evidence.QUEUE_SHARE_METRICS, mq, "share_min", "share",
                    "mean queue time / mean TTFT from the engine's own histograms, request-weighted over scrape "
                    f"windows: the wait {what} infers, measured by the engine", weigh=True)


#: what a client cannot see: the same curve (and the same line at one level) comes from KV space
BB_KV_CHECK = ("scrape the server's /metrics for KV usage and preemptions: from the client a KV-capacity limit "
               "looks the same as a batch cap or a saturated device (see kv_cache)")

SINGLE_LEVEL = ("ttft_in_itl_steps_p50", "ttft_inline_ratio", "first_token_after_end_frac")
AT_CAP = ("waiting_at_cap_frac", "ttft_vs_engine_prefill_ratio")
SWEEP = ("ttft_concurrency_ratio", "decode_speed_hold_ratio", "concurrency_flat_levels", "ttft_rise_per_itl")


checked_rule("queue", "queue", "TTFT spent waiting for the scheduler: high queue share, or TTFT rising with "
             "concurrency", kind=Kind.TTFT)


def _not_a_request_limit(ctx: RuleContext) -> bool:
    """Whether ttft diagnose's long ramp, when it ran, did not show a limit in requests."""
    return long_ramp_limit(ctx)[0] != "requests"


@check("queue.spans", needs=("queue_share_tail",), before=("queue.sweep",),
       reads=("share_min", "wait_steps_min", "device_idle_max"))
def _queue_spans(ctx: RuleContext) -> Outcome:
    """The engine's own queue time (its spans, or its queue-time histogram): a high share of the
    slowest TTFTs, queued for several engine steps."""
    th = ctx.th
    qs = ctx.v("queue_share_tail")
    step = ctx.v("engine_step_in_flight_s")
    q_mean = (ctx.v("stage_tail_mean_s") or {}).get("queue")
    wait_steps = q_mean / step if (q_mean is not None and step) else None
    busy = ctx.v("device_busy_frac")
    busy_q = ctx.v("device_busy_frac_while_queued")
    if qs < th["share_min"]:
        return reason("queue share of the slowest 5% is {qs:.0%} (< {min:.0%})", qs=qs, min=th["share_min"])
    if wait_steps is not None and wait_steps < th["wait_steps_min"]:
        return reason("queue share {qs:.0%} but requests wait only {steps:.1f}x the step in flight: they join at "
                      "the next step boundary, admission is prompt", qs=qs, steps=wait_steps)
    idle_measure = busy_q if busy_q is not None else busy
    idle = idle_measure is not None and idle_measure < th["device_idle_max"]
    from_metrics = ctx.features.get("queue_share_tail").source == "prometheus"
    t = Triage(ctx)
    t.crossed(evidence.QUEUE_SHARE_METRICS if from_metrics else evidence.QUEUE_SHARE_TAIL, qs,
              "share_min", "share", "time requests wait for the scheduler before their prefill"
              + (" (mean queue time / mean TTFT from the engine's histograms, request-weighted over scrape windows)"
                 if from_metrics else ""))
    t.crossed(evidence.QUEUE_WAIT_STEPS, wait_steps, "wait_steps_min", "x",
              "queued for several engine steps, not just the one in flight when it arrived")
    if busy_q is not None:
        t.judged(evidence.DEVICE_BUSY_QUEUED, busy_q, "device_idle_max", "share",
                 "idle device while requests wait: the hold-up is not the GPU" if idle else
                 "the device was working while requests waited: capacity", op="<")
    if busy is not None:
        t.context(evidence.DEVICE_BUSY, busy, "share",
                  f"from {ctx.features.get('device_busy_frac').source}; utilisation alone says little")
    _queue_metric_rows(t, from_metrics)
    if idle:  # how idle: the further below the idle line, the stronger
        t.add_strength(strength(th["device_idle_max"], max(idle_measure, 1e-3)))
        title = "Requests wait in the queue while the device is mostly idle: the scheduler / CPU side holds them"
        checks = QUEUE_IDLE_CHECKS
    else:
        title = "Requests queue behind a busy device: arrivals exceed what the engine admits per step"
        checks = QUEUE_BUSY_CHECKS
    s, pct = ctx.explained(ctx.v("queue_share_tail"))
    shares = ctx.v("stage_shares_all") or {}
    return finding(title, t.confidence(0.95), s, pct, t.evidence, checks,
                   population_share=shares.get("queue"))


@check("queue.request_limit", needs=LONG_RAMP, when=lambda ctx: not _not_a_request_limit(ctx),
       reads=("share_min", "kv_cache.long_knee_shift_min", "kv_cache.long_out_output_x_min",
              "kv_cache.long_out_rise_min"))
def _queue_request_limit(ctx: RuleContext) -> Outcome:
    """ttft diagnose's long ramp: as many decode at once at either length, unless longer answers
    overlap more."""
    return long_out_refutes(ctx) or _request_limit(ctx, long_ramp_limit(ctx)[1])


# open-loop arrivals: the levels in flight are not a designed sweep (their number grows because requests
# wait), so TTFT may rise less than a sweep's would; its pass lets the one-level checks judge the order of
# first tokens and stream ends at the load offered
@check("queue.sweep", needs=SWEEP, before=("queue.in_line",), when=_not_a_request_limit,
       final=lambda ctx: closed_loop(ctx),
       reads=("bb_ttft_rise_min", "wait_steps_min", "bb_decode_hold_min", "share_min", "closed_loop_starts_min",
              "closed_loop_p_max"))
def _queue_sweep(ctx: RuleContext) -> Outcome:
    """Client only, several levels in flight: TTFT against concurrency and per-stream decode speed
    (ttft diagnose's long ramp first, when it ran)."""
    th = ctx.th
    uncapped = long_ramp_uncapped(ctx)
    if uncapped is not None and not ctx.has("metrics_queue_share"):
        # the long ramp's streams all decoded together: nothing admitted fewer than came, so what the sweep
        # shows (TTFT rising with load) is compute shared among the streams, not requests held in a line
        most, top = uncapped
        return reason("ttft diagnose's long ramp: {most:g} streams decoded at once at {top:g} in flight: no admission "
                      "limit holds requests back, so TTFT rising with load is the streams sharing the compute, not a "
                      "queue", most=most, top=top)
    # black box: TTFT against concurrency and per-stream decode speed
    ratio = ctx.v("ttft_concurrency_ratio")
    hold = ctx.v("decode_speed_hold_ratio")
    flat = ctx.v("concurrency_flat_levels", 0)
    if ratio < th["bb_ttft_rise_min"]:
        return reason("TTFT at the highest concurrency is {ratio:.1f}x the lowest (< {min:g}x)", ratio=ratio,
                      min=th["bb_ttft_rise_min"])
    holds = hold >= th["bb_decode_hold_min"]
    rise_steps = ctx.v("ttft_rise_per_itl")
    if rise_steps is not None and rise_steps < th["wait_steps_min"]:
        return reason("TTFT rises x{ratio:.1f} with concurrency but only by {steps:.1f} decode steps: new requests "
                      "wait for the step in flight, not in a queue", ratio=ratio, steps=rise_steps)
    if flat >= 1 and closed_loop(ctx):
        return "TTFT is flat then jumps past a concurrency knee: an admission limit above one request (see kv_cache)"
    curve = ctx.v("ttft_by_inflight") or {}
    ys = list(curve.values())
    t = Triage(ctx)
    t.crossed(evidence.TTFT_RISE_X, ratio, "bb_ttft_rise_min", "x",
              f"median TTFT by in-flight requests: {', '.join(f'{k}: {v * 1e3:.0f} ms' for k, v in curve.items())}")
    # the comparison that holds is the one shown: decode speed held (>=) or fell (<)
    t.judged(evidence.DECODE_HOLD, hold, "bb_decode_hold_min", "x",
             "decode speed holds: the server does not batch the extra requests, it makes them wait" if holds
             else "decode slows as well: the server is at capacity", op=">=" if holds else "<")
    t.judged(evidence.TTFT_RISE_STEPS, rise_steps, "wait_steps_min", "steps",
             "new requests wait many steps, not just the one in flight")
    # the engine's own queue-time histogram, when /metrics was scraped alongside: it measures the wait
    # the sweep infers (a KV or front-end limit the client also sees as a queue would show elsewhere)
    mq = ctx.v("metrics_queue_share")
    measured = False
    if mq is not None:
        if holds:
            measured = _judged_metrics_queue_share(t, mq, "the sweep")
        _queue_metric_rows(t, holds)  # the share is the judged row above when decode held, context otherwise
    src = " (engine metrics)" if measured else " (black box)"
    if holds:
        title = ("TTFT rises with concurrency from the start while per-stream decode speed holds: the server "
                 "serialises or admits too few" + src)
        checks = ["the server's admission limits (max_num_seqs, worker count, a global lock) and its queue-time metric",
                  *QUEUE_BUSY_CHECKS[:1], "instrument the server (OTLP spans or /metrics) to confirm the queue share"]
    else:
        title = "TTFT and per-stream decode speed both degrade with concurrency: the server is at capacity (black box)"
        checks = [*QUEUE_BUSY_CHECKS[:3], BB_KV_CHECK]
    share = (ys[-1] - ys[0]) / ys[-1] if ys and ys[-1] > 0 else None
    s, pct = ctx.explained(share)
    if measured:
        return finding(title, t.confidence(0.8), s, pct, t.evidence, checks,
                       note="the concurrency sweep from the client, and the queue time from the engine's /metrics")
    return finding(title, t.confidence(0.8, black_box=True), s, pct, t.evidence, checks,
                   note="client-only evidence: the queue is inferred from the concurrency sweep, not measured; "
                   "confidence lowered", black_box=True)


def closed_loop(ctx: RuleContext) -> bool:
    """Whether the client held the concurrency (each request sent as another ended). Only then is
    a knee in TTFT against requests in flight a limit at that count (KV space, max running);
    under open-loop arrivals the number in flight grows *because* requests wait, and a knee is
    where arrivals outrun the server: a queue's curve. Unknown counts as closed (as before)."""
    frac = ctx.v("starts_after_end_frac")
    if frac is None:
        return True
    qth = ctx.th_of("queue")
    # most requests sent as another ended, and more often than chance: an open loop under a
    # client cap also sends some requests as slots free, but not most of them
    return frac >= float(qth["closed_loop_starts_min"]) and beyond_chance(
        frac, ctx.v("starts_after_end_control") or 0.0, ctx.v("starts_n"), float(qth["closed_loop_p_max"]))


def served_in_line(ctx: RuleContext) -> tuple[bool, bool]:
    """(first tokens follow stream ends beyond chance, waiting streams streamed alone): the two
    signs that requests are served one after another. Reads the ``[queue]`` thresholds from any
    rule (the network rule asks too: waiting in line is a fixed part no prompt token explains)."""
    qth = ctx.th_of("queue")
    alone = ctx.v("decode_alone_frac")
    solo = alone is not None and alone >= qth["bb_decode_alone_min"]
    return follows_stream_ends(ctx, float(qth["bb_after_end_p_max"])), solo


def follows_stream_ends(ctx: RuleContext, p_max: float) -> bool:
    """Whether the waiting requests' first tokens follow stream ends beyond chance at binomial
    tail ``p_max``: just after an end (within a window), or next after one in the order of events
    (a cohort's prefill can outlast the window), either share at least ``[queue] bb_after_end_min``."""
    qth = ctx.th_of("queue")
    n = ctx.v("first_token_after_end_n")
    follows = False
    for share, chance in (("first_token_after_end_frac", "first_token_after_end_control"),
                          ("first_token_after_end_order_frac", "first_token_after_end_order_control")):
        v = ctx.v(share)
        follows |= (v is not None and v >= qth["bb_after_end_min"]
                    and beyond_chance(v, ctx.v(chance) or 0.0, n, p_max))
    return follows


# one load level: the client's order of events (in line) and the engine's gauges (at cap); when both
# fire the surer finding answers (the gauges, with a queue-time histogram, measure what the client infers)
@check("queue.in_line", needs=SINGLE_LEVEL, before=("queue.at_cap",), when=_not_a_request_limit, final=False,
       weighed=True, reads=("bb_line_steps_min", "bb_inline_ratio_min", "bb_inline_ratio_max", "bb_after_end_min",
                            "bb_after_end_p_max", "bb_decode_alone_min", "bb_after_end_plain_n_min",
                            "bb_after_end_plain_p_max", "bb_in_line_both_directness", "bb_single_level_directness"))
def _queue_in_line(ctx: RuleContext) -> Outcome:
    """Client only, one load level: each request waits for the ones ahead of it to finish.

    Three signs together: TTFT many decode steps long; TTFT about (requests ahead) x their
    service time; and requests served one after another: first tokens arriving each just after
    another stream ended (more often than chance at this load gives, by a binomial test over the
    waiting requests), or streams that
    stream alone (no other stream's tokens between their first and last).
    """
    th = ctx.th
    steps = ctx.v("ttft_in_itl_steps_p50")
    inline = ctx.v("ttft_inline_ratio")
    after = ctx.v("first_token_after_end_frac")
    control = ctx.v("first_token_after_end_control") or 0.0
    if steps < th["bb_line_steps_min"]:
        return reason("TTFT p50 is {steps:.1f} decode steps (< {min:g}): new requests start at once", steps=steps,
                      min=th["bb_line_steps_min"])
    if not th["bb_inline_ratio_min"] <= inline <= th["bb_inline_ratio_max"]:
        return reason("TTFT is {inline:.2f}x (requests ahead x their service time), outside {lo:g}..{hi:g}: not "
                      "waiting in line", inline=inline, lo=th["bb_inline_ratio_min"], hi=th["bb_inline_ratio_max"])
    alone = ctx.v("decode_alone_frac")
    follows, solo = served_in_line(ctx)
    if not follows and not solo:
        return reason("{after:.0%} of waiting requests got their first token just after another stream ended "
                      "(chance at this load: {control:.0%}), {order:.0%} next after one in the order of events "
                      "(chance {order_control:.0%}) and {alone:.0%} streamed alone: requests are not served one "
                      "after another", after=after, control=control,
                      order=ctx.v("first_token_after_end_order_frac") or 0,
                      order_control=ctx.v("first_token_after_end_order_control") or 0, alone=alone or 0)
    t = Triage(ctx)
    t.crossed(evidence.TTFT_P50_STEPS, steps, "bb_line_steps_min", "steps",
              "a batching server starts a new request within a step or two; these waited many steps")
    t.judged(evidence.INLINE_RATIO, inline, "bb_inline_ratio_min", "x",
             f"median service time {ctx.v('service_s_p50', 0) * 1e3:.0f} ms (e2e − TTFT): TTFT is what waiting "
             "for every request ahead to finish would take", weigh=False)
    order = ctx.v("first_token_after_end_order_frac")
    by_order = order is not None and (after is None or order > after)
    t.judged(evidence.AFTER_END_SHARE, after, "bb_after_end_min", "share",
             f"first tokens come one after another, each when a stream ends (chance at this load: {control:.0%})",
             weigh=follows and not by_order)
    if by_order:
        t.judged(evidence.NEXT_AFTER_END_SHARE, order, "bb_after_end_min", "share",
                 "stream ends and first tokens alternate, however long the prefill between them (several admitted "
                 f"together); chance: {ctx.v('first_token_after_end_order_control') or 0:.0%}", weigh=follows)
    if alone is not None:
        t.judged(evidence.WAITED_STREAMED_ALONE, alone, "bb_decode_alone_min", "share",
                 "no other stream's tokens while this one streamed: one request served at a time", weigh=solo)
    t.context(evidence.INFLIGHT_AT_ARRIVAL_P50, ctx.v("inflight_at_arrival_p50"), "requests",
              "one load level: no concurrency sweep")
    s, pct = ctx.explained(min(1.0 / inline, 1.0) if inline else None)
    # both signs at once (each first token after a stream end, beyond chance, and each stream alone): a
    # server serving one request at a time, shown as plainly as a sweep shows it; or first tokens after
    # stream ends far beyond chance (a binomial tail no load's timing gives by accident): requests
    # admitted only as others leave, an admission limit of a few at a time, as plain
    both = follows and solo
    plain = both or (follows and (ctx.v("first_token_after_end_n") or 0) >= th["bb_after_end_plain_n_min"]
                     and follows_stream_ends(ctx, float(th["bb_after_end_plain_p_max"])))
    conf = t.confidence(float(th["bb_in_line_both_directness"] if plain else th["bb_single_level_directness"]),
                        black_box=not plain)
    return finding("Requests wait in line: each starts when another finishes, as a server that runs one request "
                   "at a time (or admits too few) makes them (black box, one load level)",
                   conf, s, pct, t.evidence,
                   ["confirm with a concurrency sweep: `ttft probe URL --sweep concurrency` (TTFT rising from the "
                    "lowest level while per-stream decode speed holds)",
                    "the server's admission limits (max_num_seqs, worker count, a global lock, a plain mode without "
                    "batching) and its queue-time metric",
                    "instrument the server (OTLP spans or /metrics) to measure the queue share", BB_KV_CHECK],
                   note="client-only evidence at one load level: the queue is inferred from the order of first "
                   "tokens and stream ends, not measured" + ("; both signs of one-at-a-time service, far beyond "
                                                              "chance" if both else
                                                              "; first tokens follow stream ends far beyond chance: "
                                                              "requests are admitted only as others leave" if plain
                                                              else "; confidence lowered"),
                   black_box=True)


@check("queue.at_cap", needs=AT_CAP, before=("queue.request_limit",), when=_not_a_request_limit,
       reads=("cap_waiting_frac_min", "ttft_vs_prefill_min", "at_cap_directness", "at_cap_measured_directness",
              "share_min"))
def _queue_at_cap(ctx: RuleContext) -> Outcome:
    """The engine's gauges at one level: requests waiting while running sits at its cap, and TTFT
    far above the engine's own prefill time for the prompt (llama.cpp, TGI: no queue histogram). Where the
    engine has a queue-time histogram (vLLM, SGLang) its share of TTFT is judged too, and the finding is
    as direct as the wait it measures (``at_cap_measured_directness``)."""
    th = ctx.th
    at_cap = ctx.v("waiting_at_cap_frac")
    ratio = ctx.v("ttft_vs_engine_prefill_ratio")
    t = Triage(ctx)
    if not t.crossed(evidence.AT_CAP_SCRAPES, at_cap, "cap_waiting_frac_min",
                     "share", f"the running gauge at its highest ({ctx.v('running_seqs_max', 0):g}) with requests "
                     "waiting: the engine admits no more", miss="requests waited at the running cap in {value:.0%} of "
                     "scrapes (< {threshold:.0%})"):
        return t.pass_reason()
    if not t.crossed(evidence.TTFT_OVER_PREFILL, ratio, "ttft_vs_prefill_min", "x",
                     "TTFT far above what the engine itself spends on the prompt: the rest is waiting",
                     miss="TTFT is {value:.1f}x the engine's prefill time (< {threshold:g}x)"):
        return t.pass_reason()
    # vLLM and SGLang also measure the wait: their queue-time histogram, judged like the sweep's
    mq = ctx.v("metrics_queue_share")
    measured = mq is not None and _judged_metrics_queue_share(t, mq, "the waiting gauge")
    _queue_metric_rows(t, measured)
    s, pct = ctx.explained(1.0 - 1.0 / ratio if ratio and ratio > 1 else None)
    directness = float(th["at_cap_measured_directness"] if measured else th["at_cap_directness"])
    return finding("Requests wait for a free slot: running sits at its cap while others wait, and TTFT is far above "
                   "the engine's own prefill time (engine gauges, one load level"
                   + (", the wait measured by its queue-time histogram)" if measured else ")"),
                   t.confidence(directness), s, pct, t.evidence,
                   ["the engine's slot / batch limits (llama.cpp --parallel, TGI max_concurrent_requests / "
                    "max_batch_total_tokens) against the offered load",
                    *QUEUE_BUSY_CHECKS[:1], "confirm with a concurrency sweep: `ttft probe URL --sweep concurrency`"],
                   note="from the engine's waiting/running gauges and prompt seconds, and its queue-time histogram"
                   if measured else "from the engine's waiting/running gauges and prompt seconds; no queue-time "
                   "histogram, so the wait is inferred, not measured")


def _request_limit(ctx: RuleContext, shift: float) -> Outcome:
    """The queue finding from ttft diagnose's long ramp: as many streams decode at once with
    several times the tokens each: the server admits a fixed number of requests. The engine's
    own queue-time histogram, when scraped, measures the wait (or says it is before the engine)."""
    lc = ctx.v("long_ramp_decode_cap")
    t = Triage(ctx)
    long_ramp_rows(t, ctx, shift, crossed=False)
    measured = False
    mq = ctx.v("metrics_queue_share")
    if mq is not None:
        measured = _judged_metrics_queue_share(t, mq, "the long ramp")
    _queue_metric_rows(t, True)
    s, pct = ctx.explained(ctx.v("long_ramp_wait_share"))
    title = (f"At most {lc:g} stream(s) decode at once at any prompt length: the server admits a fixed number of "
             "requests at a time and the rest wait (a limit in requests, "
             + ("engine metrics)" if measured else "black box)"))
    if measured:
        return finding(title, t.confidence(0.8), s, pct, t.evidence, QUEUE_BUSY_CHECKS,
                       note="ttft diagnose's long ramp from the client, and the queue time from the engine's /metrics")
    return finding(title, t.confidence(0.8, black_box=True), s, pct, t.evidence, QUEUE_BUSY_CHECKS,
                   note="client-only evidence from ttft diagnose's long ramp: a KV limit would admit fewer requests at "
                   "longer prompts; from the client the cap may be the engine's (max_num_seqs, max running) or its "
                   "front end's (HTTP workers, API servers): the engine's waiting gauge or queue time in /metrics "
                   "tells them apart (empty while requests wait before it is the front end)", black_box=True)

