"""What the rule engine hands back: evidence, findings, skipped rules and the diagnosis.

Data only: text, Markdown, HTML and the TUI format these (``diag.analysis.report``, ``diag.ground.units``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rules.features import Features
from diag.ground.units import json_safe

#: The verdict's category when no cause stands out (every SLO met, nothing waits, or no rule
#: crossed its threshold): no rule's. The bottleneck categories are the rules' own, each with the
#: kind of time it explains (:func:`rules.registry.categories`, :func:`rules.registry.kind_of`).
HEALTHY = "healthy"
#: The verdict's category when there is nothing to judge (no completed request).
NO_DATA = "no_data"
#: The verdict's category when the rules that could explain TTFT could not run and the capture's
#: own numbers say TTFT is far above what it should be: not a bottleneck, not healthy; its next
#: checks name the experiment that would decide.
INCONCLUSIVE = "inconclusive"
#: The category of the finding that a material share of requests failed, was refused or cut off
#: (rules.edges.failures): not a TTFT bottleneck, and a run with it is never healthy.
FAILURES = "failures"
#: Verdict categories that are not bottleneck categories (no_data, inconclusive, failures).
OUTCOMES: tuple[str, ...] = (NO_DATA, INCONCLUSIVE, FAILURES)


@dataclass
class Evidence:
    """One number behind a finding, with the threshold it was judged against and what it means.

    ``threshold`` is a number in ``unit`` (with ``op``, one of ``>=``, ``>``, ``<=``, ``<``, the
    comparison that fires the rule) or, for rows not yet judged by a helper, a text. ``crossed``
    says whether ``value`` crossed it: True, False, or None for a context row (no threshold).
    ``key`` is the row's stable key (:mod:`rules.evidence`): what code matches, where ``name`` is
    what is shown.
    """

    name: str
    value: float | str | None
    threshold: float | str | None
    unit: str
    meaning: str
    op: str | None = None
    crossed: bool | None = None
    key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": json_safe(self.value), "threshold": json_safe(self.threshold),
                "op": self.op, "crossed": self.crossed, "unit": self.unit, "meaning": self.meaning, "key": self.key}


@dataclass
class Finding:
    """A named bottleneck: category, confidence 0..1, TTFT time it explains, evidence, next checks.

    ``explained_s`` is seconds of TTFT p95 the cause accounts for (None for causes that do not
    act on TTFT: ITL, start-up); ``explained_pct`` is the same as % of TTFT p95. Explanations of
    different findings can overlap and are never added up.
    """

    rule_id: str
    category: str
    title: str
    confidence: float
    explained_s: float | None
    explained_pct: float | None
    evidence: list[Evidence]
    next_checks: list[str]
    note: str | None = None
    #: ranking key parts (engine-internal, also reported)
    tier: int = 2
    weight: float = 1.0
    demoted_by: list[str] = field(default_factory=list)
    black_box: bool = False
    #: holds only if the users' workload has what the tool's own test had (ttft diagnose's shared
    #: prefix): it overrides no other finding and ranks after those of what was measured
    conditional: bool = False
    #: share of every steady request's TTFT, summed, that the cause explains (0..1): who waits and how
    #: many; the ranking weight when the rule measured it (else ``explained_pct`` of TTFT p95)
    population_share: float | None = None

    @property
    def score(self) -> float:
        return self.confidence * self.weight

    def add_note(self, text: str) -> None:
        """Append ``text`` to the note, the two joined by "; "."""
        self.note = f"{self.note.rstrip('; ')}; {text}" if self.note else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "category": self.category,
            "title": self.title,
            "confidence": round(float(self.confidence), 3),
            "explained_s": json_safe(self.explained_s),
            "explained_pct": json_safe(None if self.explained_pct is None else round(float(self.explained_pct), 1)),
            "evidence": [e.to_dict() for e in self.evidence],
            "next_checks": list(self.next_checks),
            "note": self.note,
            "black_box": self.black_box,
            "conditional": self.conditional,
            "demoted_by": list(self.demoted_by),
            "population_share": json_safe(None if self.population_share is None else round(float(self.population_share), 4)),
            "score": round(float(self.score), 4),
        }


@dataclass
class Skipped:
    """A rule that could not run; ``reason`` reads "skipped: needs …"."""

    rule_id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "reason": self.reason}


@dataclass
class Passed:
    """A rule that ran and did not fire, with the one-line reason."""

    rule_id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "reason": self.reason}


@dataclass
class Diagnosis:
    """The verdict (first of the findings, ranked), the leading candidate when no cause reached the
    verdict floor, skipped and passed rules, features (the contract: :mod:`rules.verdict`)."""

    verdict: Finding
    findings: list[Finding]
    skipped: list[Skipped]
    features: Features
    passed: list[Passed] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    thresholds: dict[str, Any] = field(default_factory=dict)
    #: the top cause when its confidence is under the verdict floor (then the verdict is healthy or
    #: inconclusive, see rules.verdict); None when the verdict is itself the top cause, or none fired
    leading: Finding | None = None

    @property
    def named(self) -> str:
        """The category the diagnosis points at: the leading candidate's when the verdict is healthy or
        inconclusive beneath one, else the verdict's own."""
        return self.leading.category if self.leading is not None else self.verdict.category

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict.to_dict()
        return {
            "verdict": v,
            "leading_candidate": self.leading.to_dict() if self.leading is not None else None,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [s.to_dict() for s in self.skipped],
            "passed": [p.to_dict() for p in self.passed],
            "notes": list(self.notes),
            "features": self.features.to_dict(),
        }
