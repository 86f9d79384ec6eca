"""benchmarks/gpu_check.sh, its CPU-side parts: the summary, the NVML report, the scenario
sizing for a device, the script's usage errors, and (slow) a whole ``--cpu`` run in which one
step times out and the rest still run and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpu_check_steps as steps  # benchmarks/ (on pytest's pythonpath)
import gpu_check_summary as summary

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

PLANNED = ["env", "gpu_tests", "engine_tp1", "engine_tp2", "engine_pp2", "nvml", "tracing", "probe_overhead",
           "scenarios"]


# --- the summary -----------------------------------------------------------------------------


def _records(tmp_path: Path) -> Path:
    (tmp_path / "env.log").write_text("torch 2.11.0+cu130\n\x1b[32mgpu_count 1\x1b[0m\n")
    (tmp_path / "tracing.log").write_text("".join(f"line {i}\n" for i in range(100)))
    lines = [
        {"step": "env", "status": "ok", "rc": 0, "wall_s": 3, "timeout_s": 45, "note": "", "log": str(tmp_path / "env.log")},
        {"step": "gpu_tests", "status": "skipped", "note": "skipped: no GPU"},
        {"step": "engine_tp1", "status": "failed", "rc": 2, "wall_s": 4, "timeout_s": 75, "note": "exit status 2",
         "log": str(tmp_path / "absent.log")},
        {"step": "tracing", "status": "timeout", "rc": 124, "wall_s": 45, "timeout_s": 45,
         "note": "timed out after 45 s", "log": str(tmp_path / "tracing.log")},
    ]
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    return path


def test_summary_has_a_section_per_planned_step_and_counts_failures(tmp_path):
    out = tmp_path / "out" / "gpu_check_summary.md"
    rc = summary.main(["--records", str(_records(tmp_path)), "--planned", ",".join(PLANNED), "--mode", "cpu",
                       "--budget-s", "120", "--total-wall-s", "52", "--header", "gpus=0", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    status = {s["step"]: s["status"] for s in doc["steps"]}
    assert [s["step"] for s in doc["steps"]][:len(PLANNED)] == PLANNED
    assert status["env"] == "ok" and status["gpu_tests"] == "skipped"
    assert status["engine_tp1"] == "failed" and status["tracing"] == "timeout"
    assert status["nvml"] == "not run"  # planned, never recorded: the script stopped before it
    assert status["record-line-5"] == "failed"  # the unreadable line is reported, not dropped
    assert doc["counts"] == {"ok": 1, "failed": 2, "timeout": 1, "skipped": 1, "not run": 5}
    assert not doc["all_passed"] and doc["within_budget"]
    md = out.read_text()
    for i, name in enumerate(PLANNED, 1):
        assert f"## {i}. {name}: {status[name]}" in md
    assert "gpu_count 1" in md and "\x1b" not in md  # the log tail, colours removed
    tail = next(s for s in doc["steps"] if s["step"] == "tracing")["tail"]
    assert tail[-1] == "line 99" and len(tail) == summary.TAIL_LINES
    assert "- total wall time: 52.0 s of a 120 s budget (within)" in md


def test_summary_says_when_the_budget_was_overrun(tmp_path):
    doc = summary.build([{"step": "env", "status": "ok", "wall_s": 500}], ["env"], "gpu", 480, None, {})
    assert doc["total_wall_s"] == 500 and not doc["within_budget"] and doc["all_passed"]
    assert "(OVER)" in summary.to_markdown(doc)


# --- the NVML report: every counter's value, or why it is not sampled -------------------------


def test_nvml_report_names_every_series_for_every_gpu():
    from support.fake_pynvml import make_fake  # the hardware boundary: a fake pynvml

    from collectors.nvml import NvmlSampler
    from diag.ground import stages as S

    fake, clock = make_fake(3)  # gpu2: no power reading, no NVLink, no GPM
    s = NvmlSampler(nvml=fake, clock=clock)
    for _ in range(4):
        s.sample_once()
        clock.advance(0.1)
    series = tuple(getattr(S, n) for n in steps.NVML_SERIES)
    lines = steps.nvml_report(s, s.collect(), series)
    s.stop()
    blocks: dict[str, list[str]] = {}
    for line in lines:
        if not line.startswith(" "):
            blocks[line.split(":")[0]] = []
        else:
            blocks[list(blocks)[-1]].append(line.strip())
    assert set(blocks) == {"gpu0", "gpu1", "gpu2"}
    for gpu, rows in blocks.items():
        named = [r.split()[0] for r in rows]
        assert all(x in named for x in series), gpu  # each series has its line
    power = {g: next(r for r in rows if r.startswith(S.SERIES_POWER_W)) for g, rows in blocks.items()}
    assert "350" in power["gpu0"] and "rows" in power["gpu0"]
    assert "not sampled" in power["gpu2"] and "NOT_SUPPORTED" in power["gpu2"]
    gpm = next(r for r in blocks["gpu2"] if r.startswith(S.SERIES_SM_UTIL_PCT))
    assert "not sampled" in gpm


# --- the catalogue on a device -----------------------------------------------------------------


def test_scenarios_run_on_the_device_and_multi_gpu_ones_are_known():
    from diag.analysis.scenarios import SCENARIOS, Calibration

    cal = Calibration(ttft_short_ms=8.0, prefill_ms_per_token=0.02, decode_step_ms=4.0, device="cuda")
    for sc in SCENARIOS:
        plan, moved = sc.build(cal), steps.on_device(sc, "cuda").build(cal)
        assert moved.slo == plan.slo and moved.injected == plan.injected
        assert len(moved.phases) == len(plan.phases)
        for before, after in zip(plan.phases, moved.phases):
            assert after.serve_args == (*before.serve_args, "--device", "cuda") and after.steps == before.steps
        args = [a for ph in plan.phases for a in ph.serve_args]
        multi = any(args[i] in ("--tp", "--pp") and int(args[i + 1]) > 1 for i in range(len(args) - 1))
        assert (steps.gpus_needed(plan) > 1) == multi, sc.name
    assert steps.gpus_needed(next(s for s in SCENARIOS if s.name == "comm").build(cal)) == 2


# --- the script --------------------------------------------------------------------------------


@pytest.mark.parametrize("args, says", [(["--bogus"], "unknown argument '--bogus'"),
                                        (["--cpu", "--budget-s", "soon"], "--budget-s must be whole seconds"),
                                        (["--steps", "env,nvlm"], "unknown step 'nvlm' in --steps"),
                                        (["--steps"], "--steps needs a value")])
def test_script_usage_errors_are_one_line(tmp_path, args, says):
    r = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path), *args], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and says in r.stderr
    assert not (tmp_path / "gpu_check_summary.md").exists()


@pytest.mark.slow
def test_cpu_run_every_step_reports_and_a_timed_out_step_does_not_stop_the_rest(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_TIMEOUT_TRACING="1")
    r = subprocess.run(["nice", "-n", "15", "bash", str(SCRIPT), "--cpu", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    doc = json.loads((tmp_path / "gpu_check_summary.json").read_text())
    md = (tmp_path / "gpu_check_summary.md").read_text()
    status = {s["step"]: s for s in doc["steps"]}
    assert list(status) == PLANNED, r.stderr[-2000:]
    assert r.returncode == 1  # one step timed out
    assert status["tracing"]["status"] == "timeout" and status["tracing"]["timeout_s"] == 1
    # the steps before and after it ran and said what they found
    for name in ("env", "engine_tp1", "nvml", "probe_overhead"):
        assert status[name]["status"] == "ok", (name, status[name]["tail"])
    assert any(l.startswith("gpu_count 0") for l in status["env"]["tail"])
    assert any(l.startswith("verdict: ") for l in status["engine_tp1"]["tail"])
    assert any("NVML" in l for l in status["nvml"]["tail"])
    assert any(l.startswith("probe ") and "ms" in l for l in status["probe_overhead"]["tail"])
    for name in ("gpu_tests", "engine_tp2", "engine_pp2", "scenarios"):
        assert status[name]["status"] == "skipped"
    assert "no GPU" in status["gpu_tests"]["note"] and "2 GPUs" in status["engine_tp2"]["note"]
    assert doc["within_budget"] and doc["budget_s"] == 120
    for i, name in enumerate(PLANNED, 1):
        assert f"## {i}. {name}: " in md
    log = (tmp_path / "gpu_check.log").read_text()
    assert "== tracing: timeout" in log and "== probe_overhead: ok" in log


def test_engine_step_reports_what_nvml_saw_alongside_the_probe(tmp_path):
    from support.fake_pynvml import make_fake

    from collectors.nvml import NvmlSampler
    from diag.ground.capture import CaptureWriter

    assert "no series" in steps._gpu_during(tmp_path)
    fake, clock = make_fake(1)
    s = NvmlSampler(nvml=fake, clock=clock)
    for _ in range(3):
        s.sample_once()
        clock.advance(0.1)
    w = CaptureWriter(tmp_path / "client", meta={})
    w.append_series("nvml", s.collect())
    w.close()
    s.stop()
    line = steps._gpu_during(tmp_path / "client")
    assert "gpu_util_pct mean 87.0 max 87.0" in line and "power_w mean 350.0" in line


@pytest.mark.slow
def test_gpu_mode_without_a_gpu_says_so_for_every_gpu_step(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(["nice", "-n", "15", "bash", str(SCRIPT), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1, r.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu_check_summary.json").read_text())
    status = {s["step"]: s for s in doc["steps"]}
    assert list(status) == PLANNED and doc["mode"] == "gpu" and doc["budget_s"] == 420
    assert status["env"]["status"] in ("ok", "failed")  # it ran: what is missing is its finding
    assert any("nvidia-smi: not found" in l for l in status["env"]["tail"])
    for name in PLANNED[1:]:
        assert status[name]["status"] == "skipped" and "torch sees none" in status[name]["note"], name
