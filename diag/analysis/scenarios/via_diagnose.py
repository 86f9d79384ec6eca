"""Scenarios and random draws run through ``ttft diagnose`` instead of their fixed probes.

Each case's engine runs as the scenario (or draw) builds it, with its own capture for the
ground truth of a mix (:func:`~diag.analysis.scenarios.random_truth.run_truth`); ``ttft diagnose``
then designs the experiment against it, client only (no server spans, no ``/metrics``: the
most common user's view), with the users' SLO where the case has one and what they send
(``--workload``: their prompt lengths and shared prefix, :func:`users_workload`). The verdict is scored as
the matrix scores client-only verdicts (the case's ``client_only_also``). Recorded per case:
the verdict, its confidence, the probing time and the time to verdict (the probing time until
the running verdict became the final one and stayed).

A case diagnose cannot reproduce is listed apart, with why, never scored: one that compares two
engine configurations (``comm``: TP 1 against TP 2) or whose cause is the client's own CPU
(``loadgen``). Cases whose cause shows only under the users' workload (a shared prefix, long
prompts among short ones, a mixed prompt set) are scored: diagnose's own workload and its
follow-ups measure the server, and ``--workload`` (what the case's users send, as its user would
say it) tells whether what they found reaches those users.

Runs engines as subprocesses; the calling thread only.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.analysis.scenarios.calibrate import Calibration
from diag.analysis.diagnose.users_workload import UsersWorkload
from diag.analysis.scenarios.catalog import Plan, ProbeStep, Scenario
from diag.analysis.scenarios.engine_process import EngineProcess
from diag.analysis.scenarios.matrix import Verdict, verdict_of


@dataclass
class DiagnosedCase:
    """One case through ``ttft diagnose``: ``skipped`` says why it was not run (then no verdict)."""

    name: str
    expected: str
    also_right: frozenset[str] = frozenset()
    verdict: Verdict | None = None
    probing_s: float | None = None
    time_to_verdict_s: float | None = None
    requests: int = 0
    stopped: str = ""
    skipped: str | None = None
    wall_s: float = 0.0

    @property
    def scored(self) -> bool:
        """Run and scorable (a void truth, a designed-healthy draw whose SLO broke, is not)."""
        from diag.analysis.scenarios.random_truth import VOID

        return self.verdict is not None and self.expected != VOID

    def ok(self) -> bool:
        v = self.verdict
        return v is not None and (v.category == self.expected or v.category in self.also_right)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "expected": self.expected, "also_right": sorted(self.also_right),
                "verdict": vars(self.verdict) if self.verdict else None, "right": self.ok() if self.scored else None,
                "probing_s": self.probing_s, "time_to_verdict_s": self.time_to_verdict_s, "requests": self.requests,
                "stopped": self.stopped, "skipped": self.skipped, "wall_s": self.wall_s}


def not_applicable(plan: Plan) -> str | None:
    """Why diagnose cannot reproduce ``plan``'s case (None: it can)."""
    if len(plan.phases) != 1:
        return "compares engine configurations (one process each); diagnose probes one running server"
    if any(s.starve_client for s in plan.phases[0].steps):
        return "the cause is the client's own CPU; diagnose's client is not starved"
    return None


def users_workload(steps: Sequence[ProbeStep]) -> UsersWorkload:
    """What a case's users send, as its user would tell ``ttft diagnose --workload``: the range of
    the prompts its probe steps send (their lengths, cycled prompts, injected long ones; a sweep's
    values are that probe's experiment, not the users') and the prefix they share (0: none)."""
    from collectors.probe import LengthSpec

    lo, hi = math.inf, 0.0
    for st in steps:
        lens = [*LengthSpec.parse(st.input_tokens).bounds, *(t for t, _ in st.prompts), *((st.inject_long[0],) if st.inject_long[0] else ())]
        lo, hi = min(lo, *lens), max(hi, *lens)
    prompt = (int(lo), int(hi)) if hi >= lo >= 1 else None
    return UsersWorkload(prompt, max((st.shared_prefix[0] for st in steps), default=0))


def diagnose_case(name: str, expected: str, also_right: frozenset[str], plan: Plan, out_dir: Path,
                  budget_s: float = 120.0, log: Callable[[str], None] | None = None,
                  truth: Callable[[list[Path]], str] | None = None) -> DiagnosedCase:
    """Start the case's engine, run ``ttft diagnose`` against it into ``out_dir/client``, stop it.

    ``truth`` (a draw's): the ground truth from the run's captures (client and server), else
    ``expected`` stands.
    """
    from diag.analysis.diagnose import DiagnoseConfig, PlanConfig, run_diagnose
    from diag.analysis.diagnose.design import DEFAULT_INPUT_TOKENS
    from diag.analysis.diagnose.users_workload import ramp_prompt_tokens
    from diag.ground.slo import parse_slo

    case = DiagnosedCase(name, expected, also_right)
    why = not_applicable(plan)
    if why:
        case.skipped = why
        return case
    t0 = time.monotonic()
    phase = plan.phases[0]
    client, server = out_dir / "client", out_dir / "server"
    slo = parse_slo(plan.slo) if plan.slo else None
    with EngineProcess(phase.serve_args, capture_dir=server) as eng:
        if log:
            log(f"  engine {' '.join(phase.serve_args) or '(defaults)'} at {eng.url}; ttft diagnose -o {client}")
        users = users_workload(phase.steps)  # as the CLI does with --workload: the ramp on prompts no longer than theirs
        plan_cfg = PlanConfig(input_tokens=ramp_prompt_tokens(users, None, DEFAULT_INPUT_TOKENS), budget_s=budget_s)
        res = run_diagnose(DiagnoseConfig(eng.url, client, plan_cfg, slo=slo, workload=users))
    case.wall_s = time.monotonic() - t0
    if res.analysis is not None and res.analysis.diagnosis is not None:
        case.verdict = verdict_of(res.analysis.diagnosis)
    case.probing_s, case.time_to_verdict_s = res.probing_s, res.time_to_verdict_s
    case.requests, case.stopped = res.requests_sent, res.stopped
    if truth is not None:
        case.expected = truth([client, server])
    return case


def scenarios_via_diagnose(scenarios: Sequence[Scenario], out_root: str | Path, cal: Calibration,
                           budget_s: float = 120.0, log: Callable[[str], None] | None = None) -> list[DiagnosedCase]:
    """The catalogue's scenarios through ``ttft diagnose``."""
    from diag.analysis.scenarios.random_truth import CLIENT_ONLY_ALSO

    out = []
    for sc in scenarios:
        if log:
            log(f"scenario {sc.name} (expect {sc.category}) through ttft diagnose ...")
        # what a client cannot tell apart: the scenario's own, and the random matrix's (random_truth)
        also = sc.client_only_also | CLIENT_ONLY_ALSO.get(sc.category, frozenset())
        case = diagnose_case(sc.name, sc.category, also, sc.build(cal), Path(out_root) / sc.name, budget_s, log)
        _log_case(case, log)
        out.append(case)
    return out


def draws_via_diagnose(seed: int, indices: Sequence[int], out_root: str | Path, cal: Calibration,
                       budget_s: float = 120.0, log: Callable[[str], None] | None = None) -> list[DiagnosedCase]:
    """Random draws ``indices`` of ``seed`` through ``ttft diagnose`` (truth by the engine's accounting)."""
    from diag.analysis.scenarios.random_draws import draw
    from diag.analysis.scenarios.random_plans import build_plan
    from diag.analysis.scenarios.random_truth import CLIENT_ONLY_ALSO, run_truth

    out = []
    for i in indices:
        d = draw(seed, i)
        plan = build_plan(d, cal)
        if log:
            log(f"draw {d.name} (expect {d.expected}) through ttft diagnose: {d.describe()}")
        case = diagnose_case(d.name, d.expected, frozenset(), plan, Path(out_root) / d.name, budget_s, log,
                             # a mix's truth by the engine's accounting; a designed-healthy draw's SLO
                             # is the diagnose --slo (its ramp is built to cross it), not a void test
                             truth=(lambda caps, d=d, plan=plan: run_truth(d, plan.slo, caps)[0])
                             if d.kind == "mix" else None)
        case.also_right = CLIENT_ONLY_ALSO.get(case.expected, frozenset())  # of the truth the run made
        _log_case(case, log)
        out.append(case)
    return out


def _log_case(case: DiagnosedCase, log: Callable[[str], None] | None) -> None:
    if log is None:
        return
    if case.skipped:
        log(f"  skipped: {case.skipped}")
    elif case.verdict is not None:
        ttv = "-" if case.time_to_verdict_s is None else f"{case.time_to_verdict_s:.0f} s"
        log(f"  {case.verdict.category} ({case.verdict.confidence:.2f}), {'right' if case.ok() else 'MISS'}; "
            f"time to verdict {ttv} of {case.probing_s:.0f} s probing")


@dataclass
class ViaDiagnoseReport:
    """Accuracy and time to verdict over cases run through ``ttft diagnose``."""

    cases: list[DiagnosedCase]
    title: str
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def scored(self) -> list[DiagnosedCase]:
        return [c for c in self.cases if c.scored]

    def accuracy(self) -> tuple[int, int]:
        s = self.scored()
        return sum(c.ok() for c in s), len(s)

    def times_by_class(self) -> dict[str, dict[str, float | int]]:
        """Per expected class: median and worst time to verdict (s), over its right verdicts."""
        by: dict[str, list[float]] = {}
        for c in self.scored():
            if c.ok() and c.time_to_verdict_s is not None:
                by.setdefault(c.expected, []).append(c.time_to_verdict_s)
        return {k: {"median_s": statistics.median(v), "worst_s": max(v), "n": len(v)} for k, v in sorted(by.items())}

    def to_dict(self) -> dict[str, Any]:
        right, n = self.accuracy()
        return {"title": self.title, "right": right, "scored": n, "wall_s": self.wall_s,
                "time_to_verdict_by_class": self.times_by_class(), "cases": [c.to_dict() for c in self.cases],
                **self.extra}

    def format_text(self) -> str:
        lines = [self.title, "",
                 f"{'case':<28} {'expected':<16} {'verdict':<18} {'conf':>5} {'to verdict':>10} {'probing':>8}"]
        for c in self.cases:
            if c.skipped:
                lines.append(f"{c.name:<28} {c.expected:<16} skipped: {c.skipped}")
                continue
            v = c.verdict
            mark = "" if not c.scored else ("" if c.ok() else "  MISS")
            ttv = "-" if c.time_to_verdict_s is None else f"{c.time_to_verdict_s:.0f} s"
            lines.append(f"{c.name:<28} {c.expected:<16} {(v.category if v else '-'):<18} "
                         f"{(v.confidence if v else 0):>5.2f} {ttv:>10} {c.probing_s or 0:>6.0f} s{mark}")
        right, n = self.accuracy()
        lines += ["", f"right: {right}/{n} scored" + (f" ({100 * right / n:.0f}%)" if n else ""),
                  "time to verdict by class (right verdicts): " + (", ".join(
                      f"{k} median {t['median_s']:.0f} s, worst {t['worst_s']:.0f} s (n={t['n']})"
                      for k, t in self.times_by_class().items()) or "none"),
                  f"wall time: {self.wall_s:.0f} s"]
        return "\n".join(lines)


__all__ = ["DiagnosedCase", "ViaDiagnoseReport", "diagnose_case", "draws_via_diagnose", "not_applicable",
           "scenarios_via_diagnose", "users_workload"]
