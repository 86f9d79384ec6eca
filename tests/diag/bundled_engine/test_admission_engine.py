"""Admission policies on the running engine (tiny model, CPU): head-of-line blocking under fcfs
and its relief by skip-blocked; KV reservation serialising requests while KV usage stays low."""

from __future__ import annotations

import threading
import time

import pytest

from diag.ground import stages
from diag.bundled_engine import build_engine
from diag.bundled_engine.outputs import SyncEventStream
from diag.bundled_engine.sampler import SamplingParams
from support.engine_testutil import finished_spans

pytestmark = pytest.mark.slow


def _gauge(engine, reason: str) -> float:
    v = engine.metrics.registry.get_sample_value(
        "ttft_engine:num_requests_waiting_by_reason", {"model_name": engine.model_name, "reason": reason})
    return v or 0.0


def _first_token_times(engine, prompts: dict[str, tuple[int, int]], given: bool = True) -> dict[str, float]:
    """Submit each name -> (prompt tokens, max_tokens) at once; wait for all; name -> first token time (s)."""
    streams = {}
    first: dict[str, float] = {}
    for name, (n, mx) in prompts.items():
        s = SyncEventStream()

        def push(ev, s=s, name=name):  # on the loop thread, when the event is made
            first.setdefault(name, time.monotonic())
            s.push(ev)

        engine.submit(push, SamplingParams(max_tokens=mx, ignore_eos=True, temperature=0.0),
                      prompt_ids=[(7 * i + len(name)) % 200 + 1 for i in range(n)], max_tokens_given=given)
        streams[name] = s
    for name, s in streams.items():
        while True:
            ev = s.get(60)
            if ev.finished:
                assert ev.finish_reason == "length", ev
                break
    return first


def _blocked_head(admission: str) -> tuple[dict[str, float], float, float]:
    """16 blocks of 16 tokens. A running 64-token request decoding 120 tokens holds 5-12 blocks; a
    180-token prompt (12 blocks) cannot fit beside it; three 8-token prompts (1 block each) can.
    Returns (first token times, the hog's end time, head_of_line gauge seen while waiting)."""
    eng = build_engine(model="tiny", kv_blocks=16, block_size=16, max_context=256, admission=admission)
    try:
        hog = SyncEventStream()
        eng.submit(hog.push, SamplingParams(max_tokens=120, ignore_eos=True, temperature=0.0),
                   prompt_ids=list(range(1, 65)))
        hog.get(60)  # its first token: it is running
        hol_seen = 0.0
        out: dict[str, float] = {}
        t = threading.Thread(target=lambda: out.update(_first_token_times(
            eng, {"long": (180, 2), "s0": (8, 2), "s1": (8, 2), "s2": (8, 2)})))
        t.start()
        while True:
            ev = hog.get(60)
            hol_seen = max(hol_seen, _gauge(eng, "head_of_line"))
            if ev.finished:
                hog_end = time.monotonic()
                break
        t.join(60)
        return out, hog_end, hol_seen
    finally:
        eng.shutdown()


def test_fcfs_holds_short_prompts_behind_a_head_that_does_not_fit():
    first, hog_end, hol = _blocked_head("fcfs")
    assert all(first[f"s{i}"] >= hog_end for i in range(3)), (first, hog_end)
    assert hol == 3  # the gauge names them: they would fit, they wait behind the head


def test_skip_blocked_admits_them_past_the_head():
    first, hog_end, hol = _blocked_head("skip-blocked")
    assert all(first[f"s{i}"] < hog_end for i in range(3)), (first, hog_end)
    assert first["long"] >= hog_end and hol == 0


@pytest.mark.parametrize("kv_admission,given,most", [("on-demand", False, 4), ("reserve", False, 2),
                                                     ("reserve", True, 4)])
def test_reserve_without_max_tokens_runs_requests_in_turn_at_low_kv_usage(kv_admission, given, most):
    # 32 blocks of 16, context 256 (16 blocks): reserving the context, two requests fit at a time
    eng = build_engine(model="tiny", trace_memory=True, kv_blocks=32, block_size=16, max_context=256,
                       kv_admission=kv_admission)
    try:
        _first_token_times(eng, {f"r{i}": (16, 12) for i in range(4)}, given=given)
        steps = [s for s in finished_spans(eng) if s.name == stages.SPAN_ENGINE_STEP]
        running = max(s.attributes[stages.ATTR_STEP_RUNNING] for s in steps)
        usage = max(s.attributes[stages.ATTR_STEP_KV_USAGE] for s in steps)
        assert running == most
        assert usage <= 8 / 32  # at most 4 requests x 2 blocks (28 tokens) in use
        if most == 2:
            waited = [s.attributes[stages.ATTR_STEP_WAITING] for s in steps]
            assert max(waited) >= 1 and eng.scheduler.num_preemptions_total == 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("body_max_tokens,most", [(None, 1), (8, 3)])
def test_http_request_without_max_tokens_reserves_the_context(body_max_tokens, most):
    """Over HTTP: a completion without max_tokens (the server's default of 16 applies) reserves the
    whole context under --kv-admission reserve; with max_tokens 8 it reserves prompt + 8."""
    import asyncio

    import aiohttp

    from diag.bundled_engine import ServerThread

    eng = build_engine(model="tiny", trace_memory=True, kv_blocks=16, block_size=16, max_context=256,
                       kv_admission="reserve")
    with ServerThread(eng) as st:
        async def go():
            async with aiohttp.ClientSession() as s:
                async def one(i):
                    body = {"prompt": f"request {i} " * 4, "ignore_eos": True, "temperature": 0}
                    if body_max_tokens is not None:
                        body["max_tokens"] = body_max_tokens
                    async with s.post(st.url + "/v1/completions", json=body) as r:
                        assert r.status == 200, await r.text()
                        return await r.json()
                return await asyncio.wait_for(asyncio.gather(*[one(i) for i in range(3)]), 60)

        asyncio.run(go())
    steps = [s for s in finished_spans(eng) if s.name == stages.SPAN_ENGINE_STEP]
    assert max(s.attributes[stages.ATTR_STEP_RUNNING] for s in steps) == most
