"""The rule ``pd_transfer``: under disaggregated prefill/decode, the hand-off between the two sides
holds TTFT: the prompt's KV moving from the prefill instance to the decode instance, or the decode
instance admitting it (its KV pool or running cap full).

Each instance reports a low TTFT of its own (vLLM's and SGLang's per-instance metrics); the user's
TTFT is the prefill side's, the transfer and the decode side's admission in a row. Read from the
request spans that split them (the bundled engine's ``ttft serve --pd``: :mod:`rules.features.pd`),
else from the engines' metrics: each instance's own series under ``role=prefill`` / ``role=decode``
(the bundled engine's one endpoint, or two instances' endpoints given as ``--metrics prefill=URL
--metrics decode=URL``) and the transfer histogram; without either the rule is skipped. A client
alone sees only TTFT.
"""

from __future__ import annotations

from rules import evidence
from rules.base import Outcome, RuleContext, Triage, check, checked_rule, finding
from rules.registry import Kind

TRANSFER_CHECKS = [
    "the link between the prefill and decode instances: its bandwidth and latency against the KV of a prompt "
    "(vLLM's NIXL connector: vllm:nixl_xfer_time_seconds and vllm:nixl_bytes_transferred; SGLang: "
    "kv_transfer_latency_ms); RDMA rather than TCP, the same rack or node for a pair",
    "transfers that wait for each other: one link, one transfer at a time, or a transfer that starts only after "
    "the whole prefill (layer-wise streaming overlaps it)",
    "whether disaggregation pays at these prompt lengths: short prompts on a fast prefill may be quicker served "
    "on one instance than moved",
]
ADMISSION_CHECKS = [
    "the decode instance's KV pool and running cap: the requests wait there for blocks or a running place (vLLM's "
    "decode instance: in its waiting queue, before and after WAITING_FOR_REMOTE_KVS, its queue-time histogram "
    "holding the transfer too; SGLang's decode prealloc queue)",
    "the prefill:decode ratio of instances: more decode capacity, or fewer prefill instances feeding it",
    "each side's own TTFT beside the user's: a prefill instance reporting a low TTFT while users wait is this gap",
]


checked_rule("pd_transfer", "pd_transfer",
             "The KV transfer or the decode side's admission is a material share of TTFT", kind=Kind.TTFT)


@check("pd_transfer.spans", needs=("pd_transfer_share", "pd_decode_queue_share"), before=("pd_transfer.metrics",),
       reads=("share_min", "transfer_vs_prefill_min"))
def _spans(ctx: RuleContext) -> Outcome:
    """The request spans that split the prefill side, the transfer and the decode side's admission."""
    transfer = max(ctx.v("pd_transfer_share"), ctx.v("pd_transfer_share_tail") or 0.0)
    admission = max(ctx.v("pd_decode_queue_share"), ctx.v("pd_decode_queue_share_tail") or 0.0)
    t = Triage(ctx)
    which = "transfer" if transfer >= admission else "admission"
    if which == "transfer":
        hit = t.crossed(evidence.PD_TRANSFER_SHARE, transfer, "share_min", "share",
                        "the prompt's KV moving from the prefill side to the decode side, over TTFT (all requests or "
                        "the slowest 5%, the larger)",
                        miss="the KV transfer is {value:.0%} of TTFT (< {threshold:.0%})")
    else:
        hit = t.crossed(evidence.PD_ADMISSION_SHARE, admission, "share_min", "share",
                        "from the KV's arrival on the decode side to the first token back, over TTFT (all requests "
                        "or the slowest 5%, the larger): waiting for its blocks and a running place",
                        miss="the decode side's admission is {value:.0%} of TTFT (< {threshold:.0%})")
    if not hit:
        return t.pass_reason()
    if which == "transfer" and not (t.crossed(
            evidence.PD_TRANSFER_X, ctx.v("pd_transfer_vs_prefill_x"), "transfer_vs_prefill_min", "x",
            "moving the prompt's KV against computing it: a transfer well under its prefill is the cost of "
            "disaggregating, not a wait", miss="the transfer takes {value:.2f}x its prefill (< {threshold:.2f}x): the "
            "cost of moving the KV, small beside computing it") and t.crossed(
            evidence.PD_TRANSFER_FLOOR_X, ctx.v("pd_transfer_floor_vs_prefill_x"), "transfer_vs_prefill_min", "x",
            "the fastest transfers (features' floor_quantile) over their own prefill: what the link takes when a "
            "transfer waits for nothing else", miss="the fastest transfers take {value:.2f}x their prefill "
            "(< {threshold:.2f}x): the link itself is quick; the slower ones waited, behind other transfers on the "
            "link or for a side busy with other requests (the same prompts sent one at a time show the link "
            "alone)")):
        return t.pass_reason()
    t.context_of((
        (evidence.PD_PREFILL_TTFT_P50, "pd_prefill_ttft_p50_s", "what the prefill instance reports"),
        (evidence.PD_DECODE_TTFT_P50, "pd_decode_ttft_p50_s", "hand-off to first token: transfer, admission"),
        (evidence.PD_TRANSFER_P50, "pd_transfer_p50_s", "per request"),
        (evidence.PD_ADMISSION_WAIT_SHARE, "pd_admission_share", "share of TTFT"),
    ))
    share = ctx.v("pd_transfer_share") if which == "transfer" else ctx.v("pd_decode_queue_share")
    s, pct = ctx.explained(transfer if which == "transfer" else admission)
    title = ("Disaggregated prefill/decode: the KV transfer between the instances holds TTFT" if which == "transfer"
             else "Disaggregated prefill/decode: the decode instance admits requests late (its KV pool or running cap)")
    return finding(title, t.confidence(0.9), s, pct, t.evidence,
                   TRANSFER_CHECKS if which == "transfer" else ADMISSION_CHECKS,
                   note="server-side evidence: the engine's spans split the prefill side, the transfer and the decode "
                   "side's admission", population_share=share)


@check("pd_transfer.metrics", needs=("pd_metrics_decode_ttft_share",), reads=("share_min", "transfer_vs_prefill_min"))
def _from_metrics(ctx: RuleContext) -> Outcome:
    """Each instance's own TTFT and the transfer histogram (a user with only ``/metrics``): the decode
    instance's TTFT is the hand-off (transfer, admission, the token's way back)."""
    t = Triage(ctx)
    decode = ctx.v("pd_metrics_decode_ttft_share")
    transfer = ctx.v("pd_metrics_transfer_share")
    admission = ctx.v("pd_metrics_admission_share")
    if transfer is not None and (admission is None or transfer >= admission):
        if not (t.crossed(evidence.PD_TRANSFER_SHARE_METRICS, transfer, "share_min", "share",
                          "mean seconds per KV transfer over the two instances' TTFTs together",
                          miss="the KV transfer is {value:.0%} of TTFT (< {threshold:.0%})")
                and t.crossed(evidence.PD_TRANSFER_X_METRICS, ctx.v("pd_metrics_transfer_vs_prefill_x"),
                              "transfer_vs_prefill_min", "x", "mean transfer over the prefill instance's prefill time",
                              miss="the transfer takes {value:.2f}x its prefill (< {threshold:.2f}x)")):
            return t.pass_reason()
        which = "transfer"
    else:
        rest = admission if admission is not None else decode
        if not t.crossed(evidence.PD_ADMISSION_SHARE_METRICS, rest, "share_min", "share",
                         "the decode instance's own TTFT less the KV transfer, its own step computing the prompt's "
                         "last token (its prefill-time histogram) and its front end (as the prefill instance's TTFT "
                         "beyond its queue and prefill shows it), over the two instances' TTFTs together: its wait "
                         "for blocks and a running place",
                         miss="the decode side's admission is {value:.0%} of TTFT (< {threshold:.0%})"):
            return t.pass_reason()
        which = "admission"
    t.context(evidence.PD_DECODE_TTFT_SHARE_METRICS, decode, "share",
              "hand-off to first token: what a prefill instance's low TTFT leaves out")
    t.context_of((
        (evidence.PD_PREFILL_TTFT_MEAN_METRICS, "pd_metrics_prefill_ttft_s",
         "what the prefill instance reports: its own prefill"),
        (evidence.PD_DECODE_TTFT_MEAN_METRICS, "pd_metrics_decode_ttft_s",
         "what the decode instance reports: transfer, admission, its step"),
        (evidence.PD_USERS_TTFT_P50, "ttft_p50_s", "the client's, when a client capture is there: beside the "
         "two instances' own, the proxy and the hops between them too"),
    ))
    s, pct = ctx.explained(transfer if which == "transfer" else (admission if admission is not None else decode))
    title = ("Disaggregated prefill/decode: the KV transfer between the instances holds TTFT" if which == "transfer"
             else "Disaggregated prefill/decode: the decode instance admits requests late (its KV pool or running cap)")
    return finding(title, t.confidence(0.8), s, pct, t.evidence, TRANSFER_CHECKS if which == "transfer"
                   else ADMISSION_CHECKS, note="engine metrics: each instance's own TTFT and the KV-transfer histogram "
                   "(means over the windows), not per request")
