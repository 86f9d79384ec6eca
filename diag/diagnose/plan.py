"""The adaptive plan of ``ttft diagnose``: which step comes next, and why, from what the
previous steps showed. Pure functions over :class:`~diag.diagnose.points.Point` s (no I/O), so
the choice can be tested on recorded results.

The design (issue 14): a lone-request baseline at concurrency 1 on short prompts; a prompt
ladder at concurrency 1 (doubling lengths, stopping below the context limit, when the fit of
TTFT on prompt tokens is clear, or when a rung would cost too much of the budget); a
concurrency ramp (or an open-loop rate ramp) until TTFT or per-stream decode speed breaks,
requests fail, the SLO is crossed or the cap is reached; then, when the break skipped levels,
the levels in between. The break lines are the rule thresholds' own (``rules/defaults.toml``):
the ramp stops where the rules' evidence is at full strength (twice their threshold), since
more load then adds harm and no evidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diag.diagnose.points import Point
from diag.scenarios.catalog import ProbeStep
from diag.units import fmt_s
from rules import OUTCOMES, default_thresholds
from rules.features.numeric import linear_fit

#: Share of the budget the prompt ladder may use before the ramp (the ramp needs the rest).
LADDER_BUDGET_SHARE = 0.45
#: Most rungs in the ladder, and the fewest before it may be judged (the prompt fit needs 3
#: distinct lengths besides the baseline's to be more than a line through two points).
LADDER_MAX_RUNGS = 6
LADDER_MIN_RUNGS = 3
#: Fewest ramp levels (the lone request included) before a break ends the ramp: the rules'
#: concurrency curve needs three to tell a rise from the start from a knee.
RAMP_MIN_LEVELS = 3
#: A step whose failed share reaches this is an error burst: stop probing, spare the server.
ERROR_BURST_FRAC = 0.5
#: A lone request slower than this is not sent again at a longer prompt (never harm).
RUNG_TTFT_MAX_S = 10.0
#: The confidence at which the verdict ends the run (issue 14).
CONFIDENT = 0.7


@dataclass(frozen=True)
class PlanConfig:
    """What the plan works within. Lengths in tokens; ``budget_s`` of probing; ``ramp`` is
    ``"concurrency"`` (closed loop) or ``"rate"`` (open loop, capped at ``max_concurrency``)."""

    input_tokens: int = 64
    output_tokens: int = 32
    max_concurrency: int = 32
    max_prompt_tokens: int = 4096
    context_limit_tokens: int | None = None
    budget_s: float = 120.0
    max_requests: int = 1000
    ramp: str = "concurrency"
    baseline_requests: int = 8
    rung_requests: int = 4
    thresholds: Mapping[str, Any] = field(default_factory=default_thresholds)

    def __post_init__(self) -> None:
        if self.ramp not in ("concurrency", "rate"):
            raise ValueError(f"unknown ramp {self.ramp!r}: expected concurrency or rate")
        for name in ("input_tokens", "output_tokens", "max_concurrency", "max_prompt_tokens", "max_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.budget_s <= 0:
            raise ValueError("budget must be > 0 s")

    # the break lines, from the rules' thresholds (full strength = twice the threshold)
    @property
    def ttft_break_x(self) -> float:
        """TTFT at a level / the lone request's, at which the ramp has seen enough."""
        return 2.0 * float(self.thresholds["queue"]["bb_ttft_rise_min"])

    @property
    def decode_break_x(self) -> float:
        """Per-stream time per token at a level / the lone stream's, at which decode broke."""
        return 1.0 / float(self.thresholds["decode"]["decode_hold_max"])

    @property
    def knee_x(self) -> float:
        return float(self.thresholds["kv_cache"]["knee_jump_min"])

    @property
    def flat_x(self) -> float:
        return float(self.thresholds["features"]["flat_factor"])

    @property
    def prompt_limit_tokens(self) -> int:
        """The longest prompt the ladder may send: below the context limit, room for the output."""
        top = self.max_prompt_tokens
        if self.context_limit_tokens:
            top = min(top, self.context_limit_tokens - self.output_tokens - 8)
        return top


@dataclass(frozen=True)
class Step:
    """One step to run: ``kind`` as :data:`diag.diagnose.points.KINDS`, ``value`` the prompt
    length, concurrency or rate, ``stage`` the part of the design, ``reason`` the printed why."""

    kind: str
    value: float
    requests: int
    stage: str
    reason: str

    def probe_step(self, cfg: PlanConfig) -> ProbeStep:
        """The step as a catalog :class:`ProbeStep`, run through the scenario runner's translation
        (:func:`diag.scenarios.runner.step_chunks`), as the demo's phases are."""
        out = f"fixed:{cfg.output_tokens}"
        inp = f"fixed:{cfg.input_tokens}"
        if self.kind == "baseline":
            return ProbeStep(concurrency=1, requests=self.requests, input_tokens=inp, output_tokens=out,
                             segment=segment_of(self.kind, self.value))
        return ProbeStep(sweep=self.kind, sweep_values=(self.value,), requests_per_point=self.requests,
                         input_tokens=inp, output_tokens=out)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "requests": self.requests, "stage": self.stage,
                "reason": self.reason}


def segment_of(kind: str, value: float) -> str:
    """The capture segment of a step: the baseline is the ramp's first level (``concurrency=1``),
    so the rules see it as a point of the concurrency curve; the others as ``ttft probe --sweep``
    labels them."""
    return "concurrency=1" if kind == "baseline" else f"{kind}={value:g}"


@dataclass(frozen=True)
class Decision:
    """The plan's answer: the next step, or None with ``done`` saying why the design ended."""

    step: Step | None
    done: str | None = None
    learned: dict[str, Any] = field(default_factory=dict)


# --- readings -------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


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


def _base(points: Sequence[Point]) -> Point | None:
    return next((p for p in points if p.kind == "baseline"), None)


def _tokens(p: Point, cfg: PlanConfig) -> float:
    return p.input_tokens_mean or (p.value if p.kind == "prompt" else float(cfg.input_tokens))


def _steps_of(p: Point) -> str:
    n = _ratio(p.ttft_p50_s, p.itl_p50_s)
    return f" = {n:.1f} decode steps" if n is not None else ""


def ladder_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float) -> tuple[int | None, str, dict[str, Any]]:
    """(next prompt length or None when the ladder is done, why, what was learned)."""
    base = _base(points)
    assert base is not None
    rungs = [p for p in points if p.kind == "prompt"]
    learned: dict[str, Any] = {}
    last = rungs[-1] if rungs else base
    if rungs and last.refused_4xx:
        learned["context_limit_tokens"] = int(last.value)
        ok = [p for p in rungs if not p.refused_4xx]
        top = int(ok[-1].value) if ok else cfg.input_tokens
        return None, (f"prompt={last.value:g} was refused ({last.error_example or 'HTTP 4xx'}): the server's limit is "
                      f"below {last.value:g} tokens, the ladder stops at {top}"), learned
    if rungs and last.ok == 0:
        return None, f"every request at prompt={last.value:g} failed ({', '.join(last.errors) or 'error'})", learned
    fit = prompt_fit(points)
    growth = _ratio(last.ttft_p50_s, base.ttft_p50_s)
    span = _tokens(last, cfg) / max(_tokens(base, cfg), 1.0)
    if fit is not None and len(rungs) >= LADDER_MIN_RUNGS:
        slope, intercept, r2 = fit
        r2_min = float(cfg.thresholds["prefill_compute"]["r2_min"])
        if growth is not None and growth >= cfg.ttft_break_x and r2 >= r2_min:
            return None, (f"TTFT grows with the prompt: {growth:.1f}x from {_tokens(base, cfg):.0f} to "
                          f"{_tokens(last, cfg):.0f} tokens, {slope * 1e3:.3g} ms/token + {intercept * 1e3:.3g} ms "
                          f"fixed (R² {r2:.2f}): the per-token cost is measured"), learned
        if growth is not None and growth < cfg.flat_x and span >= 8:
            return None, (f"TTFT hardly grows with the prompt ({growth:.2f}x over {span:.0f}x the tokens): the "
                          f"fixed part dominates ({fmt_s(base.ttft_p50_s)}{_steps_of(base)})"), learned
    if len(rungs) >= LADDER_MAX_RUNGS:
        return None, f"{len(rungs)} rungs ran (TTFT {growth or 0:.1f}x over {span:.0f}x the tokens)", learned
    prev_len = last.value if rungs else float(cfg.input_tokens)
    nxt = int(2 * prev_len)
    limit = cfg.prompt_limit_tokens
    if nxt > limit:
        if limit <= prev_len * 1.25:
            where = (f"the context limit ({cfg.context_limit_tokens} tokens)" if cfg.context_limit_tokens
                     and limit < cfg.max_prompt_tokens else f"--max-prompt {cfg.max_prompt_tokens}")
            return None, f"the next length would pass {where}: the ladder ends at {prev_len:g}", learned
        nxt = limit
    if (last.ttft_p50_s or 0.0) >= RUNG_TTFT_MAX_S:
        return None, f"a lone request at {last.value:g} tokens already takes {fmt_s(last.ttft_p50_s)}", learned
    cost = cfg.rung_requests * ((last.ttft_p50_s or 0.0) * nxt / max(_tokens(last, cfg), 1.0) + (last.service_s or 0.0))
    if elapsed_s + cost > LADDER_BUDGET_SHARE * cfg.budget_s and len(rungs) >= 2:
        return None, (f"the next rung ({nxt} tokens) would take ~{cost:.0f} s: the ramp needs the rest of the "
                      f"{cfg.budget_s:.0f} s budget"), learned
    if not rungs:
        why = (f"a lone request takes {fmt_s(base.ttft_p50_s)} to its first token{_steps_of(base)}; climbing prompt "
               f"lengths at concurrency 1 splits TTFT into a fixed part and a per-token part (prefill, tokenizer)")
    else:
        why = (f"prompt={last.value:g}: TTFT {fmt_s(last.ttft_p50_s)} ({growth or 0:.1f}x the "
               f"{_tokens(base, cfg):.0f}-token baseline); next rung {nxt} tokens")
    return nxt, why, learned


def _ramp_levels(cfg: PlanConfig, base: Point) -> list[float]:
    if cfg.ramp == "concurrency":
        out, c = [], 2
        while c <= cfg.max_concurrency:
            out.append(float(c))
            c *= 2
        if out and out[-1] < cfg.max_concurrency:
            out.append(float(cfg.max_concurrency))
        return out
    # open loop: rates from the lone request's service rate (1 / e2e), halved, then doubling
    e2e = base.e2e_p50_s or base.ttft_p50_s or 1.0
    mu = 1.0 / max(e2e, 1e-3)
    top = mu * cfg.max_concurrency
    rates, r = [], mu / 2
    while r <= top and len(rates) < 8:
        rates.append(float(f"{r:.3g}"))
        r *= 2
    return rates


def _ramp_requests(cfg: PlanConfig, kind: str, value: float) -> int:
    if kind == "concurrency":
        return max(8, 2 * int(value))
    return max(12, min(200, int(round(value * 3.0))))  # ~3 s of arrivals


def ramp_break(cfg: PlanConfig, base: Point, p: Point, earlier: Sequence[Point] = ()) -> str | None:
    """Why the ramp has seen enough at ``p`` (None: go on); ``earlier`` are the levels below it, in
    order. A knee is the rules' own: one step steeper than every step before it by
    ``knee_sharpness`` and at least ``knee_jump_min``, after TTFT stayed within ``flat_factor``."""
    prev = earlier[-1] if earlier else None
    where = f"{p.kind}={p.value:g}"
    if p.error_frac >= 0.05:
        kinds = ", ".join(f"{k} x{v}" for k, v in p.errors.items())
        return f"requests started failing at {where} ({p.error_frac:.0%}: {kinds})"
    if p.slo_met is False:
        return f"the SLO was crossed at {where}"
    if p.stop:
        return p.stop
    t = _ratio(p.ttft_p50_s, base.ttft_p50_s)
    d = _ratio(p.tpot_p50_s, base.tpot_p50_s)
    if t is not None and t >= cfg.ttft_break_x:
        hold = f"; per-stream decode x{1 / d:.2f} of a lone stream's" if d else ""
        return f"TTFT broke at {where}: {t:.1f}x the lone request's{hold}"
    if d is not None and d >= cfg.decode_break_x:
        return f"decode broke at {where}: time per token {d:.1f}x a lone stream's"
    if prev is not None and prev.ttft_p50_s and p.ttft_p50_s:
        jump = p.ttft_p50_s / prev.ttft_p50_s
        pre = _ratio(prev.ttft_p50_s, base.ttft_p50_s) or 1.0
        ys = [q.ttft_p50_s for q in earlier if q.ttft_p50_s]
        steepest = max([b / a for a, b in zip(ys, ys[1:]) if a > 0] + [1.0])
        sharp = float(cfg.thresholds["features"]["knee_sharpness"])
        if jump >= cfg.knee_x and pre <= cfg.flat_x and jump >= sharp * steepest:
            return f"a knee: TTFT flat to {prev.kind}={prev.value:g} ({pre:.1f}x), then x{jump:.1f} at {where}"
    return None


def _between(lo: float, hi: float, kind: str) -> list[float]:
    """Up to two levels strictly between ``lo`` and ``hi`` (whole numbers for concurrency)."""
    if kind == "concurrency":
        inner = list(range(int(lo) + 1, int(hi)))
        if len(inner) <= 2:
            return [float(v) for v in inner]
        return sorted({float(round(lo + (hi - lo) / 3)), float(round(lo + 2 * (hi - lo) / 3))})
    return [float(f"{lo * (hi / lo) ** (1 / 3):.3g}"), float(f"{lo * (hi / lo) ** (2 / 3):.3g}")]


def _ramp_cost(cfg: PlanConfig, kind: str, value: float, levels: Sequence[Point]) -> float:
    """Seconds a ramp level is expected to take, from the levels run so far."""
    n = _ramp_requests(cfg, kind, value)
    last = levels[-1]
    if kind == "rate":
        return n / value + (last.e2e_p50_s or 0.0) * 2
    e2e = last.e2e_p50_s or 0.0
    if len(levels) >= 2 and levels[-2].e2e_p50_s and e2e and levels[-1].value > levels[-2].value:
        g = math.log(e2e / levels[-2].e2e_p50_s) / math.log(levels[-1].value / levels[-2].value)
        e2e *= (value / last.value) ** min(max(g, 0.0), 1.0)
    return n / value * e2e


def ramp_reading(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float, confident: bool) -> tuple[Step | None, str]:
    """The next ramp (or refinement) step, or None with why the ramp is done."""
    base = _base(points)
    assert base is not None
    kind = cfg.ramp
    plan = _ramp_levels(cfg, base)
    ran = [p for p in points if p.kind == kind]
    # the planned levels in the order they ran; a closed-loop ramp starts at the baseline (c=1)
    chain = ([base] if kind == "concurrency" else []) + [p for p in ran if any(abs(p.value - v) < 1e-9 for v in plan)]
    broke: tuple[Point, Point | None, str] | None = None
    for i, p in enumerate(chain):
        if p is base:
            continue
        prev = chain[i - 1] if i else None
        why = ramp_break(cfg, base, p, chain[:i])
        if why:
            broke = (p, prev, why)
            break
    remaining = cfg.budget_s - elapsed_s
    unit = "in flight" if kind == "concurrency" else "requests/s"
    if broke is not None:
        at, prev, why = broke
        if confident or prev is None or at.failed or at.slo_met is False or at.stop:
            return None, why  # failures and a crossed SLO end the ramp; the timing breaks are refined
        upto = [p for p in chain if p.value <= at.value]
        above = [v for v in plan if v > at.value]
        if len(upto) < RAMP_MIN_LEVELS and above \
                and not any(p.value > at.value for p in chain):
            v = above[0]
            cost = _ramp_cost(cfg, kind, v, chain)
            if cost <= remaining:
                return (Step(kind, v, _ramp_requests(cfg, kind, v), "ramp",
                             f"{why}; one more level ({v:g} {unit}): {RAMP_MIN_LEVELS} levels tell TTFT rising from "
                             "the lowest level (serialisation) from a knee past a limit"), "")
        todo = [v for v in _between(prev.value, at.value, kind) if not any(abs(p.value - v) < 1e-9 for p in ran)]
        if not todo:
            return None, why
        v = todo[0]
        below = [p for p in chain if p.value < at.value] or chain
        cost = _ramp_cost(cfg, kind, v, below)
        if cost > remaining:
            return None, f"{why}; the levels between would take ~{cost:.0f} s of the {remaining:.0f} s left"
        t = _ratio(at.ttft_p50_s, base.ttft_p50_s) or 0.0
        d = _ratio(base.tpot_p50_s, at.tpot_p50_s)
        if d is not None and d >= float(cfg.thresholds["queue"]["bb_decode_hold_min"]):
            test, held = "serialisation", f"while decode speed held (x{d:.2f})"
        else:
            test, held = "where capacity runs out", f"and per-stream decode fell to x{d or 0:.2f}"
        vals = " and ".join(f"{x:g}" for x in todo)
        return (Step(kind, v, _ramp_requests(cfg, kind, v), "refine",
                     f"TTFT grew {t:.1f}x from {prev.value:g} to {at.value:g} {unit} {held}: testing {test} at "
                     f"{vals}"), "")
    nxt = next((v for v in plan if not any(abs(p.value - v) < 1e-9 for p in ran)), None)
    if nxt is None:
        top = chain[-1] if chain else base
        t = _ratio(top.ttft_p50_s, base.ttft_p50_s) or 0.0
        return None, (f"the server held up to {top.segment} (the cap): TTFT {t:.1f}x the lone request's, "
                      "nothing broke")
    cost = _ramp_cost(cfg, kind, nxt, chain or [base])
    if cost > remaining:
        return None, f"the next level ({kind}={nxt:g}) would take ~{cost:.0f} s of the {remaining:.0f} s left"
    last = chain[-1] if chain else base
    if last is base:
        why = (f"lone request: TTFT {fmt_s(base.ttft_p50_s)}, ITL {fmt_s(base.itl_p50_s)}; ramping "
               f"{'concurrency' if kind == 'concurrency' else 'the open-loop rate'} until TTFT or ITL breaks, a "
               "knee shows, requests fail or the SLO is crossed")
    else:
        t = _ratio(last.ttft_p50_s, base.ttft_p50_s) or 0.0
        d = _ratio(last.tpot_p50_s, base.tpot_p50_s) or 0.0
        why = (f"{last.segment}: TTFT {t:.1f}x, time per token {d:.1f}x the lone request's: still holding, "
               f"next {nxt:g} {unit}")
    return Step(kind, nxt, _ramp_requests(cfg, kind, nxt), "ramp", why), ""


def next_step(cfg: PlanConfig, points: Sequence[Point], elapsed_s: float = 0.0, confident: bool = False,
              requests_sent: int = 0) -> Decision:
    """The next step from what ran (in order), the probing time spent, whether the running
    verdict is already confident, and how many requests were sent."""
    base = _base(points)
    if base is None:
        return Decision(Step("baseline", 1.0, cfg.baseline_requests, "baseline",
                             f"a lone-request baseline: TTFT and ITL at concurrency 1 on {cfg.input_tokens}-token "
                             "prompts, what every later step is measured against"))
    if base.ok == 0:
        kinds = ", ".join(f"{k} x{v}" for k, v in base.errors.items()) or "no answer"
        return Decision(None, f"every lone request failed ({kinds}{': ' + base.error_example if base.error_example else ''})")
    last = points[-1]
    refused_rung = last.kind == "prompt" and set(last.errors) == {"http_4xx"}  # the context limit, not harm
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
    return Decision(None, why, learned)


def confident_stop(category: str, confidence: float, points: Sequence[Point], cfg: PlanConfig) -> str | None:
    """Why the running verdict ends the run (None: go on). ``inconclusive``, ``failures`` and
    ``no_data`` never do, nor ``healthy``: the evidence that could show a problem (the ladder and
    the ramp to its break or cap) must all be there, so a healthy run ends when the design has run."""
    if category in OUTCOMES or confidence < CONFIDENT:
        return None
    if category == "healthy":  # only once the whole design ran: the plan ends the run then
        return None
    return f"the verdict is confident: {category} ({confidence:.2f} >= {CONFIDENT:g})"


__all__ = ["CONFIDENT", "Decision", "PlanConfig", "Step", "confident_stop", "ladder_reading", "next_step",
           "prompt_fit", "ramp_break", "ramp_reading", "segment_of"]
