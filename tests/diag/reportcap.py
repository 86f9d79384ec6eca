"""Captures for the report/diff tests, written through the real span helpers.

Times are synthetic (no sleeping): request ``i`` arrives ``gap_ms`` after request ``i-1``;
its stages follow back to back; engine steps carry the batch make-up. Also a stand-in
for ``rules.Diagnosis`` (the rule engine's contract) so the report/diff layout is tested
independently of the rules' thresholds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.spans import setup_tracing
from diag import stages

MS = 1_000_000
EVIL = "<script>alert(1)</script>"
T0 = 1_700_000_000_000_000_000


@dataclass
class Workload:
    n: int = 40
    gap_ms: float = 50.0
    tokenize_ms: float = 1.0
    queue_ms: float = 5.0
    prefill_ms_per_token: float = 0.02
    comm_ms: float = 0.0
    sample_ms: float = 0.2
    detok_ms: float = 0.1
    itl_ms: float = 10.0
    output_tokens: int = 8
    service: str = "ttft-engine"
    model: str = "tiny-llama"
    request_id: Callable[[int], str] = lambda i: f"req-{i}"
    segment: Callable[[int], str | None] = lambda i: None
    error: Callable[[int], str | None] = lambda i: None
    steps: bool = True
    stage_spans: bool = True
    side: str = "server"


def write_capture(path: Path, w: Workload | None = None) -> Path:
    """Write one capture directory for workload ``w``; returns its path."""
    w = w or Workload()
    sink = setup_tracing(service_name=w.service, capture_dir=path)
    for i in range(w.n):
        start = T0 + int(i * w.gap_ms * MS)
        prompt = 100 + 37 * (i % 10)
        attrs: dict[str, object] = {stages.GEN_AI_USAGE_INPUT_TOKENS: prompt}
        seg = w.segment(i)
        if seg is not None:
            attrs[stages.ATTR_SEGMENT] = seg
        req = sink.start_request(w.request_id(i), model=w.model, start_ns=start, attributes=attrs, side=w.side)
        t = float(start)
        plan = [("tokenize", w.tokenize_ms), ("queue", w.queue_ms * (1 + i % 3)),
                ("prefill", prompt * w.prefill_ms_per_token + w.comm_ms), ("sample", w.sample_ms), ("detokenize", w.detok_ms)]
        for name, ms in plan:
            if w.stage_spans:
                req.record_stage(name, int(t), int(t + ms * MS))
                if name == "prefill" and w.comm_ms:
                    req.record_stage("comm", int(t), int(t + w.comm_ms * MS))
            t += ms * MS
        err = w.error(i)
        if err is None:
            for k in range(w.output_tokens):
                req.add_token_time(int(t + k * w.itl_ms * MS))
            req.set_attributes({stages.GEN_AI_USAGE_OUTPUT_TOKENS: w.output_tokens})
        end = int(t + max(w.output_tokens - 1, 0) * w.itl_ms * MS)
        req.end(end_ns=end, error=err)
        if w.steps:
            sink.record_step(int(start), int(start + 20 * MS), {
                stages.ATTR_STEP_PREFILL_TOKENS: prompt, stages.ATTR_STEP_DECODE_SEQS: i % 4,
                stages.ATTR_STEP_KV_USAGE: min(0.99, 0.1 + 0.02 * i), stages.ATTR_STEP_WAITING: i % 5,
                stages.ATTR_STEP_RUNNING: 1 + i % 4,
            })
    sink.shutdown()
    return path


# --- a stand-in for rules.Diagnosis (the contract the rule engine implements) ----------------


@dataclass
class Evidence:
    name: str
    value: Any
    threshold: Any
    unit: str
    meaning: str


@dataclass
class Finding:
    rule_id: str
    category: str
    title: str
    confidence: float
    explained_s: float | None
    explained_pct: float | None
    evidence: list[Evidence] = field(default_factory=list)
    next_checks: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Skipped:
    rule_id: str
    reason: str


@dataclass
class Feature:
    name: str
    value: Any
    unit: str
    available: bool
    reason: str | None = None
    source: str | None = None


class Features:
    def __init__(self, items: dict[str, Feature]) -> None:
        self.items = items

    def get(self, name: str) -> Feature:
        return self.items.get(name) or Feature(name, None, "", False, "not computed")

    def to_dict(self) -> dict[str, Any]:
        return {k: {"value": f.value, "unit": f.unit, "available": f.available} for k, f in self.items.items()}


@dataclass
class FakeDiagnosis:
    verdict: Finding
    findings: list[Finding]
    skipped: list[Skipped]
    features: Features

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        return {"verdict": {"category": v.category, "confidence": v.confidence, "title": v.title},
                "findings": [{"category": f.category, "title": f.title} for f in self.findings],
                "skipped": [{"rule_id": s.rule_id, "reason": s.reason} for s in self.skipped]}

    def format_text(self) -> str:
        return f"verdict: {self.verdict.category}"


def fake_diagnosis(evil: str = "") -> FakeDiagnosis:
    verdict = Finding(
        "queue", "queue", f"Requests wait for the scheduler{evil}", 0.82, 0.0099, 41.0,
        [Evidence("queue share of TTFT (median)", 0.6, 0.3, "ratio", f"most of TTFT is waiting{evil}"),
         Evidence("device busy", 0.41, "< 0.5", "ratio", "the device is mostly idle"),
         Evidence("queue p50", 0.010, 0.005, "s", "")],
        ["queue wait share", f"CPU profile of the serving process{evil}"],
        note=f"confidence lowered: no NVML{evil}",
    )
    other = Finding("prefill_compute", "prefill_compute", "TTFT grows with prompt length", 0.4, 0.004, 17.0,
                    [Evidence("slope", 0.02, 0.01, "ms/token", "ms per prompt token")], ["prompt-length slope"])
    feats = Features({
        "ttft_prompt_slope_ms_per_token": Feature("ttft_prompt_slope_ms_per_token", 0.02, "ms/token", True),
        "ttft_prompt_intercept_ms": Feature("ttft_prompt_intercept_ms", 11.0, "ms", True),
        "ttft_prompt_r2": Feature("ttft_prompt_r2", 0.25, "", True),
        "concurrency_knee": Feature("concurrency_knee", 2.0, "requests", True),
    })
    return FakeDiagnosis(verdict, [verdict, other], [Skipped("comm", f"needs comm spans (TP > 1){evil}")], feats)
