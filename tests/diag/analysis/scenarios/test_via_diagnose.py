"""Scenarios and random draws through ``ttft diagnose`` (diag.analysis.scenarios.via_diagnose): which cases
it can reproduce, how they are scored, and a real run of a catalogue scenario and of the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from diag.analysis.scenarios import get
from diag.analysis.scenarios.calibrate import Calibration, calibrate
from diag.analysis.scenarios.matrix import Verdict
from diag.analysis.scenarios.random_truth import VOID
from diag.analysis.scenarios.via_diagnose import DiagnosedCase, ViaDiagnoseReport, not_applicable, scenarios_via_diagnose

CAL = Calibration(ttft_short_ms=12.0, prefill_ms_per_token=0.12, decode_step_ms=4.0)


def test_cases_diagnose_cannot_reproduce_are_named_with_why() -> None:
    assert "compares engine configurations" in not_applicable(get("comm").build(CAL))  # TP 1 against TP 2
    assert "client's own CPU" in not_applicable(get("loadgen").build(CAL))
    for name in ("queue", "prefix_cache", "head_of_line", "kv_cache"):
        assert not_applicable(get(name).build(CAL)) is None, name


def _case(name, expected, got, ttv, also=frozenset()):  # noqa: ANN001, ANN202
    return DiagnosedCase(name, expected, also, Verdict(got, 0.5, got), probing_s=ttv + 5, time_to_verdict_s=ttv)


def test_the_report_scores_client_only_equivalents_and_leaves_out_skipped_and_void_cases() -> None:
    cases = [_case("a", "queue", "queue", 10.0), _case("b", "queue", "queue", 30.0),
             _case("c", "kv_cache", "queue", 20.0, frozenset({"queue"})),  # not observable from the client
             _case("d", "prefill_compute", "healthy", 8.0),  # a miss: no time counted for it
             _case("e", VOID, "healthy", 5.0),
             DiagnosedCase("f", "comm", skipped="compares engine configurations")]
    rep = ViaDiagnoseReport(cases, "t")
    assert rep.accuracy() == (3, 4)
    times = rep.times_by_class()
    assert times["queue"] == {"median_s": 20.0, "worst_s": 30.0, "n": 2} and "prefill_compute" not in times
    text = rep.format_text()
    assert "MISS" in text.splitlines()[6] and "MISS" not in text.splitlines()[5] and "skipped: compares" in text and "right: 3/4 scored (75%)" in text
    doc = rep.to_dict()
    assert doc["right"] == 3 and doc["cases"][4]["right"] is None and doc["cases"][5]["skipped"]


@pytest.fixture(scope="module")
def calibration():
    cal = calibrate()
    return calibrate() if cal.noisy else cal


@pytest.mark.slow
def test_a_catalogue_scenario_through_diagnose_is_right_within_the_budget(tmp_path, calibration) -> None:
    (case,) = scenarios_via_diagnose([get("queue")], tmp_path, calibration, budget_s=60)
    assert case.verdict is not None and case.ok(), case
    assert case.time_to_verdict_s is not None and case.time_to_verdict_s <= case.probing_s <= 60
    assert (tmp_path / "queue" / "client" / "meta.json").exists()  # one diagnose capture per case
    assert (tmp_path / "queue" / "server" / "spans.otlp.jsonl").exists()  # the engine's, for the truth


@pytest.mark.slow
def test_scenarios_check_via_diagnose_prints_the_table_and_exits_by_the_score(tmp_path, calibration) -> None:
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(calibration.to_dict()))
    res = subprocess.run([sys.executable, "-m", "diag", "scenarios", "check", "--via", "diagnose", "healthy", "comm",
                          "--budget", "40", "--calibration", str(cal), "-o", str(tmp_path / "runs"), "--json"],
                         capture_output=True, text=True, timeout=300)
    doc = json.loads(res.stdout)
    by = {c["name"]: c for c in doc["cases"]}
    assert by["comm"]["skipped"] and by["comm"]["right"] is None
    assert by["healthy"]["verdict"]["category"] and res.returncode == (0 if by["healthy"]["right"] else 1), res.stderr


def test_a_cases_users_say_what_their_probe_steps_send() -> None:
    """--workload for a case: its prompts' range (cycled and injected long ones too; a sweep's
    values are the experiment, not the users') and the prefix they share."""
    from diag.analysis.diagnose.users_workload import UsersWorkload
    from diag.analysis.scenarios.catalog import ProbeStep
    from diag.analysis.scenarios.via_diagnose import users_workload

    assert users_workload([ProbeStep(input_tokens="fixed:16", inject_long=(900, 6))]) == UsersWorkload((16, 900), 0)
    assert users_workload([ProbeStep(input_tokens="uniform:600-900", sweep="prompt", sweep_values=(64.0, 2048.0))]) \
        == UsersWorkload((600, 900), 0)
    assert users_workload([ProbeStep(input_tokens="fixed:792", shared_prefix=(736, 3))]) == UsersWorkload((792, 792), 736)
    assert users_workload([ProbeStep(input_tokens="fixed:32", prompts=((32, 8), (1400, 8)))]).prompt_tokens == (32, 1400)
