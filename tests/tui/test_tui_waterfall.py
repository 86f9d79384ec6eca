"""tui.waterfall: one request's spans as rows, its facts formatted by diag.ground.units."""

from __future__ import annotations

from pathlib import Path

from diag.analysis import analyze_paths
from tui.waterfall import request_waterfall


def test_waterfall_rows_and_facts(queue_capture: Path) -> None:
    tables = analyze_paths([queue_capture], run_rules=False).tables
    slow = tables.requests.sort_values("ttft_s").iloc[-1]
    vm = request_waterfall(tables, str(slow["trace_id"]))
    names = [r.name for r in vm.rows]
    assert {"queue", "prefill", "tokenize"} <= set(names)
    queue = next(r for r in vm.rows if r.name == "queue")
    assert abs(queue.duration_s - 0.400) < 1e-6 and queue.depth >= 1
    facts = dict(vm.facts)
    assert facts["TTFT"].endswith(" ms") and facts["input tokens"] == "32"
    assert vm.first_token_s is not None and len(vm.token_offsets_s) == 8


def test_unknown_trace_is_an_empty_waterfall(queue_capture: Path) -> None:
    tables = analyze_paths([queue_capture], run_rules=False).tables
    vm = request_waterfall(tables, "0" * 32)
    assert vm.rows == [] and vm.facts == [] and vm.title == f"request {'0' * 16}"
