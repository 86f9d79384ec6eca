"""samples/<scenario>/: each small capture set names the category it was made to show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.cli import main

SAMPLES = Path(__file__).resolve().parents[4] / "samples"
SCENARIO_SAMPLES = sorted(p for p in SAMPLES.iterdir() if (p / "client" / "meta.json").exists()) if SAMPLES.is_dir() else []


def test_every_scenario_has_a_sample():
    from diag.analysis.scenarios import SCENARIOS

    assert {p.name for p in SCENARIO_SAMPLES} == {s.name for s in SCENARIOS}


@pytest.mark.parametrize("sample", SCENARIO_SAMPLES, ids=lambda p: p.name)
def test_analyze_names_the_samples_category(sample, capsys):
    expected = json.loads((sample / "client" / "meta.json").read_text())["scenario"]["expected_category"]
    assert main(["analyze", str(sample), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["category"] == expected
    assert main(["analyze", str(sample / "client"), "--json"]) == 0  # the client-only half
    from diag.analysis.scenarios.catalog import get

    also = get(sample.name).client_only_also  # what a client is scored right with where it cannot see the cause
    doc = json.loads(capsys.readouterr().out)
    named = (doc["leading_candidate"] or doc["verdict"])["category"]  # client only: maybe under the verdict floor
    assert named in {expected} | also and doc["verdict"]["category"] in {named, "inconclusive"}
    size = sum(f.stat().st_size for f in sample.rglob("*") if f.is_file())
    assert size < 400 * 1024, f"{sample.name} is {size / 1024:.0f} KiB"
