"""The load ramp of ``ttft diagnose``: concurrency doubling from the lone request (closed loop),
or open-loop rates from half the lone request's service rate, until TTFT or per-stream decode
breaks (twice the rules' thresholds: their evidence is at full strength there), a knee shows
(the rules' own), requests fail, the SLO is crossed or the cap is reached; at least
:data:`RAMP_MIN_LEVELS` levels, and then the levels a timing break skipped. Pure; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from diag.analysis.diagnose.design import PlanConfig, Step, base_point, ratio
from diag.analysis.diagnose.points import Point
from diag.ground.units import fmt_s

#: Fewest ramp levels (the lone request included) before a break ends the ramp: the rules'
#: concurrency curve needs three to tell a rise from the start from a knee.
RAMP_MIN_LEVELS = 3

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


def ramp_break(cfg: PlanConfig, base: Point, p: Point, earlier: Sequence[Point] = (), decode: bool = True) -> str | None:
    """Why the ramp has seen enough at ``p`` (None: go on); ``earlier`` are the levels below it, in
    order. A knee is the rules' own: one step steeper than every step before it by
    ``knee_sharpness`` and at least ``knee_jump_min``, after TTFT stayed within ``flat_factor``.
    ``decode=False``: slower decode does not end it (the long ramp looks for TTFT's knee only)."""
    prev = earlier[-1] if earlier else None
    where = f"{p.kind}={p.value:g}"
    if p.error_frac >= 0.05:
        kinds = ", ".join(f"{k} x{v}" for k, v in p.errors.items())
        return f"requests started failing at {where} ({p.error_frac:.0%}: {kinds})"
    if p.slo_met is False:
        return f"the SLO was crossed at {where}"
    if p.stop:
        return p.stop
    t = ratio(p.ttft_p50_s, base.ttft_p50_s)
    d = ratio(p.tpot_p50_s, base.tpot_p50_s)
    if t is not None and t >= cfg.ttft_break_x:
        hold = f"; per-stream decode x{1 / d:.2f} of a lone stream's" if d else ""
        return f"TTFT broke at {where}: {t:.1f}x the lone request's{hold}"
    if decode and d is not None and d >= cfg.decode_break_x:
        return f"decode broke at {where}: time per token {d:.1f}x a lone stream's"
    if prev is not None and prev.ttft_p50_s and p.ttft_p50_s:
        jump = p.ttft_p50_s / prev.ttft_p50_s
        pre = ratio(prev.ttft_p50_s, base.ttft_p50_s) or 1.0
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
    base = base_point(points)
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
        t = ratio(at.ttft_p50_s, base.ttft_p50_s) or 0.0
        d = ratio(base.tpot_p50_s, at.tpot_p50_s)
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
        t = ratio(top.ttft_p50_s, base.ttft_p50_s) or 0.0
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
        t = ratio(last.ttft_p50_s, base.ttft_p50_s) or 0.0
        d = ratio(last.tpot_p50_s, base.tpot_p50_s) or 0.0
        why = (f"{last.segment}: TTFT {t:.1f}x, time per token {d:.1f}x the lone request's: still holding, "
               f"next {nxt:g} {unit}")
    return Step(kind, nxt, _ramp_requests(cfg, kind, nxt), "ramp", why), ""


__all__ = ["RAMP_MIN_LEVELS", "ramp_break", "ramp_reading"]
