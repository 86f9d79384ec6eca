"""ttft diagnose's long ramp read as a limit on what decodes at once: in tokens held (the
kv_cache rule) or in requests (the queue rule), and the longout follow-up that refutes either.
Shared readings, no rule; the thresholds are ``[kv_cache]``'s. Shifts and ratios are unitless."""

from __future__ import annotations

import math

from rules import evidence
from rules.base import RuleContext, Triage, check_strength, reason

#: the features the long ramp's readings need
LONG_RAMP = ("long_ramp_knee_ratio", "long_ramp_token_ratio")


def long_ramp_shift(ctx: RuleContext) -> float | None:
    """ttft diagnose's long ramp: log(knee ratio) / log(token ratio), how far the number of
    streams the server decodes at once moved with the tokens each request holds (1: as the
    tokens, a token budget; 0: not, a request limit); None without a long ramp that showed such
    a cap at prompts holding more tokens per request. A lower bound when the short ramp had no cap."""
    kr, tr = ctx.v("long_ramp_knee_ratio"), ctx.v("long_ramp_token_ratio")
    if kr is None or not tr or tr <= 1.0 or kr <= 0:
        return None
    return math.log(kr) / math.log(tr)


def long_ramp_limit(ctx: RuleContext) -> tuple[str | None, float | None]:
    """What ttft diagnose's long ramp says, with its shift: ``"tokens"`` (fewer decode at once
    the more tokens each holds: the shift reaches ``long_knee_shift_min``, or the uncapped short
    ramp decoded more at once than the long cap), ``"requests"`` (both ramps capped alike), or
    None (no capped long ramp, or an uncapped short ramp that cannot tell)."""
    shift = long_ramp_shift(ctx)
    if shift is None:
        return None, None
    short_flat = bool(ctx.v("long_ramp_short_flat"))
    # uncapped, the short ramp decoded more at once than the long cap: fewer tokens each were all admitted
    if shift >= ctx.th_of("kv_cache")["long_knee_shift_min"] or (short_flat and ctx.v("long_ramp_knee_ratio") > 1.0):
        return "tokens", shift
    return (None if short_flat else "requests"), shift


def long_out_refutes(ctx: RuleContext) -> str | None:
    """Why ttft diagnose's longout follow-up refutes the long ramp's cap as a limit on what runs at
    once, or None: with answers several times longer, clearly more streams decoded at once (at
    least ``long_out_rise_min`` x the cap and the cap + 2). A limit in tokens or in requests would
    have held them to as many or fewer; the cap was how far short decode windows overlap behind a
    stage that takes prompts one at a time before the engine (a tokenizer, a front end)."""
    cap, most, x = ctx.v("long_ramp_decode_cap"), ctx.v("long_out_decode_max"), ctx.v("long_out_output_x")
    th = ctx.th_of("kv_cache")
    if cap is None or most is None or x is None or x < float(th["long_out_output_x_min"]):
        return None
    if most < max(float(th["long_out_rise_min"]) * cap, cap + 2):
        return None
    return reason("ttft diagnose's long ramp capped streams decoding at once at {cap:g}, but with {x:.1f}x longer "
                  "answers {most:g} decoded at once: a limit on what runs at once (KV capacity, max_num_seqs, workers) "
                  "would have held them to as many or fewer; the cap was short decode windows overlapping little "
                  "behind a stage that takes prompts one at a time before the engine (a tokenizer or front end: see "
                  "tokenize, network)", cap=cap, x=x, most=most)


def long_ramp_uncapped(ctx: RuleContext) -> tuple[float, float] | None:
    """ttft diagnose's long ramp ran and no cap on what decodes at once showed: (the most of its
    streams decoding at once, its top level in flight), else None. Without a cap there is no knee
    ratio, so :func:`long_ramp_limit` is None then too."""
    most = ctx.v("long_ramp_decode_max")
    if most is None or ctx.v("long_ramp_decode_cap") is not None:
        return None
    return most, ctx.v("long_ramp_top")


#: the strength of a shift that is a lower bound (the short ramp was never capped, yet decoded more
#: streams at once than the long ramp's cap): a limit in requests is refuted however far the
#: short ramp's own cap lies, but by how much the cap moved is not measured
UNCAPPED_SHORT_STRENGTH = 0.75


def long_ramp_rows(t: Triage, ctx: RuleContext, shift: float, crossed: bool) -> None:
    """The long ramp's evidence: how many streams decode at once at each length, and the shift."""
    lc, sc, tr = ctx.v("long_ramp_decode_cap"), ctx.v("long_ramp_short_decode_cap"), ctx.v("long_ramp_token_ratio")
    sc_most = ctx.v("long_ramp_knee_ratio", 0) * lc
    tokens = ctx.v("long_ramp_prompt_tokens", 0)
    t.context(evidence.LONG_RAMP_CAP, lc, "requests",
              f"at {tokens:.0f}-token prompts at most {lc:g} streams decode together however many are in flight: "
              "the server admits that many, the rest wait")
    t.context(evidence.SHORT_RAMP_CAP, sc, "requests", "the short ramp's cap" if sc is not None
              else "the short ramp's streams decoded together as the load grew: no cap within it (a lower bound)")
    meaning = f"log(cap ratio {ctx.v('long_ramp_knee_ratio'):.2f}) / log(token ratio {tr:.2f}): 1 = the cap moved as " \
              "the tokens each request holds, 0 = it stayed"
    most, x = ctx.v("long_out_decode_max"), ctx.v("long_out_output_x")
    if most is not None and x is not None:
        t.context(evidence.LONG_OUT_CAP, most, "requests",
                  f"answers {x:.1f}x as long: a limit on what runs at once holds as many or fewer (a stage taking "
                  "prompts one at a time would let more overlap)")
    limit = ctx.th_of("kv_cache")["long_knee_shift_min"]
    lower = f"; a lower bound: the short ramp decoded {sc_most:g} at once and was not capped, more than the long ramp's {lc:g}"
    if crossed and shift < limit:  # a lower bound: the uncapped short ramp decoded more at once than the cap
        t.context(evidence.LONG_RAMP_SHIFT, shift, "x", meaning + lower)
        t.add_strength(UNCAPPED_SHORT_STRENGTH)
    elif crossed and sc is None:  # a lower bound past the threshold: at least as strong as one short of it
        t.crossed(evidence.LONG_RAMP_SHIFT, shift, None, "x", meaning + lower, threshold=limit, weigh=False)
        t.add_strength(max(UNCAPPED_SHORT_STRENGTH, check_strength(shift, limit, ">=", "x", None)))
    elif crossed:
        t.crossed(evidence.LONG_RAMP_SHIFT, shift, None, "x", meaning, threshold=limit)
    else:
        t.below(evidence.LONG_RAMP_SHIFT, shift, None, "x", meaning, threshold=limit, op="<")

