"""The diagnosis matrix: each scenario, run for real on the bundled engine, gets its verdict,
server-side and client-only. Fast scenarios run by default; all run in CI (-m "not gpu")."""

from __future__ import annotations

import pytest

from diag.analysis import analyze_paths
from diag.scenarios import MODES, SCENARIOS, calibrate, diagnose_run, run_scenario


@pytest.fixture(scope="session")
def calibration(tmp_path_factory):
    return calibrate(cache=tmp_path_factory.mktemp("cal") / "calibration.json")


def _params():
    for sc in SCENARIOS:
        marks = [] if sc.fast else [pytest.mark.slow]
        yield pytest.param(sc, id=sc.name, marks=marks)


@pytest.mark.parametrize("scenario", list(_params()))
def test_scenario_gets_its_verdict_server_side_and_client_only(scenario, calibration, tmp_path):
    run = run_scenario(scenario, tmp_path / scenario.name, calibration)
    verdicts = {mode: diagnose_run(run, mode) for mode in MODES}
    assert {m: v.category for m, v in verdicts.items()} == {m: scenario.category for m in MODES}, verdicts
    assert verdicts["server"].confidence >= verdicts["client-only"].confidence - 1e-9
    # the verdict carries its evidence, and the capture says what was injected
    a = analyze_paths(run.all_captures)
    assert a.diagnosis.verdict.evidence
    assert a.tables.meta["scenario"]["expected_category"] == scenario.category
    if scenario.category != "healthy":
        assert a.diagnosis.verdict.next_checks
