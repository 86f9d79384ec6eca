"""The analysis floor (floor 3), and its front door: captures -> tables -> decomposition (+ verdict).

Beside the front door: :mod:`.fleet` and :mod:`.fleet_traces` (per-replica verdicts),
:mod:`.diagnose` (``ttft diagnose``'s adaptive experiment), :mod:`.scenarios` (catalogue, random
matrix, demo director) and :mod:`.report` (text, Markdown, HTML, JSON, SVG, diff).

``analyze_paths`` is what ``ttft analyze``, ``ttft report`` and the TUI call; it returns an
:class:`Analysis` whose ``diagnosis`` is the rule engine's :class:`rules.Diagnosis` (None only
when the caller asked for the decomposition alone, ``run_rules=False``). Rendering lives in
:mod:`diag.analysis.report` (``ttft analyze``'s text: :func:`diag.analysis.report.text.format_analysis`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.ground import stages
from diag.ground.capture import META_FILE, SERIES_DIR, SPANS_FILE, SPANS_FILE_GZ, Capture, CaptureError, load_capture
from diag.ground.tables import Tables, build_tables, stage_decomposition
import rules


@dataclass
class Analysis:
    """Everything ``ttft analyze`` reports for one set of joined captures."""

    paths: list[str]
    tables: Tables
    decomposition: dict[str, Any]
    diagnosis: rules.Diagnosis | None = None  # None when the rules were not run
    warnings: list[str] = field(default_factory=list)
    slo: dict[str, float] | None = None  # the SLO applied (given, or recorded in the capture)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "captures": self.paths,
            "stages": self.decomposition["stages"],
            "requests": self.decomposition["requests"],
            "ttft_s": self.decomposition["ttft_s"],
            "server_ttft_s": self.decomposition["server_ttft_s"],
            "client_ttft_s": self.decomposition["client_ttft_s"],
            "clock_offsets_s": self.tables.clock_offsets,
            "lumped_stages": self.tables.lumped_notes,
            "warnings": self.warnings,
        }
        if self.diagnosis is not None:
            out.update(self.diagnosis.to_dict())
        return out


def expand_capture_paths(paths: list[str | os.PathLike[str]]) -> list[Path]:
    """Captures named on the command line; a directory that is not a capture itself but holds
    captures (a scenario run: ``client/``, ``server-0/``...) stands for all of them."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir() and not any((p / f).exists() for f in (SPANS_FILE, SPANS_FILE_GZ, META_FILE, SERIES_DIR)):
            children = sorted(c for c in p.iterdir() if c.is_dir() and any(
                (c / f).exists() for f in (SPANS_FILE, SPANS_FILE_GZ, META_FILE)))
            if children:
                out.extend(children)
                continue
        out.append(p)
    return out


def load_captures(paths: list[str | os.PathLike[str]]) -> list[Capture]:
    if not paths:
        raise CaptureError("no capture given")
    return [load_capture(p) for p in expand_capture_paths(paths)]


def recorded_slo(caps: list[Capture]) -> dict[str, float] | None:
    """The SLO a run was held to, when its capture records one (meta.json ``slo``)."""
    from diag.ground.slo import parse_slo

    for c in caps:
        probe = c.meta.get("probe")
        for spec in (c.meta.get("slo"), probe.get("slo") if isinstance(probe, dict) else None):
            if isinstance(spec, str) and spec:
                try:
                    return parse_slo(spec)
                except CaptureError:
                    continue
            if isinstance(spec, dict) and spec and all(isinstance(v, (int, float)) for v in spec.values()):
                return {str(k): float(v) for k, v in spec.items()}
    return None


def analyze_captures(caps: list[Capture], rules_file: str | None = None, slo: dict[str, float] | None = None,
                     run_rules: bool = True) -> Analysis:
    tables = build_tables(caps)
    if slo is None:
        slo = recorded_slo(caps)
    decomposition = stage_decomposition(tables.requests)
    diagnosis = rules.run_rules(tables, rules_file=rules_file, slo=slo) if run_rules else None
    return Analysis([str(c.path) for c in caps], tables, decomposition, diagnosis, list(tables.warnings), slo)


def analyze_paths(paths: list[str | os.PathLike[str]], rules_file: str | None = None,
                  slo: dict[str, float] | None = None, run_rules: bool = True) -> Analysis:
    """Load, join by trace id, decompose and diagnose."""
    return analyze_captures(load_captures(paths), rules_file, slo, run_rules)


__all__ = ["Analysis", "analyze_paths", "analyze_captures", "expand_capture_paths", "load_captures", "recorded_slo"]
