"""The OpenAI-compatible server: the openai client, SSE, errors, metrics, traceparent, overload, disconnects."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diag.ground import stages
from diag.bundled_engine import METRIC_NAMES, ServerThread, build_engine, parse_injections
from support.engine_testutil import finished_spans


@pytest.fixture(scope="module")
def server():
    eng = build_engine(model="tiny", trace_memory=True, max_context=512, max_running=16)
    st = ServerThread(eng).start()
    yield st
    st.stop()


def _wait_idle(engine, timeout_s: float = 20.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        s = engine.stats()
        if s["requests"] == 0 and s["waiting"] == 0 and s["kv_free_blocks"] == s["kv_total_blocks"]:
            return
        time.sleep(0.02)


async def _post(url: str, body, headers=None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        async with s.post(url, data=data, headers=headers or {"Content-Type": "application/json"}) as r:
            return r.status, await r.read()


def post(url, body, headers=None):
    return asyncio.run(_post(url, body, headers))


def test_openai_client_streams_chat_and_completions(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Why is TTFT high?"}], max_tokens=8,
            stream=True, stream_options={"include_usage": True}, temperature=0.0,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["length"], ["stop"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 8
    assert all(c.usage is None for c in chunks[:-1])

    comp = list(client.completions.create(model="tiny", prompt="Hello there", max_tokens=5, stream=True,
                                          stream_options={"include_usage": True}, temperature=0.0))
    assert "".join(c.choices[0].text for c in comp if c.choices)
    assert comp[-1].usage.prompt_tokens > 0

    full = client.completions.create(model="tiny", prompt="Hello there", max_tokens=5, temperature=0.0)
    assert full.choices[0].text == "".join(c.choices[0].text for c in comp if c.choices)  # greedy: same text
    assert full.usage.completion_tokens == comp[-1].usage.completion_tokens
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 4
    assert [m.id for m in client.models.list().data] == ["tiny"]


@pytest.mark.parametrize(
    "path,body,status,msg",
    [
        ("/v1/completions", b"{not json", 400, "invalid JSON body"),
        ("/v1/completions", b"", 400, "body is empty"),
        ("/v1/completions", [1, 2], 400, "must be a JSON object"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400, "'max_tokens' must be an integer"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "'max_tokens' must be an integer in [1"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 600}, 400, "maximum context length is 512"),
        ("/v1/completions", {"prompt": "", "max_tokens": 5}, 400, "'prompt' must not be empty"),
        ("/v1/completions", {"prompt": 5}, 400, "'prompt' must be a string"),
        ("/v1/completions", {"max_tokens": 5}, 400, "'prompt' is required"),
        ("/v1/completions", {"prompt": "word " * 600, "max_tokens": 5}, 400, "maximum context length is 512"),
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "'temperature' must be a number"),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "'top_p' must be in (0, 1]"),
        ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "'stream' must be a boolean"),
        ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "'n' must be 1"),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404, "model 'gpt-9' not found"),
        ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be a non-empty list"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "string 'role'"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}, 400, "no content"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400, "content must be a string"),
        ("/v1/completions", {"prompt": "hi", "response_format": "json"}, 400, "'response_format' must be an object"),
        ("/v1/completions", {"prompt": "hi", "response_format": {"type": "grammar"}}, 400, "'response_format.type' must"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
            "type": "json_schema", "json_schema": {"name": "x"}}}, 400, "json_schema.schema' must be"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                "a": {"oneOf": [{"type": "string"}]}}}}}}, 400, "schema.properties.a.type must be one of"),
        ("/v1/completions", {"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "string", "pattern": "(x|y)"}}}}, 400, "groups and alternation"),
    ],
)
def test_bad_requests_get_one_line_4xx(server, path, body, status, msg):
    got, raw = post(server.url + path, body)
    assert got == status, raw
    assert b"\n" not in raw
    err = json.loads(raw)["error"]
    assert msg in err["message"] and err["code"] == status


def test_body_limit_is_413(server):
    big = json.dumps({"prompt": "x" * (5 * 1024 * 1024), "max_tokens": 1})
    got, raw = post(server.url + "/v1/completions", big)
    assert got == 413 and "larger than" in json.loads(raw)["error"]["message"]


def test_health_models_and_metrics(server):
    async def get(path):
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url + path) as r:
                return r.status, await r.text()

    assert asyncio.run(get("/health"))[0] == 200
    models = json.loads(asyncio.run(get("/v1/models"))[1])
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 512
    post(server.url + "/v1/completions", {"prompt": "metrics please", "max_tokens": 3})
    status, text = asyncio.run(get("/metrics"))
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    names = set()
    for f in fams.values():
        names.add(f.name + ("_total" if f.type == "counter" else ""))
    assert set(METRIC_NAMES) <= names, set(METRIC_NAMES) - names

    def value(name, suffix=""):
        fam = fams[name]
        return sum(s.value for s in fam.samples if s.name == name + suffix)

    assert value("ttft_engine:kv_cache_bytes_per_token") == 2048
    assert value("ttft_engine:prompt_tokens", "_total") > 0
    assert value("ttft_engine:generation_tokens", "_total") >= 3
    assert value("ttft_engine:time_to_first_token_seconds", "_count") >= 1
    assert value("ttft_engine:request_queue_time_seconds", "_count") >= 1
    assert value("ttft_engine:request_prefill_time_seconds", "_count") >= 1
    assert value("ttft_engine:e2e_request_latency_seconds", "_count") >= 1
    assert value("ttft_engine:inter_token_latency_seconds", "_count") >= 2
    assert 0.0 <= value("ttft_engine:kv_cache_usage_perc") <= 1.0


def test_traceparent_joins_the_callers_trace(server):
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    got, raw = post(server.url + "/v1/completions", {"prompt": "trace me", "max_tokens": 2},
                    headers={"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{parent_id}-01"})
    assert got == 200
    rid = json.loads(raw)["id"].removeprefix("cmpl-")
    roots = [s for s in finished_spans(server.engine)
             if s.name == stages.SPAN_REQUEST and s.attributes.get(stages.ATTR_REQUEST_ID) == rid]
    assert len(roots) == 1
    assert format(roots[0].context.trace_id, "032x") == trace_id
    assert format(roots[0].parent.span_id, "016x") == parent_id


def test_client_disconnect_mid_stream_frees_blocks(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            r = await s.post(server.url + "/v1/completions",
                             json={"prompt": "long story " * 20, "max_tokens": 400, "stream": True, "ignore_eos": True})
            await r.content.readline()  # first chunk arrived: the request is running
            r.close()  # drop the connection mid-stream

    asyncio.run(go())
    _wait_idle(server.engine, 10)
    st = server.engine.stats()
    assert st["requests"] == 0 and st["kv_free_blocks"] == st["kv_total_blocks"]
    spans = finished_spans(server.engine)
    assert any(s.name == stages.SPAN_REQUEST and s.attributes.get(stages.ATTR_ERROR) == "disconnect" for s in spans)


def test_overload_gives_503_and_never_hangs():
    eng = build_engine(model="tiny", warmup=False, max_waiting=2, max_running=1,
                       faults=parse_injections(["scheduler_stall_ms=30"]))
    with ServerThread(eng) as st:
        async def go():
            async with aiohttp.ClientSession() as s:
                async def one():
                    async with s.post(st.url + "/v1/completions", json={"prompt": "busy", "max_tokens": 4}) as r:
                        return r.status, await r.json()
                return await asyncio.wait_for(asyncio.gather(*[one() for _ in range(12)]), 60)

        results = asyncio.run(go())
    statuses = [r[0] for r in results]
    assert 503 in statuses and 200 in statuses and set(statuses) <= {200, 503}
    msg = [r[1]["error"]["message"] for r in results if r[0] == 503][0]
    assert "overloaded" in msg


async def _hammer(url: str, n: int, concurrency: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"done": 0, "cut_stream": 0, "cut_early": 0, "cut_blocking": 0}
    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(force_close=True, limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one(i: int) -> None:
            mode = rng.choice(["done", "cut_stream", "cut_stream", "cut_early", "cut_blocking"])
            body = {"prompt": "tell me about the queue " * rng.randint(1, 8), "max_tokens": rng.randint(1, 24),
                    "stream": mode != "cut_blocking", "ignore_eos": True}
            async with sem:
                if mode in ("cut_early", "cut_blocking"):
                    try:
                        await asyncio.wait_for(s.post(url, json=body), rng.uniform(0.0005, 0.05))
                    except asyncio.TimeoutError:
                        pass
                    counts[mode] += 1
                    return
                r = await s.post(url, json=body)
                if mode == "cut_stream":
                    for _ in range(rng.randint(0, 3)):
                        await r.content.readline()
                    r.close()
                else:
                    await r.read()
                    r.release()
                counts[mode] += 1

        await asyncio.gather(*[one(i) for i in range(n)])
    return counts


@pytest.mark.slow
def test_thousand_requests_with_random_disconnects_free_every_block():
    eng = build_engine(model="tiny", warmup=False, max_running=32, kv_blocks=256, max_waiting=2000)
    with ServerThread(eng) as st:
        counts = asyncio.run(_hammer(st.url + "/v1/completions", 1000, 48, seed=3))
        assert sum(counts.values()) == 1000 and counts["cut_stream"] > 100
        _wait_idle(eng, 60)
        s = eng.stats()
        assert s["requests"] == 0 and s["running"] == 0 and s["waiting"] == 0
        assert eng.blocks.num_free_blocks == eng.blocks.num_blocks == 256
        assert eng.metrics.aborted._value.get() > 0  # disconnects really aborted requests


def test_hundred_requests_with_random_disconnects_free_every_block(server):
    counts = asyncio.run(_hammer(server.url + "/v1/completions", 100, 24, seed=5))
    assert sum(counts.values()) == 100
    _wait_idle(server.engine, 30)
    st = server.engine.stats()
    assert st["requests"] == 0 and st["kv_free_blocks"] == st["kv_total_blocks"]


def test_a_kv_cache_smaller_than_the_context_states_what_it_holds_and_refuses_past_it_as_too_long():
    """8 blocks of 16 tokens under --max-context 512: the engine serves 128 tokens, says so in
    /v1/models, and refuses a longer request in the words a context-limit parser reads."""
    from collectors.probe.context_limit import refused_as_too_long, stated_limit_tokens

    st = ServerThread(build_engine(model="tiny", max_context=512, kv_blocks=8, block_size=16)).start()
    try:
        async def models():
            async with aiohttp.ClientSession() as s, s.get(st.url + "/v1/models") as r:
                return await r.json()

        assert asyncio.run(models())["data"][0]["max_model_len"] == 128
        ok, _ = post(st.url + "/v1/completions", {"prompt": "short one", "max_tokens": 4})
        status, raw = post(st.url + "/v1/completions", {"prompt": "many words " * 80, "max_tokens": 4})
        message = json.loads(raw)["error"]["message"]
        assert ok == 200 and refused_as_too_long(status, message) and stated_limit_tokens(message) == 128, message
    finally:
        st.stop()


WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["oslo", "rome"]}, "temp": {"type": "integer", "minimum": -40, "maximum": 50},
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["city", "temp", "code"], "additionalProperties": False}


def _weather_format(schema=WEATHER):
    return {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}


def test_response_format_constrains_chat_and_streamed_completions(server):
    import jsonschema

    got, raw = post(server.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "weather?"}], "max_tokens": 80, "seed": 1,
        "response_format": _weather_format()})
    assert got == 200, raw
    choice = json.loads(raw)["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), WEATHER)

    async def stream():
        async with aiohttp.ClientSession() as s:
            async with s.post(server.url + "/v1/completions", json={
                    "prompt": "weather:", "max_tokens": 80, "stream": True, "seed": 2,
                    "response_format": _weather_format()}) as r:
                return r.status, await r.text()

    status, body = asyncio.run(stream())
    assert status == 200
    chunks = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    jsonschema.validate(json.loads("".join(c["choices"][0]["text"] for c in chunks)), WEATHER)
    got, raw = post(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2, "response_format": {"type": "text"}})
    assert got == 200
    roots = [sp for sp in finished_spans(server.engine) if sp.name == stages.SPAN_REQUEST]
    assert [sp.attributes[stages.ATTR_GRAMMAR_CACHE_HIT] for sp in roots if stages.ATTR_GRAMMAR_KEY in sp.attributes][-2:] \
        == [False, True]
    assert stages.ATTR_GRAMMAR_KEY not in roots[-1].attributes


@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_that_fails_to_compile_is_a_400(server, monkeypatch, stream):
    import diag.bundled_engine.grammar as grammar

    monkeypatch.setattr(grammar, "MAX_DFA_STATES", 10)
    schema = {**WEATHER, "description": f"fails {stream}"}
    got, raw = post(server.url + "/v1/completions", {"prompt": "x", "max_tokens": 8, "stream": stream,
                                                     "response_format": _weather_format(schema)})
    assert got == 400 and b"\n" not in raw
    err = json.loads(raw)["error"]
    assert "cannot compile the grammar" in err["message"] and err["param"] == "response_format"
    _wait_idle(server.engine, 10)
    assert server.engine.stats()["requests"] == 0
