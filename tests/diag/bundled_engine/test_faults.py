"""Fault injection: parsing, and each injection moves the stage it targets (measured, not faked)."""

from __future__ import annotations

import time

import pytest

from diag.ground import stages
from diag.bundled_engine import FaultError, SamplingParams, SyncEventStream, build_engine, parse_injections
from diag.bundled_engine.faults import FaultConfig, fault_from_mapping
from support.engine_testutil import finished_spans, spans_by_request

PROMPT = "the server and the queue and the cache " * 6  # ~50 tokens


def test_parse_injections():
    f = parse_injections(["scheduler_stall_ms=20", "load_delay_s=0.5", "scheduler_stall_ms=30"])
    assert f.scheduler_stall_ms == 30 and f.load_delay_s == 0.5
    assert f.active() == {"scheduler_stall_ms": 30.0, "load_delay_s": 0.5}
    assert parse_injections(None) == FaultConfig()
    assert fault_from_mapping({"tokenize_ms_per_token": 2}).tokenize_ms_per_token == 2


@pytest.mark.parametrize(
    "item,msg",
    [
        ("bogus=1", "unknown fault 'bogus'; known: tokenize_ms_per_token"),
        ("scheduler_stall_ms", "expected NAME=VALUE"),
        ("scheduler_stall_ms=abc", "is not a number"),
        ("scheduler_stall_ms=-1", "must be between 0 and"),
        ("load_delay_s=inf", "must be between 0 and"),
    ],
)
def test_bad_injections_have_clear_messages(item, msg):
    with pytest.raises(FaultError, match=msg) as ei:
        parse_injections([item])
    assert "\n" not in str(ei.value)


def test_collective_latency_needs_tp():
    with pytest.raises(ValueError, match="needs --tp 2"):
        build_engine(model="tiny", faults=parse_injections(["collective_latency_ms=5"]), start=False)


def _stage_s(engine, stage: str) -> float:
    """Mean duration (s) of ``stage`` over 2 fresh requests."""
    before = {s.context.span_id for s in finished_spans(engine)}
    for _ in range(2):
        s = SyncEventStream()
        engine.submit(s.push, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), prompt=PROMPT)
        list(s)
    spans = [s for s in finished_spans(engine) if s.context.span_id not in before]
    durs = [by[stage][0].end_time - by[stage][0].start_time for by in spans_by_request(spans).values()]
    assert len(durs) == 2
    return sum(durs) / len(durs) / 1e9


@pytest.mark.parametrize(
    "fault,stage,at_least_s",
    [
        ("tokenize_ms_per_token=2", stages.TOKENIZE, 0.09),  # ~50 tokens x 2 ms
        ("scheduler_stall_ms=120", stages.QUEUE, 0.11),
        ("detokenize_ms_per_token=80", stages.DETOKENIZE, 0.075),
    ],
)
def test_each_injection_moves_its_stage(traced_engine, fault, stage, at_least_s):
    base = _stage_s(traced_engine, stage)
    eng = build_engine(model="tiny", trace_memory=True, warmup=False, faults=parse_injections([fault]))
    try:
        slow = _stage_s(eng, stage)
    finally:
        eng.shutdown()
    assert slow >= at_least_s
    assert slow - base >= at_least_s * 0.9


def test_load_delay_moves_cold_start():
    eng = build_engine(model="tiny", trace_memory=True, warmup=False, faults=parse_injections(["load_delay_s=0.3"]))
    try:
        cold = [s for s in finished_spans(eng) if s.name == stages.SPAN_COLD_START]
        load = [s for s in cold if s.attributes[stages.ATTR_COLD_START_PHASE] == "load"][0]
        assert (load.end_time - load.start_time) / 1e9 >= 0.3
        assert eng.cold_start_s["load"] >= 0.3
    finally:
        eng.shutdown()


def test_network_delay_is_parsed_and_bounded():
    assert parse_injections(["network_delay_ms=150"]).network_delay_ms == 150.0
    with pytest.raises(FaultError, match="network_delay_ms must be between 0 and"):
        parse_injections(["network_delay_ms=-5"])


async def _timed_stream(url: str, max_tokens: int) -> tuple[int, list[int], str]:
    """(send Unix ns, Unix ns of each content chunk, request id) of one streamed completion."""
    import json

    import aiohttp

    async with aiohttp.ClientSession() as s:
        t0 = time.time_ns()
        async with s.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
                                                         "ignore_eos": True, "temperature": 0.0}) as r:
            assert r.status == 200
            times = []
            async for line in r.content:
                if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                    times.append(time.time_ns())
            return t0, times, r.headers["X-Request-Id"]


def test_network_delay_moves_client_ttft_not_itl_nor_the_step_loop():
    import asyncio
    import statistics

    from diag.bundled_engine import ServerThread

    delay_s = 0.15
    eng = build_engine(model="tiny", trace_memory=True,
                       faults=parse_injections([f"network_delay_ms={delay_s * 1e3:g}"]))
    gaps, server_gaps, client_itl = [], [], []
    with ServerThread(eng) as st:
        for _ in range(3):
            t0, times, rid = asyncio.run(_timed_stream(st.url, 12))
            root = [s for s in finished_spans(eng) if s.name == stages.SPAN_REQUEST
                    and s.attributes[stages.ATTR_REQUEST_ID] == rid][0]
            server_ttft = (root.attributes[stages.ATTR_FIRST_TOKEN_NS] - root.start_time) / 1e9
            gaps.append((times[0] - t0) / 1e9 - server_ttft)
            tt = list(root.attributes[stages.ATTR_TOKEN_TIMES_NS])
            server_gaps += [(b - a) / 1e9 for a, b in zip(tt, tt[1:])]
            client_itl += [(b - a) / 1e9 for a, b in zip(times, times[1:])]
        t_np = time.perf_counter()  # a non-streamed response is late by the delay too
        rid = asyncio.run(_post_plain(st.url))
        plain_s = time.perf_counter() - t_np
        root = [s for s in finished_spans(eng) if s.name == stages.SPAN_REQUEST
                and s.attributes[stages.ATTR_REQUEST_ID] == rid][0]
        server_e2e_s = (root.end_time - root.start_time) / 1e9
        steps = [s for s in finished_spans(eng) if s.name == stages.SPAN_ENGINE_STEP]
    # the network gap (client TTFT - server TTFT) is the delay, plus a few ms of HTTP
    assert delay_s <= statistics.median(gaps) < delay_s + 0.08, gaps
    # pipelined: chunks keep their spacing, they do not queue behind each other's delay
    assert statistics.median(client_itl) < statistics.median(server_gaps) + 0.02 < delay_s / 3
    assert max(server_gaps) < delay_s  # the step loop never waited for the network
    assert statistics.median((s.end_time - s.start_time) / 1e9 for s in steps) < delay_s / 5
    assert plain_s - server_e2e_s >= delay_s


async def _post_plain(url: str) -> str:
    """Request id of one non-streamed completion."""
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200
            return (await r.json())["id"].removeprefix("cmpl-")


def test_network_delay_is_recorded_in_meta(tmp_path):
    import json

    eng = build_engine(model="tiny", warmup=False, capture_dir=tmp_path / "cap",
                       faults=parse_injections(["network_delay_ms=40"]))
    eng.shutdown()
    meta = json.loads((tmp_path / "cap" / "meta.json").read_text())
    assert meta["faults_injected"] == {"network_delay_ms": 40.0}


def test_disconnect_during_a_delayed_stream_frees_blocks():
    import asyncio

    import aiohttp

    from diag.bundled_engine import ServerThread

    eng = build_engine(model="tiny", trace_memory=True, warmup=False, faults=parse_injections(["network_delay_ms=100"]))
    with ServerThread(eng) as st:
        async def go():
            async with aiohttp.ClientSession() as s:
                r = await s.post(st.url + "/v1/completions",
                                 json={"prompt": "long story " * 20, "max_tokens": 400, "stream": True, "ignore_eos": True})
                await r.content.readline()  # the first (delayed) chunk arrived
                r.close()

        asyncio.run(go())
        deadline = time.time() + 10
        while time.time() < deadline and eng.stats()["requests"]:
            time.sleep(0.02)
        stats = eng.stats()
        assert stats["requests"] == 0 and stats["kv_free_blocks"] == stats["kv_total_blocks"]
    assert any(s.name == stages.SPAN_REQUEST and s.attributes.get(stages.ATTR_ERROR) == "disconnect"
               for s in finished_spans(eng))
