"""Designed follow-ups of ``ttft diagnose``: experiments run after the ladder and the ramp, only
where they decide between the leading candidates. Pure; no I/O.

- ``prefix`` (when prompt work leads: ``prefill_compute``): a repeated shared prefix, one request
  at a time, in groups of a fresh prefix used :data:`~diag.diagnose.design.PREFIX_REPEATS` times
  and a control without it (the probe's ``--shared-prefix N:R`` design, read by the
  ``prefix_cache`` rule). Repeats as slow as a first use: the server prefills the prefix every
  time, and a prefix cache would spare it; repeats as fast as the control: it reuses the prefix.
  The prefix is as long as the ladder's longest rung that was answered, less the suffix.
"""

from __future__ import annotations

from collections.abc import Sequence

from diag.diagnose.design import PREFIX_REPEATS, PlanConfig, Step
from diag.diagnose.points import Point
from diag.units import fmt_s

#: prefix groups the follow-up sends (each: PREFIX_REPEATS uses and a control)
PREFIX_GROUPS = 3
#: the leading categories a prefix follow-up can decide: prompt work, which a cache hit would skip
PREFIX_LEADS = frozenset({"prefill_compute"})


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


__all__ = ["PREFIX_GROUPS", "followup_reading"]
