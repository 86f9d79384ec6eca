"""diag.analysis.report.gather: what a report shows, taken from the analysis and its rules.Diagnosis as they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.analysis.report import build_report
from support.reportkit import analysis_of
from rules.features import Feature
from support.report_workload import sample_diagnosis


def test_the_report_holds_the_rules_objects(cap: Path) -> None:
    d = sample_diagnosis()
    r = build_report(analysis_of(cap, d), {"ttft_p99": 10.0})
    assert r.verdict is d.verdict and r.findings == d.findings[1:] and r.skipped == d.skipped
    assert r.verdict_line == "verdict: queue - Requests wait for the scheduler (confidence 82%)"
    assert r.prompt_fit is not None and r.prompt_fit[:2] == pytest.approx((0.02e-3, 11e-3))
    assert r.prompt_fit[2] == "rules' fit: 0.02 ms/token, R\u00b2 0.25"
    assert r.feature("concurrency_knee") == 2.0 and r.feature("not_a_feature") is None
    assert [s.key for s in r.slo] == ["ttft_p99"] and r.slo[0].passed
    assert r.latency_rows()[0][0] == "TTFT" and r.latency_rows()[0][1] == 40


def test_cold_start_outliers_get_a_note(cap: Path) -> None:
    d = sample_diagnosis()
    d.features.add(Feature("cold_start_outliers_n", 2.0, "requests", True))
    r = build_report(analysis_of(cap, d))
    assert any(n.startswith("2 cold-start outlier request(s)") for n in r.notes)
    assert not any("outlier" in n for n in d.notes)  # the diagnosis itself is left as it is


def test_without_rules_the_largest_stage_is_named(cap: Path) -> None:
    r = build_report(analysis_of(cap))
    assert r.verdict is None and r.findings == [] and r.skipped == []
    assert r.verdict_line.startswith("no verdict (rule engine not run); largest stage: ")
    assert r.prompt_fit is not None and r.prompt_fit[2].startswith("least-squares fit, all requests")


def test_refusals_at_a_designed_experiments_context_limit_are_not_counted_as_failed(tmp_path: Path) -> None:
    import json

    from support.report_workload import Workload, write_capture

    w = Workload(n=12, segment=lambda i: "prompt=1024" if i >= 10 else "prompt=256",
                 error=lambda i: "http_4xx" if i >= 9 else None)  # one refusal at 256: the server failing
    cap = write_capture(tmp_path / "cap", w)
    meta = json.loads((cap / "meta.json").read_text())
    meta["probe"] = {"context_limit": {"refused_segments": ["prompt=1024"], "refused_prompt_tokens": 1024,
                                       "context_limit_tokens": 512}}
    (cap / "meta.json").write_text(json.dumps(meta))
    r = build_report(analysis_of(cap))
    assert r.resources["errors"] == 1 and r.resources["over_context"] == 2
    assert r.context["errors"] == {"http_4xx": 1} and r.context["over_context"] == 2
