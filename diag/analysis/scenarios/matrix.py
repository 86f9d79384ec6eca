"""The diagnosis matrix: every scenario's verdict, with server spans and client-only.

``check`` runs (or reuses) each scenario, analyses ``client + servers`` and ``client`` alone,
and scores the verdict against the scenario's ground truth. 100% on the diagonal is the bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.analysis.scenarios.calibrate import Calibration
from diag.analysis.scenarios.catalog import SCENARIOS, Scenario
from diag.analysis.scenarios.runner import IN_PROCESS, ProbeWorkers, ScenarioRun, run_scenario

MODES = ("server", "client-only")


@dataclass
class Verdict:
    """A diagnosis as the matrix scores it: the verdict, and (the verdict contract, docs/verdict.md)
    the leading candidate under the verdict floor when the verdict is ``healthy`` or ``inconclusive``
    beneath one (None otherwise). Confidences in 0..1."""

    category: str
    confidence: float
    title: str
    leading: str | None = None
    leading_confidence: float | None = None

    @property
    def named(self) -> str:
        """The category the diagnosis points at: the leading candidate's, else the verdict's."""
        return self.leading or self.category


@dataclass
class MatrixRow:
    scenario: str
    expected: str
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    wall_s: float = 0.0
    #: per mode, other categories scored right (the random matrix's client-only equivalents)
    also_right: dict[str, frozenset[str]] = field(default_factory=dict)

    def ok(self, mode: str) -> bool:
        v = self.verdicts.get(mode)
        return v is not None and (v.category == self.expected or v.category in self.also_right.get(mode, ()))


def diagnose_run(run: ScenarioRun, mode: str) -> Verdict:
    """The verdict on a scenario run, with server spans or from the client side alone."""
    from diag.analysis import analyze_paths

    paths = run.all_captures if mode == "server" else [run.client]
    a = analyze_paths(paths)  # the scenario's SLO is recorded in its client capture
    return verdict_of(a.diagnosis)


def verdict_of(diagnosis: Any) -> Verdict:
    """A :class:`rules.model.Diagnosis` as the matrix scores it (its verdict and leading candidate)."""
    v, lead = diagnosis.verdict, diagnosis.leading
    return Verdict(v.category, float(v.confidence), v.title, lead.category if lead is not None else None,
                   float(lead.confidence) if lead is not None else None)


def check(scenarios: Sequence[Scenario], out_root: str | Path, cal: Calibration,
          log: Callable[[str], None] | None = None, where: ProbeWorkers = IN_PROCESS) -> list[MatrixRow]:
    """Run each scenario (its probe steps where ``where`` says) and diagnose it per mode."""
    rows = []
    for sc in scenarios:
        t0 = time.monotonic()
        if log:
            log(f"scenario {sc.name} (expect {sc.category}) ...")
        run = run_scenario(sc, Path(out_root) / sc.name, cal, log=log, where=where)
        row = MatrixRow(sc.name, sc.category, also_right={"client-only": sc.client_only_also})
        for mode in MODES:
            row.verdicts[mode] = diagnose_run(run, mode)
        row.wall_s = time.monotonic() - t0
        if log:
            log("  " + "  ".join(f"{m}: {v.category} ({v.confidence:.2f})" for m, v in row.verdicts.items())
                + f"  [{row.wall_s:.1f}s]")
        rows.append(row)
    return rows


def confusion_table(rows: Sequence[MatrixRow], modes: Sequence[str] = MODES) -> str:
    """scenario x verdict per mode, with confidences, and the diagonal score (for ``modes``)."""
    lines = [f"{'scenario':<22} {'expected':<16} {'server-side verdict':<28} {'client-only verdict':<28} {'wall':>6}"]
    for r in rows:
        cells = []
        for mode in MODES:
            v = r.verdicts.get(mode)
            mark = "ok " if r.ok(mode) else "XX "
            cells.append(f"{mark}{v.category} ({v.confidence:.2f})" if v else "-")
        lines.append(f"{r.scenario:<22} {r.expected:<16} {cells[0]:<28} {cells[1]:<28} {r.wall_s:5.1f}s")
    for mode in modes:
        good = sum(r.ok(mode) for r in rows)
        lines.append(f"{mode}: {good}/{len(rows)} on the diagonal ({100 * good / max(1, len(rows)):.0f}%)")
    cats = sorted({r.expected for r in rows} | {v.category for r in rows for v in r.verdicts.values()})
    lines.append("")
    lines.append("confusion (rows: expected, columns: verdict; server-side/client-only counts)")
    lines.append(f"{'':<16}" + "".join(f"{c[:10]:>11}" for c in cats))
    for exp in sorted({r.expected for r in rows}):
        counts = []
        for c in cats:
            s = sum(1 for r in rows if r.expected == exp and r.verdicts.get("server") and r.verdicts["server"].category == c)
            k = sum(1 for r in rows if r.expected == exp and r.verdicts.get("client-only") and r.verdicts["client-only"].category == c)
            counts.append(f"{s}/{k}" if s or k else ".")
        lines.append(f"{exp:<16}" + "".join(f"{x:>11}" for x in counts))
    return "\n".join(lines)


def rows_to_dict(rows: Sequence[MatrixRow]) -> list[dict[str, Any]]:
    return [{"scenario": r.scenario, "expected": r.expected, "wall_s": r.wall_s,
             "verdicts": {m: vars(v) for m, v in r.verdicts.items()},
             "ok": {m: r.ok(m) for m in MODES}} for r in rows]
