"""The tokenize rule: prompt text -> token ids on the serving CPU. Its paths: the server's
tokenize time (spans, or the front end's tokenizer histogram) or CPU profile, then, client only,
TTFT per prompt token against a decode step. Shares are fractions of TTFT (0..1)."""

from __future__ import annotations

from rules import evidence
from rules.base import LONE_SWEEP_NOTE, Outcome, RuleContext, Triage, check, checked_rule, finding, lone_sweep, reason
from rules.registry import Kind

TOKENIZE_CHECKS = ["tokenizer time per prompt token: a fast (Rust) tokenizer, batch encoding, the chat template",
                   "the serving process's CPU profile under concurrency: tokenizer, request parsing and JSON "
                   "serialization threads compete with the scheduler",
                   "move tokenization off the event loop (a process pool, more API-server processes)"]

checked_rule("tokenize", "tokenize", "Prompt -> token ids on the serving CPU takes a large share of TTFT",
             kind=Kind.TTFT)


@check("tokenize.spans", needs=("tokenize_share_tail",), before=("tokenize.black_box",),
       reads=("share_min", "cpu_profile_share_min"))
def _tokenize_spans(ctx: RuleContext) -> Outcome:
    """The server's tokenize time (its spans, or the front end's tokenizer histogram) or its CPU
    profile: either may fire it, both rows are shown."""
    th = ctx.th
    prof_tok = (ctx.v("cpu_profile_shares") or {}).get("tokenize")
    ts = ctx.v("tokenize_share_tail")
    fires = ts >= th["share_min"] or (prof_tok is not None and prof_tok >= th["cpu_profile_share_min"])
    if not fires:
        return reason("tokenize share of the slowest 5% is {ts:.0%} (< {min:.0%})", ts=ts, min=th["share_min"])
    t = Triage(ctx)  # either may fire it: both rows are shown, both strengths count
    from_metrics = ctx.features.get("tokenize_share_tail").source == "prometheus"
    t.judged(evidence.TOKENIZE_SHARE_METRICS if from_metrics else evidence.TOKENIZE_SHARE_TAIL,
             ts, "share_min", "share", "prompt text -> token ids on the serving CPU"
             + (" (mean tokenizer latency / mean TTFT from the front end's histograms)" if from_metrics else ""),
             weigh=True)
    if prof_tok is not None:
        t.judged(evidence.TOKENIZER_CPU_SHARE, prof_tok, "cpu_profile_share_min", "share",
                 "py-spy samples of the serving process", weigh=True)
    slope = ctx.v("ttft_prompt_slope_ms_per_token")
    if slope is not None:
        t.context(evidence.TTFT_SLOPE, slope, "ms/token", "grows with prompt length, like the tokenizer's work")
    s, pct = ctx.explained(ts)
    return finding("Tokenization on the serving CPU takes a large share of TTFT",
                   t.confidence(0.95), s, pct, t.evidence, TOKENIZE_CHECKS,
                   population_share=None if from_metrics else ctx.stage_population(("tokenize",)))


@check("tokenize.black_box", needs=("prompt_slope_per_itl", "ttft_prompt_r2"),
       reads=("bb_r2_min", "bb_slope_per_itl_min", "prefill_compute.explained_frac_min",
              "prefill_compute.bb_alone_frac_min"))
def _tokenize_black_box(ctx: RuleContext) -> Outcome:
    """Client only: TTFT per prompt token against a decode step, far above what a parallel prefill costs."""
    th = ctx.th
    ratio = ctx.v("prompt_slope_per_itl")
    r2 = ctx.v("ttft_prompt_r2")
    if r2 < th["bb_r2_min"] or ratio < th["bb_slope_per_itl_min"]:
        return reason("a prompt token costs {ratio:.2f} of a decode step (< {min:g}) or TTFT is not linear in "
                      "prompt length (R² {r2:.2f})", ratio=ratio, min=th["bb_slope_per_itl_min"], r2=r2)
    slope = ctx.v("ttft_prompt_slope_ms_per_token")
    share, share_min = ctx.v("ttft_prompt_explained_frac"), float(ctx.th_of("prefill_compute")["explained_frac_min"])
    users_mid = ctx.v("users_prompt_mid_tokens")
    if users_mid is not None and share is not None and share < share_min:
        # per-token work that the users' short prompts barely pay: not where their TTFT goes
        return reason("a prompt token costs {ratio:.2f} of a decode step, but at your users' {mid:g}-token prompts "
                      "prompt work is {share:.0%} of TTFT (< {min:.0%})", ratio=ratio, mid=users_mid, share=share,
                      min=share_min)
    t = Triage(ctx)
    t.crossed(evidence.SLOPE_PER_ITL, ratio, "bb_slope_per_itl_min", "x",
              "each prompt token costs a sizeable part of a whole decode step: sequential per-token CPU work, "
              "not a parallel prefill")
    t.crossed(evidence.PROMPT_FIT_R2, r2, "bb_r2_min", "", f"slope {slope:.3g} ms/token", bound=1.0)
    # every fitted request alone in flight: the spread of its prompts is a prompt sweep (as prefill_compute)
    lone = lone_sweep(t, ctx.th_of("prefill_compute")["bb_alone_frac_min"])
    s, pct = ctx.explained(min(share, 1.0) if share is not None else None)
    return finding("TTFT grows per prompt token far faster than a parallel prefill would: tokenization (black box)",
                   t.confidence(0.8, black_box=True, designed=lone), s, pct, t.evidence, TOKENIZE_CHECKS, black_box=True,
                   population_share=None if share is None else min(share, 1.0),
                   note="client-only evidence: per-token cost compared with the decode step; a server-side capture "
                   "tells tokenizer from prefill directly"
                   + (LONE_SWEEP_NOTE if lone else ""))

