"""tui.model: the verdict panel takes rules.Diagnosis as it is, and reads like every other renderer."""

from __future__ import annotations

from pathlib import Path

from diag.analysis import analyze_paths
from rules.features import Feature, Features
from diag.analysis.report.text import format_diagnosis
from rules import Diagnosis, Evidence, Finding, Skipped
from tui import adapters
from tui.model import verdict_vm


def _diagnosis() -> Diagnosis:
    v = Finding("queue", "queue", "Requests wait for the scheduler", 0.82, 0.0099, 41.0,
                [Evidence("queue share of TTFT", 0.6, 0.3, "share", "most of TTFT is waiting", ">=", True),
                 Evidence("device busy", 0.41, 0.5, "share", "the device is mostly idle", "<", False),
                 Evidence("queue p50", 0.010, None, "s", "context")],
                ["queue wait share"], "a note")
    other = Finding("prefill_compute", "prefill_compute", "TTFT grows with prompt length", 0.4, 0.004, 7.0, [], [])
    return Diagnosis(v, [v, other], [Skipped("comm", "skipped: needs comm spans")],
                     Features({"ttft_p95_s": Feature("ttft_p95_s", 0.024, "s", True)}))


def test_verdict_vm_formats_a_real_diagnosis() -> None:
    vm = verdict_vm(_diagnosis())
    assert (vm.title, vm.category, vm.rule_id, vm.confidence) == ("Requests wait for the scheduler", "queue", "queue", 0.82)
    assert vm.explained == "explains 9.9 ms (41% of TTFT p95)"
    rows = [(e.name, e.value, e.threshold, e.mark) for e in vm.evidence]
    assert rows == [("queue share of TTFT", "60%", "≥ 30%", "✓ crossed"),
                    ("device busy", "41%", "< 50%", "✗ not crossed"),
                    ("queue p50", "10.0 ms", "", "")]
    assert [(o.category, o.explained) for o in vm.others] == [("prefill_compute", "7.0%")]
    assert vm.skipped == ["comm: skipped: needs comm spans"] and vm.note == "a note" and not vm.failed


def test_the_same_evidence_row_reads_the_same_in_the_tui_and_in_analyze() -> None:
    d = _diagnosis()
    text = format_diagnosis(d)
    for e in verdict_vm(d).evidence:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(e.name))
        assert e.value in line and e.threshold in line and e.mark in line and e.meaning in line


def test_pending_and_failed_rules() -> None:
    assert verdict_vm(None).pending
    vm = verdict_vm(None, "rules failed: RulesFileError: bad.toml: line 3")
    assert vm.failed and not vm.pending and "bad.toml" in vm.note


def test_run_rules_returns_the_rules_diagnosis(queue_capture: Path) -> None:
    tables = analyze_paths([queue_capture], run_rules=False).tables
    run = adapters.run_rules(tables, None)
    assert isinstance(run.diagnosis, Diagnosis) and run.error == ""
    assert run.diagnosis.verdict.category == "queue"
    assert run.requests == run.total >= 59  # every request the window holds (the rules cap is 20,000)


def test_refusals_at_a_recorded_context_limit_are_not_counted_as_errors() -> None:
    import pandas as pd

    from diag.ground.tables import Tables
    from tui.model import latency_vm
    from tui.prepared import Prepared

    n = 8
    req = pd.DataFrame({"start_ns": [1.7e18 + i * 1e8 for i in range(n)],
                        "ttft_s": [0.02] * 4 + [float("nan")] * 4, "warmup": [False] * n,
                        "segment": ["prompt=512"] * 4 + ["prompt=1024"] * 4,
                        "error": [None] * 4 + ["http_4xx"] * 3 + ["http_5xx"]})

    def vm(meta: dict):
        tables = Tables(requests=req, steps=pd.DataFrame(columns=["start_ns"]), cold_starts=pd.DataFrame(),
                        spans=pd.DataFrame(), series=pd.DataFrame(columns=["ts_s", "source", "series", "entity", "value"]),
                        meta=meta)
        p = Prepared(tables)
        return latency_vm(p, slice(0, n), (int(1.7e18), int(1.7e18 + n * 1e8)))[0]

    limited = vm({"probe": {"context_limit": {"refused_segments": ["prompt=1024"]}}})
    assert (limited.requests, limited.errors, limited.over_context) == (4, 1, 3)  # the 503 stays an error
    plain = vm({})  # a length the user chose: its refusals are errors
    assert (plain.requests, plain.errors, plain.over_context) == (4, 4, 0)
