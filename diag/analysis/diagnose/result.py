"""What a ``ttft diagnose`` run found: each step as it ran (:class:`StepRecord`) and the run
(:class:`DiagnoseResult`: the final verdict on the whole capture, the stop, the start-up reported
apart, goodput, timing), with the readings over them: the verdict's category and confidence, the
start-up of the first answered request, the time to the verdict. Data and pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.prometheus import SOURCE as PROMETHEUS
from diag.analysis import Analysis
from diag.analysis.diagnose.certainty import Certainty, certainty_of
from diag.analysis.diagnose.design import Step, segment_of
from diag.analysis.diagnose.followups import LONG_LEADS
from diag.analysis.diagnose.ladder import prompt_fit
from diag.analysis.diagnose.points import Point, goodput
from diag.ground.units import json_safe


@dataclass
class StepRecord:
    """One step as it ran: the step, what it showed, the running verdict after it. Times are
    seconds since probing began."""

    index: int
    step: Step
    started_s: float
    point: Point | None = None
    ended_s: float | None = None
    verdict: str | None = None
    confidence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, **self.step.to_dict(), "segment": segment_of(self.step.kind, self.step.value),
                "started_s": round(self.started_s, 3), "ended_s": None if self.ended_s is None else round(self.ended_s, 3),
                "point": self.point.to_dict() if self.point else None, "verdict": self.verdict,
                "confidence": self.confidence}


@dataclass
class DiagnoseResult:
    """What a run found. ``analysis`` is the final verdict on the whole capture (what ``ttft
    analyze CAPTURE`` gives); ``time_to_verdict_s`` is the probing time until the running verdict
    became the final one and stayed."""

    capture: Path
    url: str
    api: str | None
    model: str | None
    records: list[StepRecord]
    stopped: str
    interrupted: bool
    analysis: Analysis | None
    probing_s: float
    time_to_verdict_s: float | None
    requests_sent: int
    notes: list[str] = field(default_factory=list)
    startup: dict[str, Any] = field(default_factory=dict)
    context_limit_tokens: int | None = None

    @property
    def points(self) -> list[Point]:
        return [r.point for r in self.records if r.point is not None]

    def goodput(self) -> dict[str, Any]:
        ramp = "rate" if any(p.kind == "rate" for p in self.points) else "concurrency"
        return goodput(self.points, self.analysis.slo if self.analysis else None, ramp)

    def certainty(self) -> Certainty | None:
        """Whether the final verdict is confident, and if not why and what would decide (None: no verdict)."""
        if self.analysis is None or self.analysis.diagnosis is None:
            return None
        d = self.analysis.diagnosis
        series = self.analysis.tables.series
        scraped = "source" in series.columns and bool((series["source"] == PROMETHEUS).any())
        return certainty_of(d, self.stopped, scraped, int((d.thresholds.get("general") or {}).get("min_requests", 20)))

    def to_dict(self, with_analysis: bool = True) -> dict[str, Any]:
        """The run as JSON: steps, stop, start-up, goodput, timing, and (``with_analysis``) the
        verdict as ``ttft analyze --json`` gives it (else its category and confidence only)."""
        out: dict[str, Any] = {
            "url": self.url, "api": self.api, "model": self.model, "capture": str(self.capture),
            "steps": [r.to_dict() for r in self.records], "stopped": self.stopped, "interrupted": self.interrupted,
            "startup": self.startup, "goodput": self.goodput(), "probing_s": self.probing_s,
            "time_to_verdict_s": self.time_to_verdict_s, "requests_sent": self.requests_sent,
            "context_limit_tokens": self.context_limit_tokens, "notes": self.notes,
        }
        cat, conf = verdict_of(self.analysis)
        out["verdict"] = None if cat is None else {"category": cat, "confidence": conf}
        cert = self.certainty()
        out["certainty"] = None if cert is None else cert.to_dict()
        if with_analysis and self.analysis is not None:
            from diag.analysis.report.jsondoc import analysis_document

            out["analysis"] = analysis_document(self.analysis)  # exactly `ttft analyze --json`
        return json_safe(out)


def verdict_of(analysis: Analysis | None) -> tuple[str | None, float | None]:
    if analysis is None or analysis.diagnosis is None:
        return None, None
    v = analysis.diagnosis.verdict
    return v.category, float(v.confidence)


def named_of(analysis: Analysis | None) -> str | None:
    """The cause the running diagnosis points at (the leading candidate under the verdict floor, else
    the verdict's category): what the plan's follow-ups are chosen to decide. When the load
    generator was the limit (``loadgen``: client timing is invalid), the best-ranked cause beneath
    it that the long ramp decides, else ``loadgen`` itself: the long ramp's count of streams
    decoding at once does not rest on the client's timing as TTFT does."""
    if analysis is None or analysis.diagnosis is None:
        return None
    d = analysis.diagnosis
    if d.leading is None and d.verdict.category == "loadgen":
        return next((f.category for f in d.findings if f.category in LONG_LEADS and f.category != "loadgen"), "loadgen")
    return d.named


def startup_of(analysis: Analysis, points: list[Point], contact_unix_s: float) -> dict[str, Any]:
    """Start-up, reported apart from TTFT: the first answered request (its TTFT, and how long
    after the first contact with the server its answer ended: endpoint detection and the
    compatibility check go first) against what a warm server takes for that prompt (the TTFT the
    prompt fit of the baseline and ladder predicts for its token count, else the baseline's median)."""
    base = next((p for p in points if p.kind == "baseline"), None)
    req = analysis.tables.requests
    if base is None or base.ttft_p50_s is None or len(req) == 0 or "ttft_s" not in req.columns:
        return {}
    answered = req[req["ttft_s"].notna()]
    if len(answered) == 0:
        return {}
    first = answered.sort_values("start_ns").iloc[0]  # the first answered (a refused compat check is not)
    ttft = float(first["ttft_s"])
    tokens = first.get("input_tokens")
    fit = prompt_fit(points)
    if fit is not None and tokens is not None and tokens == tokens:
        warm, how = max(0.0, fit[1] + fit[0] * float(tokens)), f"the prompt fit at {float(tokens):.0f} tokens"
    else:
        warm, how = base.ttft_p50_s, "the baseline's median"
    out = {"first_ttft_s": ttft, "warm_ttft_s": warm, "warm_from": how, "penalty_s": max(0.0, ttft - warm),
           "first_segment": str(first.get("segment") or "")}
    start = first.get("start_ns")
    if start is not None and start == start:
        # time before the first answered request could be sent (endpoint detection, a refused
        # compatibility check: requests that waited for a starting server but carry no TTFT)
        out["waited_before_first_s"] = max(0.0, float(start) / 1e9 - contact_unix_s)
    out["startup_s"] = out.get("waited_before_first_s", 0.0) + out["penalty_s"]
    return out


def time_to_verdict(records: list[StepRecord], final: str | None) -> float | None:
    """Probing seconds until the running verdict became ``final`` and stayed."""
    if final is None:
        return None
    t = None
    for r in records:
        if r.verdict == final:
            if t is None:
                t = r.ended_s
        else:
            t = None
    return t


__all__ = ["DiagnoseResult", "StepRecord", "named_of", "startup_of", "time_to_verdict", "verdict_of"]
