"""The random scenario matrix: run draws, score them, and say how far a confidence can be trusted.

:func:`check_random` runs each :class:`~diag.analysis.scenarios.random_draws.Draw` with the one runner
(:func:`~diag.analysis.scenarios.runner.run_scenario`), ``repeat`` times, and diagnoses each run
server-side and/or client-only (:func:`~diag.analysis.scenarios.matrix.diagnose_run`). The result
(:class:`RandomResult`) gives per-category accuracy per mode, the confusion table
(:func:`~diag.analysis.scenarios.matrix.confusion_table`), a reliability table (confidence bins
against the share right), the flip rate over repeats, and for every miss the command that
reproduces that one draw. Accuracy counts every run of every draw (repeats included).

Under the verdict contract (docs/verdict.md) each scored run has one **outcome**
(:func:`outcome`), counted per family and kind and per mode (:meth:`RandomResult.outcomes`):

- ``right``: the verdict is the truth (client-only: or an equivalent in ``CLIENT_ONLY_ALSO``);
- ``leading-right``: the verdict is ``healthy`` or ``inconclusive`` with the truth as its leading
  candidate (under the verdict floor): not named, not wrong;
- ``inconclusive``: ``inconclusive`` (or ``no_data``) with another or no leading candidate;
- ``missed``: ``healthy`` where a cause was injected, the truth not leading (says nothing waits
  where something does);
- ``wrong``: another cause named (``failures`` and ``loadgen`` included); ``wrong-confident`` counts
  those at confidence >= :data:`CONFIDENT` apart. For a draw designed healthy every wrong run is a
  cause named where there is none (``false_cause``).

``agreement`` (over ``repeat`` >= 2) is the share of draws whose verdict category was the same on
every run of the draw (draws with a void run left out). The budgets these are held to: docs/random-matrix.md.

Threading: everything runs on the calling thread (the engine in its own process).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from diag.ground.capture import attribute, load_capture
from diag.analysis.scenarios.calibrate import Calibration
from diag.ground.stages import ATTR_CLIENT_CONN_REUSED
from diag.analysis.scenarios.matrix import MODES, MatrixRow, Verdict, confusion_table, diagnose_run
from diag.analysis.scenarios.random_draws import Draw, space_draw
from diag.analysis.scenarios.random_plans import build_plan, scenario
from diag.analysis.scenarios.random_truth import CLIENT_ONLY_ALSO, VOID, run_truth, scored_right
from diag.analysis.scenarios.runner import run_scenario
from rules.model import INCONCLUSIVE, NO_DATA
from rules.verdict import HEALTHY_ID

#: confidence bins of the reliability table: [lo, hi)
BINS: tuple[tuple[float, float], ...] = ((0.0, 0.5), (0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01))
#: a wrong verdict at this confidence or more is ``wrong-confident`` (the issue's bar: none)
CONFIDENT = 0.8
#: the share of repeated draws that should keep their verdict (the issue's bar)
AGREEMENT_BAR = 0.95
RIGHT, LEADING_RIGHT, UNDECIDED, MISSED, WRONG = "right", "leading-right", "inconclusive", "missed", "wrong"
#: the outcomes of a scored run, best first (see the module docstring)
OUTCOMES: tuple[str, ...] = (RIGHT, LEADING_RIGHT, UNDECIDED, MISSED, WRONG)
#: verdicts that name no cause (the contract's healthy, inconclusive, and no data)
NOT_A_CAUSE: frozenset[str] = frozenset({HEALTHY_ID, INCONCLUSIVE, NO_DATA})


def outcome(v: Verdict, truth: str, mode: str) -> str:
    """One scored run's outcome (``RIGHT`` .. ``WRONG``) for ground truth ``truth`` in ``mode``."""
    if scored_right(v.category, truth, mode):
        return RIGHT
    if v.category in (HEALTHY_ID, INCONCLUSIVE) and v.leading and scored_right(v.leading, truth, mode):
        return LEADING_RIGHT
    if v.category == HEALTHY_ID:
        return MISSED
    return UNDECIDED if v.category in NOT_A_CAUSE else WRONG


def tally(runs: Sequence[tuple[Verdict, str, str]]) -> dict[str, int]:
    """Counts of (verdict, truth, mode) runs: ``runs`` and each outcome, ``wrong_confident`` (wrong at
    >= :data:`CONFIDENT`), ``designed_healthy`` runs and ``false_cause`` (a cause named on one)."""
    out = {"runs": len(runs), **{o: 0 for o in OUTCOMES}, "wrong_confident": 0, "designed_healthy": 0,
           "false_cause": 0}
    for v, t, m in runs:
        o = outcome(v, t, m)
        out[o] += 1
        out["wrong_confident"] += o == WRONG and v.confidence >= CONFIDENT
        if t == HEALTHY_ID:
            out["designed_healthy"] += 1
            out["false_cause"] += o == WRONG
    return out


@dataclass
class DrawResult:
    """One draw and its verdicts per mode, one per repeat."""

    draw: Draw
    verdicts: dict[str, list[Verdict]] = field(default_factory=dict)
    wall_s: float = 0.0
    #: the ground truth of each repeat: the draw's, or a mix's by the engine's accounting
    truths: list[str] = field(default_factory=list)
    accounting: list[dict[str, float]] = field(default_factory=list)
    #: per repeat, the probe's connections: requests, ``fresh`` (a new connection: the first, and any
    #: after the server closed an idle one), ``retried`` (sent once more after a reused one was found
    #: closed: client_health.connection_retries, not a failure)
    connections: list[dict[str, int]] = field(default_factory=list)

    def truth(self, k: int = 0) -> str:
        return self.truths[k] if k < len(self.truths) else self.draw.expected

    def ok(self, mode: str, k: int = 0) -> bool:
        return scored_right(self.verdicts[mode][k].category, self.truth(k), mode)

    def flipped(self, mode: str) -> bool:
        return len({v.category for v in self.verdicts[mode]}) > 1


def reproduce_command(d: Draw, mode_arg: str = "both", calibration: str | None = None) -> str:
    """The command line that runs this one draw again (``--near-miss 1`` for the near-miss space)."""
    cmd = ["ttft", "scenarios", "check", "--near-miss" if d.space == "near-miss" else "--random", "1",
           "--seed", str(d.seed), "--draw", str(d.index)]
    if mode_arg != "both":
        cmd += ["--mode", mode_arg]
    if calibration:
        cmd += ["--calibration", calibration]
    return shlex.join(cmd)


@dataclass
class RandomResult:
    seed: int
    calibration: Calibration
    modes: tuple[str, ...]
    results: list[DrawResult]
    mode_arg: str = "both"
    calibration_file: str | None = None
    wall_s: float = 0.0

    def _runs(self, mode: str) -> list[tuple[DrawResult, Verdict, str]]:
        """(draw, verdict, ground truth) of every scored run in ``mode`` (void runs left out)."""
        return [(r, v, r.truth(k)) for r in self.results for k, v in enumerate(r.verdicts.get(mode, []))
                if r.truth(k) != VOID]

    def voids(self) -> list[tuple[DrawResult, int]]:
        """(draw, repeat) of the runs that did not come out as designed (not scored)."""
        return [(r, k) for r in self.results for k in range(len(r.truths)) if r.truths[k] == VOID]

    def categories(self) -> list[str]:
        return sorted({t for m in self.modes for _, _, t in self._runs(m)})

    def accuracy(self, mode: str, category: str | None = None) -> tuple[int, int]:
        runs = [(v, t) for _, v, t in self._runs(mode) if category is None or t == category]
        return sum(scored_right(v.category, t, mode) for v, t in runs), len(runs)

    def reliability(self) -> list[dict[str, Any]]:
        """Per confidence bin: runs, share right (both modes pooled)."""
        out = []
        for lo, hi in BINS:
            hits = [scored_right(v.category, t, m) for m in self.modes for _, v, t in self._runs(m)
                    if lo <= v.confidence < hi]
            out.append({"bin": [lo, min(hi, 1.0)], "runs": len(hits), "right": sum(hits),
                        "accuracy": (sum(hits) / len(hits)) if hits else None})
        return out

    def accepted_also(self, mode: str) -> list[tuple[DrawResult, Verdict, str]]:
        """Runs scored right by :data:`CLIENT_ONLY_ALSO` (another category than the truth)."""
        return [(r, v, t) for r, v, t in self._runs(mode)
                if v.category != t and v.category in CLIENT_ONLY_ALSO.get(t, ()) and scored_right(v.category, t, mode)]

    def flip_rate(self, mode: str) -> float | None:
        rs = [r for r in self.results if len(r.verdicts.get(mode, [])) > 1]
        return (sum(r.flipped(mode) for r in rs) / len(rs)) if rs else None

    def agreement(self, mode: str) -> dict[str, Any] | None:
        """Over the draws run more than once in ``mode`` with no void run: how many, how many got the
        same verdict category on every run (``agree``), the share, and the repeated draws left out
        for a void run (``void``: a run not as designed has no verdict to agree with); None when no
        draw was repeated."""
        rep = [r for r in self.results if len(r.verdicts.get(mode, [])) > 1]
        if not rep:
            return None
        rs = [r for r in rep if VOID not in r.truths]
        same = sum(not r.flipped(mode) for r in rs)
        return {"draws": len(rs), "agree": same, "share": (same / len(rs)) if rs else None, "void": len(rep) - len(rs)}

    def groups(self) -> list[tuple[str, str]]:
        """The (family, kind) pairs drawn, in family then kind order."""
        return sorted({(r.draw.family, r.draw.kind) for r in self.results})

    def outcomes(self, mode: str, group: tuple[str, str] | None = None) -> dict[str, int]:
        """:func:`tally` of the scored runs in ``mode`` (of one (family, kind) ``group``, else all)."""
        return tally([(v, t, mode) for r, v, t in self._runs(mode)
                      if group is None or (r.draw.family, r.draw.kind) == group])

    def misses(self) -> list[tuple[DrawResult, str, Verdict, str]]:
        """(draw, mode, verdict, ground truth) of every run that missed."""
        return [(r, m, v, t) for m in self.modes for r, v, t in self._runs(m) if not scored_right(v.category, t, m)]

    def rows(self) -> list[MatrixRow]:
        """First repeat of each draw as a matrix row (for the confusion table)."""
        also = {"client-only": CLIENT_ONLY_ALSO}
        return [MatrixRow(r.draw.name, r.truth(0), {m: vs[0] for m, vs in r.verdicts.items()}, r.wall_s,
                          {m: also[m].get(r.truth(0), frozenset()) for m in also})
                for r in self.results if r.truth(0) != VOID]

    def format_outcomes(self) -> str:
        """The per-family table: per (family, kind) and mode, runs and each outcome (text)."""
        cols = ("runs", RIGHT, LEADING_RIGHT, UNDECIDED, MISSED, WRONG, "wrong_confident")
        heads = ("n", "right", "lead", "inc", "miss", "wrong", ">=.8")
        widths = (3, 6, 5, 4, 5, 6, 5)

        def cells(t: dict[str, int]) -> str:
            return " ".join(f"{t[c]:>{w}}" for c, w in zip(cols, widths))

        span = sum(widths) + len(widths) - 1
        lines = ["outcomes per family and kind (right: the truth; lead: healthy/inconclusive with the truth leading; "
                 "inc: inconclusive; miss: healthy where a cause is; wrong: another cause named, >=.8 of them at "
                 f"confidence >= {CONFIDENT:g}):",
                 f"{'':<28}" + " | ".join(f"{m:^{span}}" for m in self.modes),
                 f"{'family/kind':<28}" + " | ".join(" ".join(f"{h:>{w}}" for h, w in zip(heads, widths))
                                                     for _ in self.modes)]
        for fam, kind in self.groups():
            lines.append(f"{fam + '/' + kind:<28}" + " | ".join(cells(self.outcomes(m, (fam, kind))) for m in self.modes))
        lines.append(f"{'all':<28}" + " | ".join(cells(self.outcomes(m)) for m in self.modes))
        for m in self.modes:
            t = self.outcomes(m)
            if t["designed_healthy"]:
                lines.append(f"designed healthy ({m}): a cause named on {t['false_cause']} of {t['designed_healthy']} runs")
        return "\n".join(lines)

    def command(self, d: Draw) -> str:
        return reproduce_command(d, self.mode_arg, self.calibration_file)

    def to_dict(self) -> dict[str, Any]:
        cats = self.categories()
        return {
            "seed": self.seed, "calibration": self.calibration.to_dict(), "modes": list(self.modes), "wall_s": self.wall_s,
            "accuracy": {m: {"right": self.accuracy(m)[0], "runs": self.accuracy(m)[1],
                             "per_category": {c: dict(zip(("right", "runs"), self.accuracy(m, c))) for c in cats}}
                         for m in self.modes},
            "outcomes": {m: {"all": self.outcomes(m),
                             "per_family": {f"{fam}/{kind}": self.outcomes(m, (fam, kind)) for fam, kind in self.groups()}}
                         for m in self.modes},
            "reliability": self.reliability(), "flip_rate": {m: self.flip_rate(m) for m in self.modes},
            "agreement": {m: self.agreement(m) for m in self.modes},
            "scored_right_not_observable": {m: [{"draw": r.draw.index, "truth": t, "verdict": v.category}
                                                for r, v, t in self.accepted_also(m)] for m in self.modes},
            "void": [{"draw": r.draw.index, "repeat": k, "broken_s": r.accounting[k]} for r, k in self.voids()],
            "draws": [{"index": r.draw.index, "name": r.draw.name, "family": r.draw.family, "kind": r.draw.kind,
                       "expected": r.draw.expected, "truths": [r.truth(k) for k in range(max(1, len(r.truths)))],
                       "accounting_s": r.accounting, "params": r.draw.params, "wall_s": r.wall_s,
                       "injected": build_plan(r.draw, self.calibration).injected,
                       "verdicts": {m: [vars(v) for v in vs] for m, vs in r.verdicts.items()},
                       "space": r.draw.space, "connections": r.connections,
                       "reproduce": self.command(r.draw)} for r in self.results],
            "misses": [{"draw": r.draw.index, "mode": m, "expected": t, "verdict": v.category,
                        "confidence": v.confidence, "leading": v.leading, "leading_confidence": v.leading_confidence,
                        "outcome": outcome(v, t, m), "reproduce": self.command(r.draw)}
                       for r, m, v, t in self.misses()],
        }

    def format_text(self) -> str:
        c = self.calibration
        lines = [f"random matrix: seed {self.seed}, {len(self.results)} draws, modes {', '.join(self.modes)}",
                 f"calibration: prefill {c.prefill_ms_per_token:.3f} ms/token, decode step {c.decode_step_ms:.2f} ms, "
                 f"short-prompt TTFT {c.ttft_short_ms:.1f} ms, spread {c.spread:.2f} ({c.device})", ""]
        lines.append(confusion_table(self.rows(), self.modes))
        lines += ["", "accuracy per category (right/runs):"]
        cats = self.categories()
        lines.append(f"{'category':<16}" + "".join(f"{m:>14}" for m in self.modes))
        for cat in [*cats, None]:
            cells = ["{}/{}".format(*self.accuracy(m, cat)) for m in self.modes]
            lines.append(f"{cat or 'all':<16}" + "".join(f"{x:>14}" for x in cells))
        lines += ["", self.format_outcomes()]
        lines += ["", "reliability (confidence bin: right/runs, share right; modes pooled):"]
        for b in self.reliability():
            acc = "-" if b["accuracy"] is None else f"{100 * b['accuracy']:.0f}%"
            lines.append(f"  [{b['bin'][0]:.1f}, {b['bin'][1]:.1f}{']' if b['bin'][1] >= 1 else ')'}  "
                         f"{b['right']}/{b['runs']}  {acc}")
        for m in self.modes:
            fr = self.flip_rate(m)
            if fr is not None:
                lines.append(f"flip rate {m}: {100 * fr:.0f}% of draws changed verdict over repeats")
        for m in self.modes:
            ag = self.agreement(m)
            if ag is not None and ag["draws"]:
                lines.append(f"agreement {m}: {ag['agree']}/{ag['draws']} draws ({100 * ag['share']:.0f}%) got the same "
                             f"verdict on every run (the bar: {100 * AGREEMENT_BAR:.0f}%)"
                             + (f"; {ag['void']} with a void run left out" if ag["void"] else ""))
        for m in self.modes:
            also = self.accepted_also(m)
            if also:
                lines.append(f"scored right as not observable from the client ({m}): " + ", ".join(
                    f"{r.draw.name} {t} -> {v.category}" for r, v, t in also))
        conns = [f"{r.draw.name} " + ", ".join(f"{c['fresh']}/{c['requests']} fresh, {c['retried']} retried"
                                              for c in r.connections)
                 for r in self.results if r.draw.family == "keepalive" or any(c["retried"] for c in r.connections)]
        if conns:
            lines.append("connections (fresh: the server closed an idle one or none was pooled; retried: found closed "
                         "when reused, sent again, not a failure): " + "; ".join(conns))
        voids = self.voids()
        if voids:
            lines.append(f"void (not as designed: a designed-healthy run's users' SLO broke, an interference or decode "
                         f"run's held, or the probe was starved by the machine; not scored): {len(voids)}")
            for r, k in voids:
                lines.append(f"  {r.draw.name}: {r.accounting[k]}; {r.draw.describe()}")
        misses = self.misses()
        lines += ["", f"misses: {len(misses)}"]
        for r, m, v, t in misses:
            lead = f", leading {v.leading} ({v.leading_confidence:.2f})" if v.leading else ""
            lines.append(f"  {r.draw.name} [{m}] expected {t}, got {v.category} ({v.confidence:.2f}){lead}: "
                         f"{outcome(v, t, m)}; {r.draw.describe()}")
            lines.append(f"    reproduce: {self.command(r.draw)}")
        lines.append(f"wall time: {self.wall_s:.0f} s")
        return "\n".join(lines)


def check_random(seed: int, indices: Sequence[int], out_root: str | Path, cal: Calibration,
                 modes: Sequence[str] = MODES, repeat: int = 1, log: Callable[[str], None] | None = None,
                 space: str = "main") -> list[DrawResult]:
    """Run draws ``indices`` of ``seed`` (in ``space``: ``main`` or ``near-miss``) ``repeat`` times
    each; diagnose every run in ``modes``."""
    return check_draws([space_draw(space, seed, i) for i in indices], out_root, cal, modes, repeat, log)


def connections(client: Path) -> dict[str, int]:
    """The probe's connections in a client capture: requests, ``fresh`` (its spans'
    ``ttft.client.conn_reused`` false) and ``retried`` (meta.json ``client_health.connection_retries``)."""
    client = Path(client)
    try:
        meta = json.loads((client / "meta.json").read_text())
    except (OSError, ValueError):
        meta = {}
    retried = int(((meta.get("client_health") or {}).get("connection_retries") or {}).get("retried") or 0)
    spans = load_capture(client).spans if client.exists() else None
    reused = [] if spans is None or spans.empty else [x for x in attribute(spans, ATTR_CLIENT_CONN_REUSED)
                                                      if isinstance(x, (bool, np.bool_))]
    return {"requests": len(reused), "fresh": sum(not x for x in reused), "retried": retried}


def check_draws(ds: Sequence[Draw], out_root: str | Path, cal: Calibration, modes: Sequence[str] = MODES,
                repeat: int = 1, log: Callable[[str], None] | None = None) -> list[DrawResult]:
    """Run each draw of ``ds`` ``repeat`` times; diagnose every run in ``modes``."""
    out = []
    for d in ds:
        res = DrawResult(d, {m: [] for m in modes})
        t0 = time.monotonic()
        for k in range(repeat):
            if log:
                log(f"draw {d.name} (expect {d.expected}){f' repeat {k + 1}/{repeat}' if repeat > 1 else ''}: {d.describe()}")
            run = run_scenario(scenario(d), Path(out_root) / (d.name if repeat == 1 else f"{d.name}-{k}"), cal, log=log)
            truth, accounting = run_truth(d, run.slo, run.all_captures)
            res.truths.append(truth)
            res.accounting.append(accounting)
            res.connections.append(connections(run.client))
            if log and truth != d.expected:
                log(f"  {'void: not as designed' if truth == VOID else 'the engine accounting makes the truth ' + truth}:"
                    f" {accounting}")
            for m in modes:
                res.verdicts[m].append(diagnose_run(run, m))
            if log:
                log("  " + "  ".join(f"{m}: {vs[-1].category} ({vs[-1].confidence:.2f})" for m, vs in res.verdicts.items()))
        res.wall_s = time.monotonic() - t0
        out.append(res)
    return out
