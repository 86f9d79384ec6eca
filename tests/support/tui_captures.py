"""Captures for the TUI tests, built through the real span helpers (imported by conftest and tests)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from collectors.spans import setup_tracing
from diag.ground import stages

MS = 1_000_000


def write_capture(path: Path, phases: list[dict[str, float]], per_phase: int = 30, gap_ms: float = 200.0,
                  base_ns: int | None = None) -> Path:
    """One request every ``gap_ms``; each phase gives its stage durations in ms
    (tokenize, queue, prefill, sample, detokenize) and ``input_tokens``."""
    sink = setup_tracing("ttft-test-engine", capture_dir=path, export_interval_s=0.05)
    t = base_ns if base_ns is not None else time.time_ns() - int(len(phases) * per_phase * gap_ms * MS) - 10**9
    n = 0
    for pi, ph in enumerate(phases):
        for _ in range(per_phase):
            n += 1
            rt = sink.start_request(f"req-{n}", model="tiny", start_ns=t,
                                    attributes={stages.GEN_AI_USAGE_INPUT_TOKENS: int(ph.get("input_tokens", 32)),
                                                stages.GEN_AI_USAGE_OUTPUT_TOKENS: 8,
                                                stages.ATTR_SEGMENT: f"phase{pi}"})
            cur = t
            for st in (stages.TOKENIZE, stages.QUEUE, stages.PREFILL, stages.SAMPLE, stages.DETOKENIZE):
                d = int(ph.get(st, 1.0) * MS)
                rt.record_stage(st, cur, cur + d)
                cur += d
            first = cur
            for k in range(8):
                rt.add_token_time(first + k * 10 * MS)
            end = first + 70 * MS
            sink.record_step(cur - int(ph.get(stages.PREFILL, 1.0) * MS), cur,
                             {stages.ATTR_STEP_PREFILL_TOKENS: int(ph.get("input_tokens", 32)),
                              stages.ATTR_STEP_DECODE_SEQS: 1, stages.ATTR_STEP_KV_USAGE: ph.get("kv", 0.2),
                              stages.ATTR_STEP_WAITING: ph.get("waiting", 0), stages.ATTR_STEP_RUNNING: 2})
            rt.end(end_ns=end)
            t += int(gap_ms * MS)
    sink.shutdown()
    return path


HEALTHY = {stages.TOKENIZE: 1, stages.QUEUE: 2, stages.PREFILL: 20, stages.SAMPLE: 1, stages.DETOKENIZE: 1}
QUEUED = {stages.TOKENIZE: 1, stages.QUEUE: 400, stages.PREFILL: 20, stages.SAMPLE: 1, stages.DETOKENIZE: 1,
          "waiting": 12}


def panel_text(app: Any, widget_type: type) -> str:
    """The panel's current content as plain text (rendered by Rich at the panel's width)."""
    w = app.screen.query_one(widget_type)
    console = Console(width=max(40, w.content_size.width), file=io.StringIO(), record=True, color_system=None)
    console.print(w.render())
    return console.export_text()
