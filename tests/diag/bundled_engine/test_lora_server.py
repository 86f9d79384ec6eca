"""LoRA adapters over HTTP: /v1/models lists them, a request's ``model`` picks one, ``ttft serve
--lora-modules`` serves them, and the probe's lora sweep sees the waits for a slot."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diag.ground import stages
from diag.bundled_engine import ServerThread, build_engine
from support.engine_testutil import LAUNCH, finished_spans, serve_process


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def server():
    st = ServerThread(build_engine(model="tiny", trace_memory=True, lora_modules=("a", "b"), max_loras=1)).start()
    yield st
    st.stop()


def test_models_list_the_adapters_under_the_base_model(server):
    data = json.loads(_get(server.url + "/v1/models"))["data"]
    assert [m["id"] for m in data] == ["tiny", "a", "b"]
    assert data[0]["parent"] is None and {m["parent"] for m in data[1:]} == {"tiny"}
    assert all(m["root"] for m in data[1:])


def test_a_request_naming_an_adapter_runs_with_it_and_says_so(server):
    status, body = _post(server.url + "/v1/completions", {"model": "a", "prompt": "hi there", "max_tokens": 3})
    assert status == 200 and body["model"] == "a" and body["usage"]["completion_tokens"] >= 1
    status, body = _post(server.url + "/v1/chat/completions", {"model": "b", "max_tokens": 3,
                                                               "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["model"] == "b"
    status, body = _post(server.url + "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert status == 200 and body["model"] == "tiny"
    status, body = _post(server.url + "/v1/completions", {"model": "c", "prompt": "hi", "max_tokens": 2})
    assert status == 404 and body["error"]["message"] == (
        "model 'c' not found; this server serves 'tiny' and the LoRA adapters 'a', 'b'")
    roots = [dict(s.attributes) for s in finished_spans(server.engine) if s.name == stages.SPAN_REQUEST]
    assert [r.get(stages.ATTR_LORA_NAME) for r in roots[-3:]] == ["a", "b", None]
    fams = {f.name: f for f in text_string_to_metric_families(_get(server.url + "/metrics"))}
    info = fams["ttft_engine:lora_requests_info"].samples
    assert len(info) == 1 and info[0].labels["max_lora"] == "1"
    loads = [s for s in fams["ttft_engine:lora_load_time_seconds"].samples if s.name.endswith("_count")]
    assert sum(s.value for s in loads) >= 2


def test_ttft_serve_lora_modules_serves_an_adapter(tmp_path):
    cmd = [sys.executable, "-c", LAUNCH, "serve", "--port", "0", "--lora-modules", "a", "b", "--max-loras", "1"]
    with serve_process(cmd) as (proc, line):
        assert line.endswith("(model=tiny, device=cpu, tp=1, lora=a,b in 1 slot)\n"), (line, proc.poll())
        url = line.split()[4]
        assert [m["id"] for m in json.loads(_get(url + "/v1/models"))["data"]] == ["tiny", "a", "b"]
        status, body = _post(url + "/v1/completions", {"model": "a", "prompt": "hello", "max_tokens": 4,
                                                       "ignore_eos": True})
        assert status == 200 and body["model"] == "a" and body["usage"]["completion_tokens"] == 4
    assert proc.returncode == 0, proc.stderr.read()


@pytest.mark.slow
def test_the_probe_s_lora_sweep_sees_the_second_adapter_wait_for_the_slot(tmp_path):
    """Two adapters, one slot, 4 streams: the mix's TTFT beyond the one-adapter control's, and within the
    mix the requests sent while only the other adapter ran are the slow ones."""
    from diag.ground.capture import load_capture
    from diag.cli import main
    from diag.ground.tables import build_tables

    cmd = [sys.executable, "-c", LAUNCH, "serve", "--port", "0", "--lora-modules", "a", "b", "--max-loras", "1"]
    cap = tmp_path / "cap"
    with serve_process(cmd) as (proc, line):
        url = line.split()[4]
        assert main(["probe", url, "--lora", "a,b", "-c", "4", "-n", "24", "-o", str(cap), "--no-progress"]) == 0
    req = build_tables(load_capture(cap)).requests
    req = req.loc[~req["warmup"] & req["error"].isna()]
    by_seg = req.groupby("segment")["ttft_s"]
    assert set(by_seg.groups) == {"lora=1", "lora=2"} and by_seg.count().min() == 24
    assert by_seg.mean()["lora=2"] > 1.5 * by_seg.mean()["lora=1"], by_seg.describe()
    mix = req.loc[req["segment"] == "lora=2"].groupby("lora_role")["ttft_s"].median()
    assert mix["other"] > 2 * mix["joins"], mix
