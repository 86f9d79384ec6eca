"""The rule ``prefix_cache``: the same context prefilled again and again (prefix-cache misses).

Real case (``/work/shared/reference`` §3, case 9): llama.cpp's ``/v1/chat/completions`` ignored
``cache_prompt`` (ggml-org/llama.cpp#4329), so every chat turn re-prefilled the whole history
(809 tokens, 8 s) instead of the new 73 (1.1 s). A cache that is off, a timestamp or per-user
text at the top of a system prompt, and eviction under memory pressure do the same.

It fires when prompts are known to repeat a prefix (the probe's ``--shared-prefix N:R``
design) and the repeats are not spared its prefill: server-side, their cached prompt tokens
(``gen_ai.usage.cached_tokens``) are a small part of the prefix; client-side, their TTFT stays
near a first use's instead of falling to a control's (the suffix alone) -- and the prefix's
prefill is a material share of TTFT. A cache that hits (repeats cached, or TTFT falling to the
control's) passes; without the design the rule is skipped: nothing else says prompts repeat.
"""

from __future__ import annotations

from diag.ground.external import next_checks
from rules import evidence
from rules.base import Outcome, RuleContext, Triage, check, checked_rule, engine_checks, finding
from rules.registry import Kind

#: what to check next whatever the engine, after the engines' own lines (:func:`diag.ground.external.next_checks`)
COMMON_CHECKS = [
    "what differs at the top of the prompt: a timestamp, request id or per-user text before the shared system "
    "prompt or documents defeats every prefix cache (put variable text after the shared part)",
    "eviction under memory pressure: KV usage near capacity between uses of the prefix evicts its blocks "
    "(more KV memory, fewer concurrent sequences, or route requests that share a prefix to one replica)",
]


def _context_rows(ctx: RuleContext, t: Triage) -> None:
    t.context_of((
        (evidence.PREFIX_FIRST_TTFT_P50, "prefix_first_ttft_p50_s", "a fresh prefix: its prefill cannot be cached"),
        (evidence.PREFIX_REPEAT_TTFT_P50, "prefix_repeat_ttft_p50_s", "the same prefix again, another suffix"),
        (evidence.PREFIX_CONTROL_TTFT_P50, "prefix_control_ttft_p50_s", "what a repeat costs if its prefix is cached"),
    ))
    tok = ctx.v("prefix_shared_tokens")
    if tok is not None:
        t.context(evidence.PREFIX_TOKENS, tok, "tokens",
                  f"{ctx.v('prefix_first_n', 0):g} first uses, {ctx.v('prefix_repeat_n', 0):g} repeats, "
                  f"{ctx.v('prefix_control_n', 0):g} controls")
    hit = ctx.v("prefix_cache_hit_ratio_metrics")
    if hit is not None:
        t.context(evidence.PREFIX_HIT_RATIO_METRICS, hit, "share", "Δ cached prompt tokens / Δ prompt tokens")
    on = ctx.v("prefix_caching_enabled")
    if on is not None:
        t.context(evidence.PREFIX_CACHING_ON, on, "", "1 = on, 0 = off (meta.json engine_config)")


checked_rule("prefix_cache", "prefix_cache",
             "Prompts repeat a prefix but the repeats are prefilled in full again (prefix-cache misses).",
             kind=Kind.TTFT)


def _users_share_none(ctx: RuleContext) -> str | None:
    """The pass reason when ttft diagnose's own shared prefix met users who said their prompts share
    none (``--workload shared_prefix=0``); else None."""
    if ctx.v("designed_by_diagnose") and ctx.v("users_shared_prefix_tokens") == 0:
        return ("whatever the server does with a repeated prefix, your prompts share none (--workload "
                "shared_prefix=0): a prefix cache would not shorten their TTFT")
    return None


_SERVER_READS = ("cached_frac_max", "prefill_share_min", "cost_share_min", "saving_max", "own_test_scale")


@check("prefix_cache.server", needs=("prefix_repeat_cached_frac",), before=("prefix_cache.metrics",),
       reads=_SERVER_READS)
def _server(ctx: RuleContext) -> Outcome:
    """The repeats' cached prompt tokens over their shared prefix, from the server's spans
    (``gen_ai.usage.cached_tokens``), or none when the engine ran with its prefix cache off."""
    return _users_share_none(ctx) or _cached(ctx, ctx.v("prefix_repeat_cached_frac"), by_metrics=False)


@check("prefix_cache.metrics", needs=("prefix_repeat_saving_frac", "prefix_cost_share", "prefix_metrics_cached_frac"),
       before=("prefix_cache.timing",), reads=_SERVER_READS)
def _metrics(ctx: RuleContext) -> Outcome:
    """An external engine's prefix-cache counters: its hit ratio against what the design's repeats
    allow (capped at 1)."""
    return _users_share_none(ctx) or _cached(ctx, min(1.0, ctx.v("prefix_metrics_cached_frac")), by_metrics=True)


def _cached(ctx: RuleContext, cached: float, by_metrics: bool) -> Outcome:
    """The server's account: the part of the shared prefix the cache served (``cached``, a share)
    against the prefill share of TTFT that a hit would skip."""
    th = ctx.th
    t = Triage(ctx)
    saving = ctx.v("prefix_repeat_saving_frac")
    cost = ctx.v("prefix_cost_share")
    prefill = ctx.v("prefill_share_tail")
    how = ("the engine ran with its prefix cache off (meta.json engine_config): nothing was cached"
           if ctx.features.get("prefix_repeat_cached_frac").source == "engine_config" else
           "the engine's prefix-cache hit ratio (metrics) over the ratio a working cache gives these prompts "
           "(the repeats' prefix tokens / all prompt tokens)" if by_metrics else
           "server spans (gen_ai.usage.cached_tokens): how much of the repeated prefix the cache served")
    if not t.below(evidence.PREFIX_CACHED_FRAC, cached, "cached_frac_max", "share", how,
                   miss="repeats had {value:.0%} of their shared prefix cached (> {threshold:.0%}): the cache hits"):
        return t.pass_reason()
    material = prefill if prefill is not None else cost
    key = "prefill_share_min" if prefill is not None else "cost_share_min"
    if not t.crossed(evidence.PREFILL_SHARE_TAIL if prefill is not None else
                     evidence.PREFIX_COST_SHARE, material, key, "share",
                     "the forward passes a cache hit would have skipped",
                     miss="prefill is {value:.0%} of TTFT (< {threshold:.0%}): a cache would save little"):
        return t.pass_reason("the prefill share of TTFT is unknown")
    if saving is not None:
        t.judged(evidence.PREFIX_SAVING, saving, "saving_max", "share",
                 "(first - repeat) / (first - control): 1 = repeats cost what the suffix alone costs", op="<=")
    _context_rows(ctx, t)
    s, pct = ctx.explained(material * (1.0 - cached))
    own, scale = _own_test(ctx)
    title = OWN_TITLE if own else "Prefix-cache misses: prompts repeat a prefix but it is prefilled again every time"
    return finding(title,
                   t.confidence(0.9) * scale, s, pct, t.evidence,
                   engine_checks(ctx, next_checks("prefix_cache"), COMMON_CHECKS),
                   note=(OWN_NOTE + "; " if own else "")
                   + "explained share: the prefill share x the part of the shared prefix not served from the cache",
                   conditional=own)


@check("prefix_cache.timing", needs=("prefix_repeat_saving_frac", "prefix_cost_share"),
       reads=("saving_max", "cost_share_min", "own_test_scale"))
def _timing(ctx: RuleContext) -> Outcome:
    """The client's account (or a server that reports no cached tokens): TTFT of repeats against
    first uses and controls of the designed probe."""
    not_yours = _users_share_none(ctx)
    if not_yours:
        return not_yours
    t = Triage(ctx)
    saving = ctx.v("prefix_repeat_saving_frac")
    cost = ctx.v("prefix_cost_share")
    if not t.below(evidence.PREFIX_SAVING, saving, "saving_max", "share",
                   "(first - repeat) / (first - control) of TTFT p50s: 1 = repeats cost what the suffix alone costs, "
                   "0 = they cost a whole first use", op="<=",
                   miss="repeats were spared {value:.0%} of the prefix's cost (> {threshold:.0%}): the cache hits"):
        return t.pass_reason()
    if not t.crossed(evidence.PREFIX_COST_SHARE, cost, "cost_share_min", "share",
                     "(first - control) / first: the prefill a cache hit would skip",
                     miss="the prefix is {value:.0%} of a first use's TTFT (< {threshold:.0%}): a cache would save little"):
        return t.pass_reason()
    _context_rows(ctx, t)
    rep, ctl = ctx.v("prefix_repeat_ttft_p50_s"), ctx.v("prefix_control_ttft_p50_s")
    share = max(0.0, (rep - ctl) / rep) if rep and ctl is not None else None
    s, pct = ctx.explained(share)
    bb = ctx.black_box
    own, scale = _own_test(ctx)
    note = (("client-only evidence: TTFT of repeats against first uses and controls of the designed probe "
             "(--shared-prefix N:R); the server's cache is not observed") if bb else
            "the server reports no cached tokens: judged from TTFT on repeats")
    title = OWN_TITLE if own else "Prefix-cache misses: repeats of a shared prefix take as long as its first use"
    return finding(title + (" (client timing)" if bb else ""),
                   t.confidence(0.85, black_box=bb) * scale, s, pct, t.evidence,
                   engine_checks(ctx, next_checks("prefix_cache"), COMMON_CHECKS), black_box=bb,
                   note=(OWN_NOTE + "; " if own else "") + note, conditional=own)


#: the title when the shared prefix was ttft diagnose's own test (not known to be the users' workload)
OWN_TITLE = ("The server prefills a repeated prefix again every time: if your prompts share one (a system prompt, "
             "a document), prefix caching would spare it")
OWN_NOTE = ("the shared prefix was ttft diagnose's own test, not the users' prompts: a conditional finding, ranked "
            "after what was measured (confidence x [prefix_cache] own_test_scale)")


def _own_test(ctx: RuleContext) -> tuple[bool, float]:
    """Whether the shared prefix was ttft diagnose's own follow-up with nothing known of the users'
    prompts (conditional), and the confidence factor: ``own_test_scale`` then, else 1. Users who
    said their prompts share a prefix (``--workload shared_prefix=N``) are judged for it."""
    own = bool(ctx.v("designed_by_diagnose")) and ctx.v("users_shared_prefix_tokens") is None
    return own, float(ctx.th["own_test_scale"]) if own else 1.0

