"""Designed follow-ups of ``ttft diagnose``: experiments run after the ladder and the ramp, only
where they decide between the leading candidates. Pure; no I/O.

- ``prefix`` (when prompt work leads: ``prefill_compute``): a repeated shared prefix, one request
  at a time, in groups of a fresh prefix used :data:`~diag.analysis.diagnose.design.PREFIX_REPEATS` times
  and a control without it (the probe's ``--shared-prefix N:R`` design, read by the
  ``prefix_cache`` rule). Repeats as slow as a first use: the server prefills the prefix every
  time, and a prefix cache would spare it; repeats as fast as the control: it reuses the prefix.
  The prefix is as long as the ladder's longest rung that was answered, less the suffix.
- ``long`` (when prompt work (:func:`prompt_work_leads`), a KV limit or a queue leads after a
  closed-loop ramp; prompt work leads too beneath a healthy verdict when the ladder's TTFT grew
  :data:`LADDER_PROMPT_WORK_X` x: longer prompts hold more tokens, and a limit in tokens that the
  short ramp never reached may bite them): the ramp
  again at :attr:`~diag.analysis.diagnose.design.PlanConfig.long_prompt_tokens` (4x its prompt), at :data:`LONG_LEVELS` in
  flight up to the short ramp's top, until TTFT breaks past :data:`LONG_MIN_TOP` in flight (a
  cap shows as at most half the requests in flight decoding) or requests fail. Each request then
  holds more tokens: under a limit in tokens held (KV-cache capacity) fewer streams decode at once,
  under a limit in requests (max_num_seqs, HTTP workers) as many, and with compute shared all
  of them. Read by the ``kv_cache`` and ``queue`` rules (``long_ramp_*``).
- ``longout`` (when, after the long ramp, a limit in tokens or in requests leads): the long prompt
  again at :data:`~diag.analysis.diagnose.design.LONG_OUT_CONCURRENCY` in flight with answers several
  times longer (each stream's decode window at least :data:`LONG_OUT_WINDOW_X` x the long prompt's
  per-token part at concurrency 1). A limit on what runs at once (KV capacity, max_num_seqs, HTTP
  workers held until the answer ends) holds as many, or fewer, streams with longer answers; a stage
  that takes prompts one at a time at its own pace before the engine (a tokenizer, a front end)
  lets more of the longer decode windows overlap, so the count rises. Read by the ``kv_cache``
  and ``queue`` rules (``long_out_*``).
- ``mixed`` (when prompt work leads, or an ITL target is given and nothing else leads): short
  streams at :data:`~diag.analysis.diagnose.design.MIXED_CONCURRENCY` in flight with every
  :data:`~diag.analysis.diagnose.design.MIXED_EVERY`-th prompt long (the probe's ``--inject-long``). Short
  requests that arrive behind an unfinished long prompt and wait for its whole prefill while the
  running streams keep their pace: head-of-line blocking (a chunked prefill that serves one prompt
  at a time); running streams stalled for the long prefill: prefill-decode interference (a
  prefill that runs whole, ahead of decode); neither: the scheduler shares the step. The long
  prompt's lone TTFT is :data:`MIXED_LONG_TTFT_X` x the baseline's (from the ladder's fit), and
  with an ITL target at least twice it, below the context limit. Read by the ``head_of_line``
  and ``interference`` rules (``ctx.mixed``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from diag.analysis.diagnose.design import (GRAMMAR_USES, LONG_OUT_CONCURRENCY, LORA_CONCURRENCY, MIXED_CONCURRENCY, MIXED_EVERY,
                                  PREFIX_REPEATS, PlanConfig, Step, base_point, ratio)
from diag.analysis.diagnose.ladder import prompt_fit
from diag.analysis.diagnose.points import Point
from diag.analysis.diagnose.ramp import ramp_break
from diag.ground.units import fmt_s

#: the long ramp's levels (requests in flight), up to the short ramp's top
LONG_LEVELS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
#: the long ramp climbs at least this far: a cap shows as at most half the requests in flight, so caps
#: up to 6 show (a reservation of 5-6 contexts, a max_num_seqs of 6, as well as a KV limit of 1-3 long requests)
LONG_MIN_TOP = 12.0
#: the leading categories the long ramp can decide: a limit in tokens, in requests, or neither; and
#: ``loadgen`` (the client's timing invalid): how many streams decode at once it reads from when
#: each stream's answer starts and ends against the others', which a late client shifts together
#: (a stall can merge a few ends and starts), so it holds where the TTFT figures do not
LONG_LEADS = frozenset({"prefill_compute", "kv_cache", "queue", "loadgen", "inconclusive"})

#: the leading categories the longout follow-up can decide: a cap the long ramp read as a limit
LONG_OUT_LEADS = frozenset({"kv_cache", "queue"})
#: its answers: each stream's decode window at least this many times the long prompt's per-token part
#: at concurrency 1 (the most a stage taking prompts one at a time could spend on one) ...
LONG_OUT_WINDOW_X = 3.0
#: ... between these many times the ramp's answer
LONG_OUT_MIN_X, LONG_OUT_MAX_X = 4, 8
#: rounds per client
LONG_OUT_ROUNDS = 2

#: the grammar follow-up: fresh schemas, each used GRAMMAR_USES times (first uses and repeats to compare)
GRAMMAR_GROUPS = 6
#: the LoRA follow-up's requests per step (the one-adapter control, then all the users' adapters)
LORA_REQUESTS = 32

#: the mixed follow-up's long prompt: its lone TTFT this many times the baseline's, by the ladder's fit
MIXED_LONG_TTFT_X = 20.0
#: ... and at least this many times the short prompt (a "long" one to the head-of-line features)
MIXED_LONG_MIN_X = 4
#: requests the mixed follow-up sends (a quarter of them long)
MIXED_REQUESTS = 48
#: the leading categories the mixed and prefix follow-ups can decide: prompt work, where a long
#: prompt's prefill may hold short ones (head-of-line) or running streams (interference), and which a
#: cache hit would skip ...
PROMPT_WORK_LEADS = frozenset({"prefill_compute"})
#: ... and, when the users hold an ITL target, what a long prompt's stall would break (mixed)
MIXED_ITL_LEADS = frozenset({"healthy", "decode", "prefill_compute"})

#: prefix groups the follow-up sends (each: PREFIX_REPEATS uses and a control)
PREFIX_GROUPS = 3
#: with no cause named (healthy: nothing waits in the experiment; inconclusive), prompt work still
#: leads when the ladder's longest rung took at least this many times the baseline's TTFT: what
#: that work does to others (short prompts behind a long one) and whether a cache would skip it
#: are the follow-ups' questions, not the ladder's
LADDER_PROMPT_WORK_X = 3.0


def prompt_work_leads(points: Sequence[Point], leading: str | None) -> str | None:
    """Why prompt work leads, said for a follow-up's reason, or None when it does not: named
    (``leading`` in :data:`PROMPT_WORK_LEADS`), or beneath no named cause with the ladder's TTFT growing
    :data:`LADDER_PROMPT_WORK_X` times or more from the baseline to its longest rung."""
    if leading in PROMPT_WORK_LEADS:
        return f"prompt work leads ({leading})"
    if leading not in ("healthy", "inconclusive"):
        return None
    base = base_point(points)
    top = max((p for p in points if p.kind == "prompt" and p.ok), key=lambda p: p.value, default=None)
    x = ratio(top.ttft_p50_s, base.ttft_p50_s) if top is not None and base is not None else None
    if x is None or x < LADDER_PROMPT_WORK_X:
        return None
    return f"prompt work leads ({leading}, but TTFT grew {x:.1f}x to {top.value:g}-token prompts on the ladder)"


def long_ramp_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float, leading: str | None) -> Step | None:
    """The next level of the long ramp, or None (it does not apply, ran to its end, or would not fit)."""
    ran = [p for p in points if p.kind == "long"]
    short = [p for p in points if p.kind == "concurrency"]
    prompt_work = prompt_work_leads(points, leading)
    if not ran and ((leading not in LONG_LEADS and prompt_work is None) or cfg.ramp != "concurrency" or not short):
        return None
    if any(p.error_frac >= 0.05 for p in short):
        return None  # the server is failing under load: no more experiments on it
    tokens = cfg.long_prompt_tokens
    if tokens < 2 * cfg.input_tokens or any(p.kind == "prompt" and p.refused_too_long and p.value <= tokens for p in points):
        return None  # the context limit leaves no room for prompts that much longer
    top = max(p.value for p in short) if short else 4.0
    # 1, 2, 3, 4, 6, 8, 12, ...: to the short ramp's top, and at least 12 (twice a cap of 6)
    levels = [v for v in LONG_LEVELS if v <= min(max(top, LONG_MIN_TOP), cfg.max_concurrency)]
    if any(p.refused_too_long for p in ran):
        return None  # the long prompt was refused as longer than the context: the experiment's limit
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
    if leading == "loadgen":
        return Step("long", v, n, "follow-up",
                    f"the client's timing is invalid (loadgen; the ramp reached {top:g} in flight): the ramp again at "
                    f"{tokens}-token prompts counts how many streams decode at once, from when the answers start and "
                    "end against each other (a late client shifts them together): a limit in requests (the count "
                    "stays), in tokens (it falls at longer prompts) or none")
    who = ("no cause is named yet (inconclusive)" if leading == "inconclusive"
           else f"{leading} leads" if leading in LONG_LEADS else str(prompt_work))
    return Step("long", v, n, "follow-up",
                f"{who} (the ramp reached {top:g} in flight at {cfg.input_tokens}-token prompts): the ramp "
                f"again at {tokens}-token prompts ({tokens / cfg.input_tokens:.0f}x, more tokens held per request) tells a limit in "
                "tokens (KV cache: the knee moves to fewer requests) from one in requests (the knee stays) or compute "
                "alone (no knee)")


#: how a follow-up that applied but did not fit the budget is said (read by diag.analysis.diagnose.certainty)
UNFIT = "did not fit the budget"


def unfit(kind: str, tells: str, cost_s: float, left_s: float) -> str:
    """Why the ``kind`` follow-up, which would tell ``tells``, was not run: the budget left was too short."""
    return (f"the {kind} follow-up, which tells {tells}, {UNFIT} (about {cost_s:.0f} s, {max(left_s, 0.0):.0f} s "
            "left)")


def long_output_tokens(cfg: PlanConfig, points: Sequence[Point]) -> int | None:
    """The longout follow-up's answer length (tokens), or None when the context leaves no room for
    answers at least :data:`LONG_OUT_MIN_X` / 2 times the ramp's."""
    base = base_point(points)
    fit = prompt_fit(points)
    o = cfg.output_tokens
    want = LONG_OUT_MIN_X * o
    itl = (base.tpot_p50_s or base.itl_p50_s) if base is not None else None
    if fit is not None and fit[0] > 0 and itl:
        want = max(want, math.ceil(LONG_OUT_WINDOW_X * fit[0] * cfg.long_prompt_tokens / itl))
    want = min(want, LONG_OUT_MAX_X * o)
    if cfg.context_limit_tokens:
        want = min(want, cfg.context_limit_tokens - cfg.long_prompt_tokens - 8)
    return want if want * 2 >= LONG_OUT_MIN_X * o else None


def long_output_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float,
                        leading: str | None) -> Step | str | None:
    """The longout follow-up; why it did not fit the budget (:func:`unfit`); or None (it does not
    apply, or ran already)."""
    if any(p.kind == "longout" for p in points) or leading not in LONG_OUT_LEADS:
        return None
    ran = [p for p in points if p.kind == "long"]
    if not ran or any(p.error_frac >= 0.05 for p in ran):
        return None
    out = long_output_tokens(cfg, points)
    base = base_point(points)
    if out is None or base is None:
        return None
    c = min(LONG_OUT_CONCURRENCY, cfg.max_concurrency)
    n = LONG_OUT_ROUNDS * c
    lone = ran[0].ttft_p50_s or 0.0
    per_token = base.tpot_p50_s or base.itl_p50_s or 0.0
    cost = n * (lone + out * per_token)  # at worst one at a time
    if cost > cfg.budget_s - elapsed_s:
        return unfit("longout", "a limit on what runs at once from a stage taking prompts one at a time", cost,
                     cfg.budget_s - elapsed_s)
    return Step("longout", float(out), n, "follow-up",
                f"{leading} leads from the long ramp's cap on streams decoding at once: the long prompt again at {c} "
                f"in flight with {out}-token answers ({out / cfg.output_tokens:.0f}x) tells a limit on what runs at "
                "once (as many or fewer decode together) from a stage that takes prompts one at a time before the "
                "engine, a tokenizer or front end (more of the longer answers overlap)")


def mixed_long_prompt(cfg: PlanConfig, points: Sequence[Point]) -> tuple[int, float | None] | None:
    """The mixed follow-up's long prompt: (tokens, its lone TTFT by the ladder's fit, None where TTFT
    does not follow the prompt), or None when the context leaves no room for one."""
    base = base_point(points)
    fit = prompt_fit(points)
    shortest = MIXED_LONG_MIN_X * cfg.input_tokens
    if fit is None or fit[0] <= 0 or base is None or not base.ttft_p50_s:
        want = 4 * shortest  # TTFT does not follow the prompt (or is unmeasured): a long one, well past short
    else:
        slope, icpt, _ = fit
        lone_s = MIXED_LONG_TTFT_X * base.ttft_p50_s
        if cfg.itl_target_s:
            lone_s = max(lone_s, 2.0 * cfg.itl_target_s)  # a whole-prompt prefill would stall streams past it
        want = int((lone_s - icpt) / slope)
    refused = [p.value for p in points if p.kind == "prompt" and p.refused_too_long]
    top = min([cfg.prompt_limit_tokens, *(v - cfg.input_tokens for v in refused)])
    tokens = int(min(max(want, shortest), top))
    if tokens < shortest:
        return None
    return tokens, ((fit[1] + fit[0] * tokens) if fit and fit[0] > 0 else None)


def mixed_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float, leading: str | None) -> Step | str | None:
    """The mixed follow-up; why it did not fit the budget (:func:`unfit`); or None (it does not
    apply, or ran already)."""
    if any(p.kind == "mixed" for p in points):
        return None
    prompt_work = prompt_work_leads(points, leading)
    if prompt_work is None and not (cfg.itl_target_s and leading in MIXED_ITL_LEADS):
        return None
    ramp = [p for p in points if p.kind == cfg.ramp]
    if not ramp or any(p.error_frac >= 0.05 for p in ramp):
        return None  # no load level ran, or the server is failing under load
    long = mixed_long_prompt(cfg, points)
    base = base_point(points)
    if long is None or base is None:
        return None
    tokens, fit_s = long
    long_s = fit_s if fit_s is not None else (base.ttft_p50_s or 0.0)
    c = min(MIXED_CONCURRENCY, cfg.max_concurrency)
    cost = MIXED_REQUESTS / c * (base.e2e_p50_s or 0.0) + MIXED_REQUESTS / MIXED_EVERY * long_s
    if cost > cfg.budget_s - elapsed_s:
        return unfit("mixed", "short prompts waiting behind long ones from prefill itself", cost, cfg.budget_s - elapsed_s)
    why = (f"an ITL target of {fmt_s(cfg.itl_target_s)} is given" if cfg.itl_target_s and leading != "prefill_compute"
           else prompt_work)
    return Step("mixed", float(tokens), MIXED_REQUESTS, "follow-up",
                f"{why}: short streams at {c} in flight with every {MIXED_EVERY}th prompt {tokens} tokens (a lone "
                f"TTFT of about {fmt_s(long_s)}) tell short prompts waiting behind a long one (head-of-line) and "
                "running streams stalled while it prefills (interference) from a scheduler that shares the step")


def followup_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float,
                     leading: str | None) -> Step | str | None:
    """The prefix follow-up; why it did not fit the budget (:func:`unfit`); or None (it does not
    apply, or ran already)."""
    prompt_work = prompt_work_leads(points, leading)
    if prompt_work is None or any(p.kind == "prefix" for p in points):
        return None
    if any(p.error_frac >= 0.05 for p in points if p.kind == cfg.ramp):
        return None  # the server is failing under load: no more experiments on it
    rungs = [p for p in points if p.kind == "prompt" and p.ok > 0]
    if not rungs:
        return None
    if cfg.users_shared_prefix_tokens == 0:
        return None  # the users' prompts share no prefix: a cache would not reach them
    top = max(rungs, key=lambda p: p.value)
    prefix = int(min(top.value, cfg.prompt_limit_tokens) - cfg.input_tokens)
    if cfg.users_shared_prefix_tokens:  # the users' own prefix, as long as the ladder reached
        prefix = max(min(prefix, cfg.users_shared_prefix_tokens), 2 * cfg.input_tokens)
    if prefix < 2 * cfg.input_tokens:
        return None  # too short beside the suffix to show what a cache saves
    n = PREFIX_GROUPS * (PREFIX_REPEATS + 1)
    cost = n * (top.e2e_p50_s or top.ttft_p50_s or 0.0)
    if cost > cfg.budget_s - elapsed_s:
        return unfit("prefix", "a prefix recomputed on every use from prefill itself", cost, cfg.budget_s - elapsed_s)
    return Step("prefix", float(prefix), n, "follow-up",
                f"{prompt_work}, TTFT {fmt_s(top.ttft_p50_s)} at {top.value:g} tokens: a repeated "
                f"{prefix}-token prefix ({PREFIX_REPEATS} uses, then a control without it; {PREFIX_GROUPS} groups, one "
                "at a time) tests whether the server reuses it (prefix caching): repeats as slow as a first use are "
                "prefilled every time")


def structured_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float,
                       leading: str | None) -> Step | str | None:
    """The grammar follow-up when the users send JSON schemas (``--workload response_format=schema``):
    one at a time, groups of :data:`GRAMMAR_USES` requests per fresh schema, so a server that compiles
    each schema before its request runs shows it in the first uses' TTFT; why it did not fit the
    budget; or None (not said, other output, or ran already)."""
    if cfg.users_response_format != "schema" or any(p.kind == "grammar" for p in points):
        return None
    base = next((p for p in points if p.kind == "baseline" and p.ok), None)
    if base is None:
        return None
    n = GRAMMAR_GROUPS * GRAMMAR_USES
    cost = n * (base.e2e_p50_s or base.ttft_p50_s or 0.0) * 2.0  # first uses wait for their compile too
    if cost > cfg.budget_s - elapsed_s:
        return unfit("grammar", "JSON schemas compiled before their requests run from a server that is slow anyway",
                     cost, cfg.budget_s - elapsed_s)
    return Step("grammar", float(GRAMMAR_USES), n, "follow-up",
                f"your users send JSON schemas: {GRAMMAR_GROUPS} fresh schemas, each used {GRAMMAR_USES} times one at a "
                "time, test whether each schema's first use waits for its grammar to compile (repeats as fast as "
                "plain requests: the server caches grammars)")


def lora_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float, leading: str | None) -> Step | str | None:
    """The LoRA follow-up when the users ask for two or more adapters (``--workload lora=A+B``): the
    same load asking for one of them (the control), then for all of them, so TTFT shows what waiting
    for an adapter slot (and its load) costs; its next step; why it did not fit the budget; or None
    (not said, or ran already)."""
    n_adapters = len(cfg.users_lora)
    ran = {p.value for p in points if p.kind == "lora"}
    if n_adapters < 2 or float(n_adapters) in ran:
        return None
    base = next((p for p in points if p.kind == "baseline" and p.ok), None)
    if base is None:
        return None
    c = min(LORA_CONCURRENCY, cfg.max_concurrency)
    todo = [k for k in (1.0, float(n_adapters)) if k not in ran]
    cost = len(todo) * LORA_REQUESTS * (base.e2e_p50_s or base.ttft_p50_s or 0.0) * 3.0 / c
    if not ran and cost > cfg.budget_s - elapsed_s:
        return unfit("lora", "requests waiting for a LoRA adapter slot from a server that is slow anyway", cost,
                     cfg.budget_s - elapsed_s)
    k = todo[0]
    what = ("one of them (the control)" if k == 1 else f"all {n_adapters} of them, one drawn per request")
    return Step("lora", k, LORA_REQUESTS, "follow-up",
                f"your users ask for {n_adapters} LoRA adapters: {LORA_REQUESTS} requests at {c} in flight asking for "
                f"{what}; TTFT with all of them against one shows whether requests wait for an adapter slot (and its load)")


__all__ = ["LONG_LEADS", "LONG_OUT_LEADS", "MIXED_REQUESTS", "PREFIX_GROUPS", "PROMPT_WORK_LEADS", "UNFIT", "followup_reading",
           "long_output_reading", "long_output_tokens", "long_ramp_reading", "lora_reading", "mixed_long_prompt",
           "mixed_reading", "structured_reading",
           "prompt_work_leads", "unfit"]
