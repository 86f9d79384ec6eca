"""What the rule engine hands back: evidence, findings, skipped rules and the diagnosis."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from diag.features import Features

#: Bottleneck categories, in the article's order plus the extras.
CATEGORIES: tuple[str, ...] = (
    "queue", "tokenize", "prefill_compute", "kv_cache", "comm", "decode", "interference",
    "cold_start", "network", "loadgen", "healthy",
)
#: The verdict's category when there is nothing to judge (no completed request).
NO_DATA = "no_data"
#: Categories whose findings explain TTFT time (the others explain ITL or start-up).
TTFT_CATEGORIES: frozenset[str] = frozenset({"queue", "tokenize", "prefill_compute", "kv_cache", "comm", "network"})
ITL_CATEGORIES: frozenset[str] = frozenset({"decode", "interference"})


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            return _clean(v.item())
        except (ValueError, AttributeError):
            return v
    return v


@dataclass
class Evidence:
    """One number behind a finding, with the threshold it was judged against and what it means.

    ``threshold`` is a number in ``unit`` (with ``op``, one of ``>=``, ``>``, ``<=``, ``<``, the
    comparison that fires the rule) or, for rows not yet judged by a helper, a text. ``crossed``
    says whether ``value`` crossed it: True, False, or None for a context row (no threshold).
    """

    name: str
    value: float | str | None
    threshold: float | str | None
    unit: str
    meaning: str
    op: str | None = None
    crossed: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": _clean(self.value), "threshold": _clean(self.threshold),
                "op": self.op, "crossed": self.crossed, "unit": self.unit, "meaning": self.meaning}


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

    @property
    def score(self) -> float:
        return self.confidence * self.weight

    def add_note(self, text: str) -> None:
        self.note = f"{self.note} {text}" if self.note else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "category": self.category,
            "title": self.title,
            "confidence": round(float(self.confidence), 3),
            "explained_s": _clean(self.explained_s),
            "explained_pct": _clean(None if self.explained_pct is None else round(float(self.explained_pct), 1)),
            "evidence": [e.to_dict() for e in self.evidence],
            "next_checks": list(self.next_checks),
            "note": self.note,
            "black_box": self.black_box,
            "demoted_by": list(self.demoted_by),
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
    """The verdict (the top finding), all findings ranked, skipped and passed rules, features."""

    verdict: Finding
    findings: list[Finding]
    skipped: list[Skipped]
    features: Features
    passed: list[Passed] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    thresholds: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict.to_dict()
        return {
            "verdict": v,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [s.to_dict() for s in self.skipped],
            "passed": [p.to_dict() for p in self.passed],
            "notes": list(self.notes),
            "features": self.features.to_dict(),
        }

    def format_text(self) -> str:
        """The verdict, its evidence and next checks, other findings, skipped rules."""
        out: list[str] = []
        v = self.verdict
        out.append(f"verdict: {v.category} (confidence {v.confidence:.2f}) - {v.title}")
        out.extend(_finding_body(v, self.features))
        others = [f for f in self.findings if f is not v]
        if others:
            out.append("")
            out.append("other findings (ranked; explained times overlap and are never added up):")
            for i, f in enumerate(others, 2):
                out.append(f"  {i}. {f.category} (confidence {f.confidence:.2f}) - {f.title}")
                out.extend("  " + line for line in _finding_body(f, self.features, brief=True))
        if self.notes:
            out.append("")
            out.extend(f"note: {n}" for n in self.notes)
        if self.skipped:
            out.append("")
            out.append("skipped rules:")
            out.extend(f"  {s.rule_id:<16} {s.reason}" for s in self.skipped)
        return "\n".join(out)


def fmt_value(value: Any, unit: str) -> str:
    """A number in the unit it states, readable (seconds as ms below 1 s, ratios as %)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    x = float(value)
    if unit == "s":
        return f"{x:.2f} s" if abs(x) >= 1 else f"{x * 1e3:.1f} ms"
    if unit in ("share", "fraction"):
        return f"{x * 100:.0f}%"
    if unit == "x":
        return f"{x:.2f}x"
    if unit == "%":
        return f"{x:.0f}%"
    if abs(x) >= 100 or x == int(x):
        return f"{x:.0f} {unit}".strip()
    return f"{x:.3g} {unit}".strip()


def _finding_body(f: Finding, feats: Features, brief: bool = False) -> list[str]:
    lines: list[str] = []
    p95 = feats.value("ttft_p95_s")
    if f.explained_s is not None and f.explained_pct is not None:
        lines.append(f"  explains {fmt_value(f.explained_s, 's')} ({f.explained_pct:.0f}% of TTFT p95"
                     + (f" {fmt_value(p95, 's')})" if p95 is not None else ")"))
    if f.note:
        lines.append(f"  note: {f.note}")
    rows = f.evidence[:3] if brief else f.evidence
    if rows:
        if not brief:
            lines.append("  evidence:")
        for e in rows:
            th = f"  (threshold {e.threshold if isinstance(e.threshold, str) else fmt_value(e.threshold, e.unit)})" \
                if e.threshold is not None else ""
            lines.append(f"    {e.name:<34} {fmt_value(e.value, e.unit):>12}{th}  {e.meaning}")
    if f.next_checks and not brief:
        lines.append("  check next:")
        lines.extend(f"    - {c}" for c in f.next_checks)
    return lines
