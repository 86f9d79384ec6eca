"""diag.analysis.report.jsondoc: the report as strict JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.analysis.report import write_report
from support.reportkit import analysis_of
from support.report_workload import sample_diagnosis


def test_json_report(cap: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    write_report(analysis_of(cap, sample_diagnosis()), out, slo={"ttft_p50": 1.0})
    doc = json.loads(out.read_text())
    assert doc["verdict"]["category"] == "queue"
    assert set(doc["percentiles"]) >= {"ttft_s", "itl_s", "tpot_s", "e2e_s"}
    assert doc["percentiles"]["itl_s"]["p50"] == pytest.approx(0.010, rel=1e-3)
    assert doc["slo"][0]["passed"] is True and doc["slo_passed"] is True
    assert "queue" in doc["stages"]
    assert doc["resources"]["device_busy_frac"] == pytest.approx(0.4, abs=0.02)
    # no rules: the decomposition alone
    out2 = tmp_path / "r2.json"
    write_report(analysis_of(cap), out2)
    doc2 = json.loads(out2.read_text())
    assert "verdict" not in doc2 and doc2["requests"] == 40
