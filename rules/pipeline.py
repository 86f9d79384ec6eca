"""The pipeline-parallel bubble rule: stages idle inside the prefill steps, waiting for their input.

With pipeline parallel each stage runs its layers on a micro-batch and hands the activations
down; a stage idles while the pipeline fills and drains. With M equal micro-batches over N
stages the idle share of stage time is (N-1)/(M+N-1): one request alone (M=1) leaves each of 2
stages idle half the step. The evidence is the engine's own per-stage account on its step spans
(compute, send/recv, idle seconds); the rule never fires without it (pipeline parallel off:
"skipped: needs pp_bubble_share_of_prefill"), so tensor-parallel collectives stay the ``comm``
rule's. A client alone cannot see stages: it sees TTFT only.
"""

from __future__ import annotations

from rules import evidence
from rules.base import Outcome, RuleContext, Triage, finding, rule
from rules.registry import Kind

#: vLLM keeps pipeline_parallel_size scheduled batches in flight ("PP requires PP-size concurrent
#: batches to fill the pipeline": VllmConfig.max_concurrent_batches, vllm/config/vllm.py @000fc94b;
#: EngineCore's batch queue, vllm/v1/engine/core.py @00080ee1), so one request cannot fill it
PIPELINE_CHECKS = [
    "more micro-batches per step: more sequences in flight than stages (vLLM keeps "
    "--pipeline-parallel-size batches in flight; fewer concurrent requests than stages leave stages idle)",
    "fewer pipeline stages: each stage added lengthens the fill and drain of every step",
    "tensor parallel instead of pipeline parallel inside a node (NVLink): every GPU works on every "
    "token, no stage waits; keep PP for the hop between nodes",
    "vLLM --pipeline-parallel-size against --tensor-parallel-size at the same GPU count; SGLang --pp-size; "
    "TensorRT-LLM pp_size (build and run) against tp_size",
    "stage balance: the slowest stage sets the pace (layers split unevenly, the embedding and LM head on "
    "the end stages)",
]


@rule("pipeline_bubble", "pipeline_bubble", needs=(("pp_bubble_share_of_prefill",),), kind=Kind.TTFT)
def pipeline_bubble(ctx: RuleContext) -> Outcome:
    """Pipeline-parallel stages idle a large share of the prefill steps (fill and drain bubbles)."""
    th = ctx.th
    share = ctx.v("pp_bubble_share_of_prefill")
    n = ctx.v("pp_size", 0) or 0
    t = Triage(ctx)
    if not t.crossed(evidence.PP_IDLE_PREFILL, share, "bubble_share_min", "share",
                     f"idle stage-seconds / ({n:g} stages x step seconds), from each stage's own account "
                     "(compute, send/recv, idle) on the prefill steps",
                     miss="pipeline idle share of prefill steps {value:.0%} (< {threshold:.0%})"):
        return t.pass_reason()
    tail = ctx.v("pp_bubble_share_tail")
    if tail is None:
        tail = share * (ctx.v("prefill_share_tail") or 0.0)
    if not t.crossed(evidence.PP_IDLE_TAIL, tail, "ttft_share_min", "share",
                     "the idle seconds on the slowest requests' prefill spans / their TTFT",
                     miss="the idle time is {value:.0%} of the slowest TTFTs (< {threshold:.0%})"):
        return t.pass_reason()
    mb = ctx.v("pp_microbatches_p50")
    if mb is not None:
        ideal = (n - 1) / (mb + n - 1) if n >= 2 else None
        t.context(evidence.PP_MICROBATCHES, mb, "count",
                  f"fewer micro-batches than stages leave stages idle; {mb:g} over {n:g} stages idle "
                  + (f"{ideal:.0%} of stage time even when balanced" if ideal is not None else "some stage time"))
    steps = ctx.v("pp_bubble_share_of_steps")
    if steps is not None:
        t.context(evidence.PP_IDLE_ALL, steps, "share", "decode steps included")
    ratio = ctx.v("pp_vs_tp_ttft_ratio")
    by = ctx.v("ttft_by_parallelism") or {}
    if ratio is not None:
        t.judged(evidence.PP_SLOPE_X, ratio, "pp_vs_tp_ratio_min", "x",
                 "median TTFT by layout in this capture: " + ", ".join(f"{k}: {v * 1e3:.0f} ms" for k, v in by.items()),
                 weigh=True)
    s, pct = ctx.explained(tail)
    return finding("Pipeline-parallel bubbles: stages idle while the pipeline fills and drains",
                   t.confidence(0.9), s, pct, t.evidence, PIPELINE_CHECKS,
                   note="server-side evidence only: the stages' idle time is measured by the engine; a client sees TTFT alone")
