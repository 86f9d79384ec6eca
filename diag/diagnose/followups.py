"""Designed follow-ups of ``ttft diagnose``: experiments run after the ladder and the ramp, only
where they decide between the leading candidates. Pure; no I/O.

- ``prefix`` (when prompt work leads: ``prefill_compute``): a repeated shared prefix, one request
  at a time, in groups of a fresh prefix used :data:`~diag.diagnose.design.PREFIX_REPEATS` times
  and a control without it (the probe's ``--shared-prefix N:R`` design, read by the
  ``prefix_cache`` rule). Repeats as slow as a first use: the server prefills the prefix every
  time, and a prefix cache would spare it; repeats as fast as the control: it reuses the prefix.
  The prefix is as long as the ladder's longest rung that was answered, less the suffix.
- ``long`` (when prompt work, a KV limit or a queue leads after a closed-loop ramp): the ramp
  again at :data:`~diag.diagnose.design.LONG_PROMPT_X` x its prompt, at :data:`LONG_LEVELS` in
  flight up to the short ramp's top, until TTFT breaks past :data:`LONG_MIN_TOP` in flight (a
  cap shows as at most half the requests in flight decoding) or requests fail. Each request then
  holds more tokens: under a limit in tokens held (KV-cache capacity) fewer streams decode at once,
  under a limit in requests (max_num_seqs, HTTP workers) as many, and with compute shared all
  of them. Read by the ``kv_cache`` and ``queue`` rules (``long_ramp_*``).
"""

from __future__ import annotations

from collections.abc import Sequence

from diag.diagnose.design import LONG_PROMPT_X, PREFIX_REPEATS, PlanConfig, Step, ratio
from diag.diagnose.points import Point
from diag.diagnose.ramp import ramp_break
from diag.units import fmt_s

#: the long ramp's levels (requests in flight), up to the short ramp's top
LONG_LEVELS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
#: the long ramp climbs at least this far (a cap shows as at most half the requests in flight)
LONG_MIN_TOP = 8.0
#: the leading categories the long ramp can decide: a limit in tokens, in requests, or neither
LONG_LEADS = frozenset({"prefill_compute", "kv_cache", "queue"})

#: prefix groups the follow-up sends (each: PREFIX_REPEATS uses and a control)
PREFIX_GROUPS = 3
#: the leading categories a prefix follow-up can decide: prompt work, which a cache hit would skip
PREFIX_LEADS = frozenset({"prefill_compute"})


def long_ramp_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float, leading: str | None) -> Step | None:
    """The next level of the long ramp, or None (it does not apply, ran to its end, or would not fit)."""
    ran = [p for p in points if p.kind == "long"]
    short = [p for p in points if p.kind == "concurrency"]
    if not ran and (leading not in LONG_LEADS or cfg.ramp != "concurrency" or not short):
        return None
    if any(p.error_frac >= 0.05 for p in short):
        return None  # the server is failing under load: no more experiments on it
    tokens = cfg.long_prompt_tokens
    if tokens < 2 * cfg.input_tokens or any(p.kind == "prompt" and p.refused_4xx and p.value <= tokens for p in points):
        return None  # the context limit leaves no room for prompts that much longer
    top = max(p.value for p in short) if short else 4.0
    # 1, 2, 3, 4, 6, 8, 12, ...: to the short ramp's top, and at least 8 (twice a cap of 4)
    levels = [v for v in LONG_LEVELS if v <= min(max(top, LONG_MIN_TOP), cfg.max_concurrency)]
    for i, p in enumerate(ran[1:], 1):
        if p.error_frac >= 0.05 or (p.value >= LONG_MIN_TOP and ramp_break(cfg, ran[0], p, ran[:i], decode=False)):
            return None  # failing, or broke high enough: how many decode at once is what the rules read
    todo = [v for v in levels if not any(abs(p.value - v) < 1e-9 for p in ran)]
    if not todo:
        return None
    v = todo[0]
    n = max(4, 3 * int(v))  # three rounds per client: enough waiting requests to judge against chance
    rung = min((p for p in points if p.kind == "prompt" and p.ok), key=lambda p: abs(p.value - tokens), default=None)
    e2e = (ran[-1].e2e_p50_s if ran else None) or (rung.e2e_p50_s if rung else None) or 0.0
    if n / v * e2e * (2.0 if ran else 1.0) > cfg.budget_s - elapsed_s:
        return None
    if ran:
        t = ratio(ran[-1].ttft_p50_s, ran[0].ttft_p50_s) or 0.0
        return Step("long", v, n, "follow-up", f"long ramp: TTFT {t:.1f}x its lone request's at {ran[-1].value:g} in "
                                               f"flight; next {v:g}")
    return Step("long", v, n, "follow-up",
                f"{leading} leads (the ramp reached {top:g} in flight at {cfg.input_tokens}-token prompts): the ramp "
                f"again at {tokens}-token prompts ({LONG_PROMPT_X}x, more tokens held per request) tells a limit in "
                "tokens (KV cache: the knee moves to fewer requests) from one in requests (the knee stays) or compute "
                "alone (no knee)")


def followup_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float, leading: str | None) -> Step | None:
    """The next follow-up step, or None (none applies, ran already, or would not fit the budget)."""
    if leading not in PREFIX_LEADS or any(p.kind == "prefix" for p in points):
        return None
    if any(p.error_frac >= 0.05 for p in points if p.kind == cfg.ramp):
        return None  # the server is failing under load: no more experiments on it
    rungs = [p for p in points if p.kind == "prompt" and p.ok > 0]
    if not rungs:
        return None
    top = max(rungs, key=lambda p: p.value)
    prefix = int(min(top.value, cfg.prompt_limit_tokens) - cfg.input_tokens)
    if prefix < 2 * cfg.input_tokens:
        return None  # too short beside the suffix to show what a cache saves
    n = PREFIX_GROUPS * (PREFIX_REPEATS + 1)
    cost = n * (top.e2e_p50_s or top.ttft_p50_s or 0.0)
    if cost > cfg.budget_s - elapsed_s:
        return None
    return Step("prefix", float(prefix), n, "follow-up",
                f"prompt work leads ({leading}: TTFT {fmt_s(top.ttft_p50_s)} at {top.value:g} tokens): a repeated "
                f"{prefix}-token prefix ({PREFIX_REPEATS} uses, then a control without it; {PREFIX_GROUPS} groups, one "
                "at a time) tests whether the server reuses it (prefix caching): repeats as slow as a first use are "
                "prefilled every time")


__all__ = ["LONG_LEADS", "PREFIX_GROUPS", "followup_reading", "long_ramp_reading"]
