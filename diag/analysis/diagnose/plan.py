"""The adaptive plan of ``ttft diagnose``: which step comes next, and why, from what the
previous steps showed. Pure functions over :class:`~diag.analysis.diagnose.points.Point` s (no I/O), so
the choice can be tested on recorded results.

The design (``docs/diagnose.md``): a lone-request baseline at concurrency 1 on short prompts; the prompt
ladder (:mod:`.ladder`); the load ramp and the levels its break skipped (:mod:`.ramp`); then a
designed follow-up where it decides between the leading candidates (:mod:`.followups`). The run
ends when the design has run, the budget or the request cap is spent, requests burst into
errors, or the verdict is confident (:func:`confident_stop`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from diag.analysis.diagnose.certainty import CONFIDENT
from diag.analysis.diagnose.design import Decision, PlanConfig, Step, base_point, segment_of
from diag.analysis.diagnose.followups import (followup_reading, long_output_reading, long_ramp_reading, lora_reading,
                                    mixed_reading, structured_reading)
from diag.analysis.diagnose.ladder import ladder_reading, prompt_fit
from diag.analysis.diagnose.points import Point
from diag.analysis.diagnose.ramp import RAMP_MIN_LEVELS, ramp_break, ramp_reading
from rules import OUTCOMES

#: A step whose failed share reaches this is an error burst: stop probing, spare the server.
ERROR_BURST_FRAC = 0.5

def next_step(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float = 0.0, confident: bool = False,
              requests_sent: int = 0, leading: str | None = None) -> Decision:
    """The next step from what ran (in order), the probing time spent, whether the running
    verdict is already confident, how many requests were sent, and the running verdict's
    category (``leading``: which designed follow-up could decide it)."""
    base = base_point(points)
    if base is None:
        return Decision(Step("baseline", 1.0, cfg.baseline_requests, "baseline",
                             f"a lone-request baseline: TTFT and ITL at concurrency 1 on {cfg.input_tokens}-token "
                             "prompts, what every later step is measured against"))
    if base.ok == 0:
        kinds = ", ".join(f"{k} x{v}" for k, v in base.errors.items()) or "no answer"
        return Decision(None, f"every lone request failed ({kinds}{': ' + base.error_example if base.error_example else ''})")
    last = points[-1]
    # a rung refused as longer than the context is the experiment's limit, counted apart (not an error);
    # one refused otherwise (4xx) ends the ladder as failures, not the run: a refusal does the server no harm
    refused_rung = last.kind == "prompt" and set(last.errors) == {"http_4xx"}
    if last.error_frac >= ERROR_BURST_FRAC and not refused_rung:
        return Decision(None, f"error burst: {last.error_frac:.0%} of the requests at {last.segment} failed "
                              f"({', '.join(last.errors)}): stopped to spare the server")
    if elapsed_s >= cfg.budget_s:
        return Decision(None, f"the {cfg.budget_s:.0f} s budget is spent")
    if requests_sent >= cfg.max_requests:
        return Decision(None, f"the request cap ({cfg.max_requests}) is reached")
    learned: dict[str, Any] = {}
    ladder_open = not any(p.kind == cfg.ramp for p in points)  # the ladder runs before the ramp
    if ladder_open:
        nxt, why, learned = ladder_reading(cfg, points, elapsed_s)
        if nxt is not None:
            return Decision(Step("prompt", float(nxt), cfg.rung_requests, "ladder", why), learned=learned)
        ladder_done = why
    else:
        ladder_done = ""
    step, why = ramp_reading(cfg, points, elapsed_s, confident)
    if step is not None:
        if ladder_done and not any(p.kind == cfg.ramp for p in points):
            step = Step(step.kind, step.value, step.requests, step.stage, f"ladder done: {ladder_done}. {step.reason}")
        return Decision(step, learned=learned)
    follow = long_ramp_reading(cfg, points, elapsed_s, leading)
    if follow is not None:
        if not any(p.kind == "long" for p in points):
            follow = Step(follow.kind, follow.value, follow.requests, follow.stage, f"{why}. {follow.reason}")
        return Decision(follow, learned=learned)
    readings = [long_output_reading, mixed_reading, structured_reading, lora_reading]
    if not any(p.kind == "prefix" for p in points):
        readings.append(followup_reading)
    unfit: list[str] = []
    for reading in readings:  # the designed follow-ups, in this order; each printed after why the ramp ended
        follow = reading(cfg, points, elapsed_s, leading)
        if isinstance(follow, str):  # it applied, but the budget left was too short: the end says so
            unfit.append(follow)
        elif follow is not None:
            return Decision(replace(follow, reason=f"{why}. {follow.reason}"), learned=learned)
    return Decision(None, "; ".join([why, *unfit]), learned)


def confident_stop(category: str, confidence: float, points: Sequence[Point], cfg: PlanConfig,
                   black_box: bool = False) -> str | None:
    """Why the running verdict ends the run (None: go on). ``inconclusive``, ``failures`` and
    ``no_data`` never do, nor ``healthy``: the evidence that could show a problem (the ladder and
    the ramp to its break or cap) must all be there, so a healthy run ends when the design has run.
    Nor ``loadgen``: the client's timing is invalid, but the follow-ups read from the server's
    answers (the long ramp's streams decoding at once) can still decide the server's side.
    Nor does a verdict seen only from the client (``black_box``): what tells it from the causes
    that look the same from outside is the rest of the ramp and the follow-up designed for it (a
    queue from a KV limit, a cap from a serial stage, prefill from head-of-line blocking), so the
    plan ends that run too. Any other verdict once the ramp ran
    :data:`~diag.analysis.diagnose.ramp.RAMP_MIN_LEVELS` levels."""
    if category in OUTCOMES or category == "loadgen" or confidence < CONFIDENT:
        return None
    if category == "healthy" or black_box:  # only once the whole design ran: the plan ends the run then
        return None
    # a verdict from concurrency 1 alone cannot rule out what only load shows (a queue, a KV
    # limit, decode under batching): the ramp must have run its first levels
    levels = 1 + sum(1 for p in points if p.kind == cfg.ramp)
    if levels < RAMP_MIN_LEVELS:
        return None
    return f"the verdict is confident: {category} ({confidence:.2f} >= {CONFIDENT:g})"


__all__ = ["CONFIDENT", "Decision", "ERROR_BURST_FRAC", "PlanConfig", "Step", "confident_stop", "ladder_reading",
           "next_step", "prompt_fit", "ramp_break", "ramp_reading", "segment_of"]
