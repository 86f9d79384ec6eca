"""The prompt ladder of ``ttft diagnose``: prompt lengths doubling at concurrency 1 from the
baseline's, to split TTFT into a fixed part and a per-token part (prefill, tokenizer). Below the
server's context limit (from ``/v1/models``, or the first length answered with a 4xx); when the
limit leaves no room for the three lengths a fit needs (the users' prompts near the context), the
rungs halve from the baseline's instead, down to :data:`LADDER_MIN_TOKENS`. It ends
once the fit of TTFT on prompt tokens is clear (growth past the ramp's break line with the
prefill rule's R²) or TTFT is flat over a wide span, when a rung would eat the ramp's share of
the budget, or after :data:`LADDER_MAX_RUNGS`. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from diag.analysis.diagnose.design import PlanConfig, base_point, ratio, steps_of, tokens_of
from diag.analysis.diagnose.points import Point
from diag.ground.units import fmt_s
from rules.features.numeric import linear_fit

#: Share of the budget the prompt ladder may use before the ramp (the ramp needs the rest).
LADDER_BUDGET_SHARE = 0.45
#: Most rungs in the ladder, and the fewest before it may be judged (the prompt fit needs 3
#: distinct lengths besides the baseline's to be more than a line through two points).
LADDER_MAX_RUNGS = 6
LADDER_MIN_RUNGS = 3
#: Span of prompt lengths (top rung / the baseline's) past which a line that fits ends the
#: ladder: the per-token cost and the fixed part are both determined, and longer prompts would
#: only add requests unlike the user's workload to the capture (its TTFT tail would be theirs).
LADDER_SPAN = 8.0
#: A lone request slower than this is not sent again at a longer prompt (never harm).
RUNG_TTFT_MAX_S = 10.0
#: The shortest rung of a ladder that steps down from the baseline (tokens).
LADDER_MIN_TOKENS = 32

def prompt_fit(points: Sequence[Point]) -> tuple[float, float, float] | None:
    """(slope s/token, intercept s, R²) of median TTFT on prompt tokens over the baseline and the
    rungs; None with fewer than 3 distinct lengths."""
    xs, ys = [], []
    for p in points:
        if p.kind in ("baseline", "prompt") and p.ttft_p50_s is not None:
            xs.append(p.input_tokens_mean or (p.value if p.kind == "prompt" else None))
            ys.append(p.ttft_p50_s)
    pairs = [(x, y) for x, y in zip(xs, ys) if x]
    if len({round(x) for x, _ in pairs}) < 3:
        return None
    x = np.array([a for a, _ in pairs], dtype="float64")
    y = np.array([b for _, b in pairs], dtype="float64")
    return linear_fit(x, y)


def ladder_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float) -> tuple[int | None, str, dict[str, Any]]:
    """(next prompt length or None when the ladder is done, why, what was learned)."""
    base = base_point(points)
    assert base is not None
    rungs = [p for p in points if p.kind == "prompt"]
    learned: dict[str, Any] = {}
    last = rungs[-1] if rungs else base
    if rungs and last.refused_too_long:
        learned["context_limit_tokens"] = int(last.value)
        ok = [p for p in rungs if not p.refused_too_long]
        top = int(ok[-1].value) if ok else cfg.input_tokens
        return None, (f"prompt={last.value:g} was refused as longer than the server's context "
                      f"({last.error_example or 'HTTP 4xx'}): its limit is below {last.value:g} tokens, the ladder "
                      f"stops at {top}"), learned
    if rungs and last.ok == 0:
        return None, f"every request at prompt={last.value:g} failed ({', '.join(last.errors) or 'error'})", learned
    fit = prompt_fit(points)
    # the longest and the shortest length answered, as designed (requested lengths: the server's
    # token counts run a little short); the baseline's is the users' prompt
    answered = [(float(cfg.input_tokens), base)] + [(p.value, p) for p in rungs if p.ok]
    (lo_len, lo), (hi_len, hi) = min(answered, key=lambda a: a[0]), max(answered, key=lambda a: a[0])
    growth = ratio(hi.ttft_p50_s, lo.ttft_p50_s)
    span = hi_len / lo_len
    if fit is not None and len(rungs) >= LADDER_MIN_RUNGS:
        slope, intercept, r2 = fit
        r2_min = float(cfg.thresholds["prefill_compute"]["r2_min"])
        if growth is not None and growth < cfg.flat_x and span >= LADDER_SPAN:
            return None, (f"TTFT hardly grows with the prompt ({growth:.2f}x over {span:.0f}x the tokens): the "
                          f"fixed part dominates ({fmt_s(base.ttft_p50_s)}{steps_of(base)})"), learned
        if growth is not None and r2 >= r2_min and (growth >= cfg.ttft_break_x or span >= LADDER_SPAN):
            fixed = max(intercept, 0.0) / base.ttft_p50_s if base.ttft_p50_s else 0.0
            return None, (f"TTFT {growth:.1f}x from {tokens_of(lo, cfg):.0f} to {tokens_of(hi, cfg):.0f} tokens: "
                          f"{slope * 1e3:.3g} ms/token + {intercept * 1e3:.3g} ms fixed (R² {r2:.2f}; the fixed part "
                          f"is {fixed:.0%} of the baseline's TTFT): the per-token cost and the fixed part are "
                          "measured"), learned
    if len(rungs) >= LADDER_MAX_RUNGS:
        return None, f"{len(rungs)} rungs ran (TTFT {growth or 0:.1f}x over {span:.0f}x the tokens)", learned
    down = any(p.value < cfg.input_tokens for p in rungs)  # stepping down from the baseline already
    prev_len = last.value if rungs else float(cfg.step_base_tokens)
    nxt = int(lo_len // 2) if down else int(2 * prev_len)
    limit = cfg.prompt_limit_tokens
    if not down and nxt > limit:
        if limit <= prev_len * 1.25:
            where = (f"the context limit ({cfg.context_limit_tokens} tokens)" if cfg.context_limit_tokens
                     and limit < cfg.max_prompt_tokens else f"--max-prompt {cfg.max_prompt_tokens}")
            if len({round(a) for a, _ in answered}) >= 3 or lo_len // 2 < LADDER_MIN_TOKENS:
                return None, f"the next length would pass {where}: the ladder ends at {prev_len:g}", learned
            nxt, down = int(lo_len // 2), True  # too few lengths for a fit: step down from the baseline
        else:
            nxt = limit
    if down and nxt < LADDER_MIN_TOKENS:
        return None, f"the ladder stepped down to {lo_len:g} tokens (the next would be under {LADDER_MIN_TOKENS})", learned
    if (last.ttft_p50_s or 0.0) >= RUNG_TTFT_MAX_S:
        return None, f"a lone request at {last.value:g} tokens already takes {fmt_s(last.ttft_p50_s)}", learned
    cost = cfg.rung_requests * ((last.ttft_p50_s or 0.0) * nxt / max(tokens_of(last, cfg), 1.0) + (last.service_s or 0.0))
    if elapsed_s + cost > LADDER_BUDGET_SHARE * cfg.budget_s and len(rungs) >= 2:
        return None, (f"the next rung ({nxt} tokens) would take ~{cost:.0f} s: the ramp needs the rest of the "
                      f"{cfg.budget_s:.0f} s budget"), learned
    if down and not any(p.value < cfg.input_tokens for p in rungs):
        why = (f"longer prompts would pass the context limit, and a fit needs three lengths: the ladder steps down "
               f"from the {cfg.input_tokens}-token baseline; next rung {nxt} tokens")
    elif not rungs:
        why = (f"a lone request takes {fmt_s(base.ttft_p50_s)} to its first token{steps_of(base)}; climbing prompt "
               f"lengths at concurrency 1 splits TTFT into a fixed part and a per-token part (prefill, tokenizer)")
    else:
        vs_base = ratio(last.ttft_p50_s, base.ttft_p50_s) or 0.0
        why = (f"prompt={last.value:g}: TTFT {fmt_s(last.ttft_p50_s)} ({vs_base:.1f}x the "
               f"{tokens_of(base, cfg):.0f}-token baseline); next rung {nxt} tokens")
    return nxt, why, learned


__all__ = ["LADDER_BUDGET_SHARE", "LADDER_MAX_RUNGS", "LADDER_MIN_RUNGS", "LADDER_MIN_TOKENS", "LADDER_SPAN",
           "ladder_reading", "prompt_fit"]
