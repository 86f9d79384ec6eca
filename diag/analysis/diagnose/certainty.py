"""Whether ``ttft diagnose``'s verdict is confident, and when it is not, why and what would decide.

Issue 14 asks for a confident verdict (confidence >= :data:`CONFIDENT`) or
an honest "not yet" with the next experiment. A verdict under the bar is the leading candidate,
not a verdict to act on alone; :func:`certainty_of` reads from the verdict itself what keeps its
confidence down (evidence seen from the client only, a finding conditional on the users' prompts,
thresholds crossed narrowly, few requests, a runner-up nearly as likely, a design cut short by the
budget) and names, for each, the experiment or option that would decide. Pure functions over a
:class:`rules.Diagnosis`, any thread.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from diag.analysis.diagnose.followups import UNFIT
from diag.analysis.report.cells import evidence_cells
from rules import INCONCLUSIVE, OUTCOMES, Diagnosis, Finding
from rules.verdict import VERDICT_FLOOR
from rules.base import check_strength

#: The confidence at which a cause is the verdict (``[general] verdict_floor``, rules.verdict); the plan stops on it too.
CONFIDENT = VERDICT_FLOOR
#: A crossed check at or under this strength crossed narrowly (0.5 at its threshold, 1.0 at 2x).
NARROW_STRENGTH = 0.75
#: A runner-up at or above this share of the verdict's confidence is nearly as likely.
RUNNER_UP_SHARE = 0.8

#: the experiments, worded once
JOIN = ("join the server's own view: run it under `ttft instrument` (or send its OTLP spans to `ttft receive`) and "
        "rerun with `--join SERVER_CAPTURE`; its queue, prefill and step spans split what the client sees as one")
SCRAPE = ("rerun with `--metrics URL` (the engine's /metrics): its own TTFT and ITL, queue depth, running requests, "
          "KV usage")
WORKLOAD = ("rerun with `--workload prompt_tokens=MIN-MAX,shared_prefix=N` (your users' lengths): the finding is then "
            "judged for your prompts, not for ttft diagnose's own test")
LONGER = "a longer `--budget` (or a higher `--max-requests`): more requests per step, and the design run to its end"
SLO = "give `--slo ttft_p99=...,tpot_p99=...`: healthy is then judged against your targets, not against the rules' defaults"


@dataclass(frozen=True)
class Certainty:
    """How sure the verdict is. ``why_not`` and ``decide`` are empty when it is confident;
    otherwise what keeps the confidence down and, first, the experiment most likely to decide."""

    category: str
    confidence: float
    confident: bool
    why_not: list[str] = field(default_factory=list)
    decide: list[str] = field(default_factory=list)
    #: the verdict's category when ``category`` is a leading candidate under the floor (healthy or
    #: inconclusive, rules.verdict); None when ``category`` is the verdict
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "threshold": CONFIDENT}

    def lines(self) -> list[str]:
        """The text ``ttft diagnose`` prints under the run's timing."""
        if self.confident:
            return [f"verdict confident: {self.category} ({self.confidence:.2f} >= {CONFIDENT:g})"]
        how = (f"{self.confidence:.2f} < {CONFIDENT:g}" if self.confidence < CONFIDENT
               else f"{self.confidence:.2f}, but the design did not run to its end")
        out = [f"verdict not confident: {self.category} ({how}) is the leading candidate, not a verdict to act on alone"
               + (f"; the verdict is {self.verdict}" if self.verdict else "")]
        out.extend(f"  why: {w}" for w in self.why_not)
        out.extend(f"  to decide: {d}" for d in self.decide)
        return out


def _narrowest(f: Finding) -> tuple[float, str] | None:
    """The mean strength of the finding's crossed numeric checks, and its weakest one as text."""
    rows = [e for e in f.evidence if e.crossed and isinstance(e.value, (int, float)) and isinstance(e.threshold, (int, float))]
    if not rows:
        return None
    scored = [(check_strength(e.value, e.threshold, e.op, e.unit), e) for e in rows]
    mean = sum(s for s, _ in scored) / len(scored)
    c = evidence_cells(min(scored, key=lambda x: x[0])[1])
    return mean, f"{c.name} {c.value}, threshold {c.threshold}"


def certainty_of(d: Diagnosis, stopped: str = "", scraped: bool = False, min_requests: int = 20) -> Certainty:
    """Read the verdict of ``d``: confident or not, and if not, why and what would decide.

    ``stopped`` is the run's stop reason (a spent budget or request cap means the design was cut
    short); ``scraped`` whether the engine's metrics are in the capture already; ``min_requests``
    the rules' ``[general] min_requests`` (below it, confidence shrinks with the sample)."""
    v = d.leading if d.leading is not None else d.verdict
    under = d.verdict.category if d.leading is not None else None
    conf = float(v.confidence)
    # a follow-up designed to tell the leading candidates apart did not run: its reading is missing
    unfit = UNFIT in stopped
    if under is None and v.category not in OUTCOMES and conf >= CONFIDENT and not unfit:
        return Certainty(v.category, conf, True)
    why: list[str] = []
    decide: list[str] = []

    def want(x: str) -> None:
        if x not in decide:
            decide.append(x)

    if v.category == INCONCLUSIVE:
        why.append("the evidence that would say why TTFT is high is missing")
        for c in v.next_checks[:2]:
            want(c)
    if v.conditional:
        why.append("the finding holds only if your users' prompts have what ttft diagnose's own test had")
        want(WORKLOAD)
    if v.black_box:
        why.append("seen from the client only: causes inside the server that look the same from outside are not "
                   "ruled out (the verdict's note says which)")
        want(JOIN)
        if not scraped:
            want(SCRAPE)
    narrow = _narrowest(v)
    if narrow is not None and narrow[0] <= NARROW_STRENGTH:
        why.append(f"its evidence crosses the thresholds narrowly (weakest: {narrow[1]})")
    n = d.features.value("requests_n")
    if n is not None and n < min_requests:
        why.append(f"only {n:g} requests completed (the rules want {min_requests})")
        want(LONGER)
    runner = next((f for f in d.findings if f is not v and f.confidence >= RUNNER_UP_SHARE * conf
                   and f.explained_s is not None), None)
    if runner is not None and v.category != INCONCLUSIVE:
        why.append(f"{runner.category} is nearly as likely ({runner.confidence:.2f}): {runner.title}")
        if runner.next_checks:
            want(f"to tell it from {runner.category}: {runner.next_checks[0]}")
    if "budget is spent" in stopped or "request cap" in stopped or unfit:
        why.append(f"the design was cut short: {stopped}")
        want(LONGER)
    if v.category == "healthy":
        why.append("no rule fired, but nothing the users were promised was given to judge against")
        want(SLO)
    if not why:
        why.append("the evidence points one way but is not strong enough to stand alone")
    if not decide:
        decide.extend(v.next_checks[:1] or [LONGER])
    return Certainty(v.category, conf, False, why, decide, under)


__all__ = ["CONFIDENT", "Certainty", "certainty_of"]
