"""Captures for the report/diff tests, written through the real span helpers.

Times are synthetic (no sleeping): request ``i`` arrives ``gap_ms`` after request ``i-1``;
its stages follow back to back; engine steps carry the batch make-up.
:func:`sample_diagnosis` builds a real :class:`rules.Diagnosis` by hand, so the report/diff
layout is tested independently of the rules' thresholds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collectors.spans import setup_tracing
from diag.ground import stages
from rules.features import Feature, Features
from rules import Diagnosis, Evidence, Finding, Skipped

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


# --- a hand-made rules.Diagnosis -------------------------------------------------------------


def finding(category: str, title: str, confidence: float = 0.8, evidence: list[Evidence] | None = None,
            next_checks: list[str] | None = None, explained_s: float | None = 0.05,
            explained_pct: float | None = 50.0, note: str | None = None) -> Finding:
    """A :class:`rules.Finding` whose rule id is its category."""
    return Finding(category, category, title, confidence, explained_s, explained_pct,
                   evidence if evidence is not None else [Evidence("x", 1.0, 0.5, "share", "m", ">=", True)],
                   next_checks if next_checks is not None else ["check"], note)


def diagnosis_of(verdict: Finding, others: list[Finding] | None = None, skipped: list[Skipped] | None = None,
                 features: dict[str, Feature] | None = None) -> Diagnosis:
    """A :class:`rules.Diagnosis` with ``verdict`` first among its findings."""
    return Diagnosis(verdict, [verdict, *(others or [])], list(skipped or []), Features(dict(features or {})))


def sample_diagnosis(evil: str = "") -> Diagnosis:
    """A queue verdict with numeric, text and context evidence, one other finding, one skipped rule;
    ``evil`` is appended to every string that could come from a trace or a rule."""
    verdict = finding(
        "queue", f"Requests wait for the scheduler{evil}", 0.82,
        [Evidence("queue share of TTFT (median)", 0.6, 0.3, "share", f"most of TTFT is waiting{evil}", ">=", True),
         Evidence("device busy", 0.41, "< 0.5", "share", "the device is mostly idle"),
         Evidence("queue p50", 0.010, None, "s", "")],
        ["queue wait share", f"CPU profile of the serving process{evil}"],
        explained_s=0.0099, explained_pct=41.0, note=f"confidence lowered: no NVML{evil}",
    )
    other = finding("prefill_compute", "TTFT grows with prompt length", 0.4,
                    [Evidence("slope", 0.02, 0.01, "ms/token", "ms per prompt token", ">=", True)],
                    ["prompt-length slope"], explained_s=0.004, explained_pct=17.0)
    feats = {f.name: f for f in (
        Feature("ttft_prompt_slope_ms_per_token", 0.02, "ms/token", True),
        Feature("ttft_prompt_intercept_ms", 11.0, "ms", True),
        Feature("ttft_prompt_r2", 0.25, "share", True),
        Feature("concurrency_knee", 2.0, "requests", True),
    )}
    return diagnosis_of(verdict, [other], [Skipped("comm", f"needs comm spans (TP > 1){evil}")], feats)
