"""The probe waits, bounded, for a server that is still starting (``--wait-ready``): refused
connections as vLLM gives while it loads (its port bound, not yet listening), HTTP 503 "Loading
model" as llama.cpp's server gives (on every path, or only on generation in older builds). The
run then completes, meta.json ``probe.ready`` says what was seen for how long, and the analysis
reports it as start-up, apart from TTFT."""

from __future__ import annotations

import json
import time

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe
from diag.analysis import analyze_paths

LOAD_S = 1.5


def _probe(url: str, tmp_path, wait_s: float, api: str | None = "completions", n: int = 3, **kw):
    cfg = ProbeConfig(url, api=api, load=LoadSpec(concurrency=1, requests=n, warmup_requests=0),
                      workload=WorkloadSpec(LengthSpec.parse("32"), LengthSpec.parse("4")), timeout_s=5.0,
                      output=tmp_path / "cap", wait_ready_s=wait_s, **kw)
    return run_probe(cfg)


def _ready_meta(tmp_path) -> dict:
    return json.loads((tmp_path / "cap" / "meta.json").read_text())["probe"]["ready"]


def test_refused_while_loading_is_waited_for_and_reported_apart(listening_after, tmp_path) -> None:
    lines: list[str] = []
    with listening_after(LOAD_S) as url:
        res = _probe(url, tmp_path, wait_s=20, on_wait=lines.append)
    assert [r.error for r in res.results] == [None] * 3
    ready = _ready_meta(tmp_path)
    assert ready["ready"] and ready["seen"] == ["connection refused"]
    assert LOAD_S - 0.3 <= ready["not_serving_s"] < LOAD_S + 3
    assert len(lines) == 1 and "connection refused" in lines[0] and "waiting up to 20 s" in lines[0]
    assert any("not serving for" in n for n in res.notes)
    analysis = analyze_paths([tmp_path / "cap"])
    assert analysis.diagnosis.features.value("cold_start_not_serving_s") >= LOAD_S - 0.3
    note = next(n for n in analysis.diagnosis.notes if "not serving for" in n)
    assert "(connection refused)" in note and note.endswith("not TTFT")


def test_llama_cpp_loading_503_is_waited_for(server, tmp_path) -> None:
    server.loading_until = time.monotonic() + LOAD_S
    res = _probe(server.url("loading"), tmp_path, wait_s=20, api=None)
    assert [r.error for r in res.results] == [None] * 3 and res.endpoint.model == "fake-model"
    ready = _ready_meta(tmp_path)
    assert ready["seen"] == ["HTTP 503: Loading model"] and ready["not_serving_s"] >= LOAD_S - 0.3


def test_generation_503_after_models_answer_is_sent_again(server, tmp_path) -> None:
    # older llama.cpp builds let /v1/models through while loading and 503 the rest
    server.loading_until = time.monotonic() + LOAD_S
    res = _probe(server.url("loading-gen"), tmp_path, wait_s=20, api=None)
    assert res.endpoint.api == "completions" and res.endpoint.detected
    assert [r.error for r in res.results] == [None] * 3
    assert _ready_meta(tmp_path)["seen"] == ["HTTP 503 to /v1/completions: Loading model"]
    # with --api given there is no detection: the compatibility check's warm-up is sent again
    server.reset()
    server.loading_until = time.monotonic() + LOAD_S
    res = _probe(server.url("loading-gen"), tmp_path / "api", wait_s=20, api="completions")
    assert [r.error for r in res.results] == [None] * 3
    assert any("Loading model" in s for s in _ready_meta(tmp_path / "api")["seen"])


def test_the_wait_is_bounded_and_says_so(refused_url, tmp_path) -> None:
    t0 = time.monotonic()
    res = _probe(refused_url, tmp_path, wait_s=1.0, n=2)
    assert time.monotonic() - t0 < 8
    assert [r.error for r in res.results] == ["connect_refused"] * 2
    ready = _ready_meta(tmp_path)
    assert not ready["ready"] and ready["seen"] == ["connection refused"] and ready["waited_s"] >= 0.9
    assert any("still not serving after" in n and "--wait-ready 1" in n for n in res.notes)


def test_a_serving_server_is_not_delayed(server, tmp_path) -> None:
    res = _probe(server.url("ok"), tmp_path, wait_s=20)
    ready = _ready_meta(tmp_path)
    assert ready["ready"] and ready["polls"] == 1 and ready["seen"] == [] and ready["not_serving_s"] == 0
    assert not any("not serving" in n for n in res.notes)
    assert [r.error for r in res.results] == [None] * 3
