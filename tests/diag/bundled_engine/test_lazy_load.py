"""``--lazy-load``: the server answers while the model loads; requests wait, then run normally."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp

from diag.ground import stages
from diag.bundled_engine import SamplingParams, ServerThread, SyncEventStream, build_engine, parse_injections
from support.engine_testutil import finished_spans, serve_process



def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _stream_ttft(url: str, prompt: str = "hello there", max_tokens: int = 4) -> tuple[float, str]:
    """(client TTFT s: send -> first content chunk, request id) of one streamed completion."""
    async with aiohttp.ClientSession() as s:
        t0 = time.perf_counter()
        async with s.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                                                         "ignore_eos": True, "temperature": 0.0}) as r:
            assert r.status == 200, await r.text()
            ttft = None
            async for line in r.content:
                if line.startswith(b"data: {") and ttft is None and json.loads(line[6:])["choices"][0]["text"]:
                    ttft = time.perf_counter() - t0
            assert ttft is not None
            return ttft, r.headers["X-Request-Id"]


def _spans(cap: Path) -> list[dict]:
    return [s for line in (cap / "spans.otlp.jsonl").read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def _attr(span: dict, key: str):
    for a in span.get("attributes", []):
        if a["key"] == key:
            v = a["value"]
            return next(iter(v.values()))
    return None


def test_serve_lazy_load_subprocess(tmp_path):
    """The scenario runner's use: probe as soon as the listening line appears."""
    cap = tmp_path / "cap"
    cmd = [sys.executable, "-m", "diag", "serve", "--port", "0", "--lazy-load", "--inject", "load_delay_s=1.5",
           "--capture", str(cap)]
    with serve_process(cmd) as (proc, line):
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = m.group(1)
        first = asyncio.run(asyncio.wait_for(_stream_ttft_with_health(url), 60))
        (ttft1, rid1), health_while_loading = first
        ttft2, rid2 = asyncio.run(_stream_ttft(url))
        assert _get(url + "/health")[0] == 200
    rc = proc.returncode
    assert rc == 0, proc.stderr.read()
    assert health_while_loading == (503, "loading")
    assert ttft1 >= 1.5 - 0.1  # it waited for the load (minus what passed before it was sent)
    assert ttft2 < 0.5  # the next one runs at engine speed
    spans = _spans(cap)
    by_rid = {_attr(s, stages.ATTR_REQUEST_ID): s for s in spans if s["name"] == stages.SPAN_REQUEST}
    root = by_rid[rid1]
    server_ttft_s = (int(_attr(root, stages.ATTR_FIRST_TOKEN_NS)) - int(root["startTimeUnixNano"])) / 1e9
    queue = [s for s in spans if s["name"] == stages.QUEUE and s["traceId"] == root["traceId"]]
    assert len(queue) == 1
    queue_s = (int(queue[0]["endTimeUnixNano"]) - int(queue[0]["startTimeUnixNano"])) / 1e9
    assert server_ttft_s >= 1.3 and queue_s >= 0.8 * server_ttft_s
    cold = {_attr(s, stages.ATTR_COLD_START_PHASE): s for s in spans if s["name"] == stages.SPAN_COLD_START}
    assert set(cold) == {"load", "warmup"}
    load_s = (int(cold["load"]["endTimeUnixNano"]) - int(cold["load"]["startTimeUnixNano"])) / 1e9
    assert load_s >= 1.5
    assert json.loads((cap / "meta.json").read_text())["faults_injected"] == {"load_delay_s": 1.5}


async def _stream_ttft_with_health(url: str) -> tuple[tuple[float, str], tuple[int, str]]:
    task = asyncio.ensure_future(_stream_ttft(url))
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/health") as r:
            health = (r.status, (await r.json())["status"])
    return await task, health


def test_waiting_requests_count_and_a_disconnect_while_loading_frees_everything():
    eng = build_engine(model="tiny", trace_memory=True, lazy_load=True, faults=parse_injections(["load_delay_s=1.0"]))
    with ServerThread(eng) as st:
        assert eng.state == "loading"

        async def go():
            async with aiohttp.ClientSession() as s:
                keep = asyncio.ensure_future(s.post(st.url + "/v1/completions", json={"prompt": "wait for me", "max_tokens": 3}))
                gone = asyncio.ensure_future(s.post(st.url + "/v1/completions", json={"prompt": "I leave", "max_tokens": 3}))
                await asyncio.sleep(0.3)
                async with s.get(st.url + "/metrics") as r:
                    metrics = await r.text()
                gone.cancel()  # the client goes away while the model loads
                r = await keep
                return metrics, r.status, await r.json()

        metrics, status, body = asyncio.run(go())
        assert status == 200 and body["usage"]["completion_tokens"] >= 1
        assert re.search(r'ttft_engine:num_requests_waiting\{model_name="tiny"\} 2\.0', metrics), metrics
        deadline = time.time() + 10
        while time.time() < deadline and (eng.stats()["requests"] or eng.stats()["waiting"]):
            time.sleep(0.02)
        st_ = eng.stats()
        assert st_["requests"] == 0 and st_["waiting"] == 0 and st_["kv_free_blocks"] == st_["kv_total_blocks"]
        roots = [s for s in finished_spans(eng) if s.name == stages.SPAN_REQUEST]
        assert sorted(s.attributes.get(stages.ATTR_ERROR, "") for s in roots) == ["", "disconnect"]


def test_failed_load_gives_503_with_the_reason(monkeypatch):
    import diag.bundled_engine.engine_load as engine_mod

    def broken(*a, **k):
        time.sleep(0.3)
        raise OSError("weights unreadable:\nmodel.safetensors is truncated")

    monkeypatch.setattr(engine_mod, "make_runner", broken)
    eng = build_engine(model="tiny", trace_memory=True, lazy_load=True)
    with ServerThread(eng) as st:
        async def go():
            async with aiohttp.ClientSession() as s:
                async with s.post(st.url + "/v1/completions", json={"prompt": "queued", "max_tokens": 3, "stream": True}) as r:
                    return r.status, await r.json()

        status, body = asyncio.run(go())  # sent while loading, answered when it failed
        assert status == 503
        msg = body["error"]["message"]
        assert msg == "model failed to load: weights unreadable: model.safetensors is truncated"
        assert eng.state == "failed"
        code, health = _get(st.url + "/health")
        assert code == 503 and health == {"status": "failed", "error": msg}
        code, later = asyncio.run(_post_json(st.url + "/v1/completions", {"prompt": "later", "max_tokens": 2}))
        assert code == 503 and later["error"]["message"] == msg
    roots = [s for s in finished_spans(eng) if s.name == stages.SPAN_REQUEST]
    assert roots and all(s.attributes[stages.ATTR_ERROR] == "http_503" for s in roots)


async def _post_json(url: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=body) as r:
            return r.status, await r.json()


def test_serve_keeps_answering_after_a_failed_lazy_load(monkeypatch):
    import diag.bundled_engine.engine_load as engine_mod
    from diag.bundled_engine import EngineConfig, serve

    monkeypatch.setattr(engine_mod, "make_runner", lambda *a, **k: (_ for _ in ()).throw(OSError("no disk")))
    stop = threading.Event()
    box: dict = {}
    failed = threading.Event()
    t = threading.Thread(target=serve, args=(EngineConfig(model="tiny", lazy_load=True),),
                         kwargs=dict(port=0, stop_event=stop, on_ready=lambda srv: box.setdefault("srv", srv),
                                     on_load_failed=lambda exc: (box.setdefault("exc", exc), failed.set())))
    t.start()
    try:
        assert failed.wait(20)
        assert str(box["exc"]) == "no disk"
        code, health = _get(box["srv"].url + "/health")
        assert code == 503 and health["status"] == "failed" and "no disk" in health["error"]
    finally:
        stop.set()
        t.join(30)
    assert not t.is_alive()


def test_eager_load_is_unchanged():
    eng = build_engine(model="tiny", warmup=False)
    try:
        assert eng.state == "ready" and eng.ready
    finally:
        eng.shutdown()
    assert eng.state == "stopped"


def test_shutdown_during_a_long_lazy_load_is_prompt():
    t0 = time.perf_counter()
    eng = build_engine(model="tiny", lazy_load=True, faults=parse_injections(["load_delay_s=60"]))
    stream = SyncEventStream()
    eng.submit(stream.push, SamplingParams(max_tokens=2), prompt="never runs")
    time.sleep(0.2)
    eng.shutdown()
    assert eng.state == "stopped" and eng.load_error is None
    last = stream.get(5)
    assert last.finished and last.finish_reason == "error" and "shut down" in (last.error or "")
    assert time.perf_counter() - t0 < 10
