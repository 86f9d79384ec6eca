"""The server's front end: bounded HTTP workers, tokenizer threads, the waits before the engine, shedding.

Every test runs the real server (aiohttp on 127.0.0.1) over the tiny engine.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diag.ground import stages
from diag.bundled_engine import ServerThread, build_engine, parse_injections
from diag.bundled_engine.faults import FaultError
from diag.bundled_engine.frontend import effective_sizes
from support.engine_testutil import finished_spans

BODY = {"prompt": "a short prompt for the front end", "max_tokens": 24, "ignore_eos": True, "temperature": 0.0,
        "stream": True}


async def _stream(session: aiohttp.ClientSession, url: str, body: dict | None = None) -> tuple[int, str, float]:
    """(status, request id or error text, seconds to the first content chunk)."""
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body or BODY) as r:
        if r.status != 200:
            return r.status, (await r.json())["error"]["message"], 0.0
        first = 0.0
        async for line in r.content:
            if line.startswith(b"data: {") and not first and json.loads(line[6:])["choices"][0]["text"]:
                first = time.perf_counter() - t0
        return r.status, r.headers["X-Request-Id"], first


def _metrics(url: str) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (f"{{{s.labels['reason']}}}" if "reason" in s.labels else "")
            out[key] = out.get(key, 0.0) + s.value
    return out


async def _until(url: str, active: int | None, waiting: int, timeout_s: float = 20.0) -> None:
    """Poll /metrics until the front end holds ``active`` requests (None: any) and ``waiting`` wait."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        m = await asyncio.to_thread(_metrics, url)
        if active in (None, m["ttft_engine:frontend_requests_active"]) and \
                m["ttft_engine:frontend_requests_waiting"] == waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"front end never reached active={active} waiting={waiting}")


def _roots(eng) -> dict[str, object]:
    return {s.attributes[stages.ATTR_REQUEST_ID]: s for s in finished_spans(eng) if s.name == stages.SPAN_REQUEST}


def test_fault_shrinks_the_pools_and_defaults_keep_them():
    assert effective_sizes(None, 256, 1) == effective_sizes(None, 256, 1, 0.0)
    s = effective_sizes(None, 8, 4, 2.0)
    assert (s.http_workers, s.tokenizer_workers, s.http_backlog) == (2, 2, 8)
    assert effective_sizes(1, 8, 1, 3.0).http_workers == 1  # a fault never grows a pool
    with pytest.raises(FaultError, match="whole number"):
        parse_injections(["frontend_workers=1.5"])
    with pytest.raises(ValueError, match="--http-workers"):
        build_engine(model="tiny", warmup=False, http_workers=0)


def test_one_http_worker_queues_requests_before_the_engine():
    """Three concurrent streams through one HTTP worker: the 2nd and 3rd wait in the front end for
    the stream before them to end, the engine's own queue stays empty, and the span says where."""
    eng = build_engine(model="tiny", trace_memory=True, faults=parse_injections(["frontend_workers=1"]))
    with ServerThread(eng) as st:
        seen: list[dict[str, float]] = []

        async def go():
            async with aiohttp.ClientSession() as s:
                tasks = [asyncio.ensure_future(_stream(s, st.url)) for _ in range(3)]
                while not all(t.done() for t in tasks):
                    seen.append(await asyncio.to_thread(_metrics, st.url))
                    await asyncio.sleep(0.01)
                return [t.result() for t in tasks]

        results = asyncio.run(go())
        roots = _roots(eng)
        after = _metrics(st.url)
    assert all(r[0] == 200 for r in results), results
    spans = [roots[r[1]] for r in results]
    http_waits = sorted(s.attributes[stages.ATTR_FRONTEND_HTTP_WAIT_S] for s in spans)
    e2e = sorted((s.end_time - s.start_time) / 1e9 for s in spans)
    # the first went straight in; each later one waited about one whole stream (24 tokens)
    assert http_waits[0] < 0.05 and http_waits[1] > 0.5 * e2e[0] and http_waits[2] > http_waits[1]
    for s in spans:
        a = s.attributes
        assert a[stages.ATTR_FRONTEND_WAIT_S] == pytest.approx(a[stages.ATTR_FRONTEND_HTTP_WAIT_S]
                                                               + a[stages.ATTR_FRONTEND_TOKENIZER_WAIT_S])
        # the wait is inside server TTFT, before the tokenize span
        ttft_s = (a[stages.ATTR_FIRST_TOKEN_NS] - s.start_time) / 1e9
        assert a[stages.ATTR_FRONTEND_WAIT_S] < ttft_s
    # /metrics: front-end waiting seen while the engine's queue never held more than the one in it
    assert max(m["ttft_engine:frontend_requests_waiting"] for m in seen) >= 1
    assert max(m["ttft_engine:num_requests_waiting"] for m in seen) <= 1
    assert max(m["ttft_engine:frontend_requests_active"] for m in seen) == 1
    assert after["ttft_engine:frontend_http_workers"] == 1 and after["ttft_engine:frontend_requests_waiting"] == 0
    assert after["ttft_engine:frontend_wait_seconds_count"] == 3
    assert after["ttft_engine:frontend_wait_seconds_sum"] == pytest.approx(sum(http_waits), abs=0.05)


def test_a_full_backlog_is_refused_with_503_and_counted():
    eng = build_engine(model="tiny", trace_memory=True, warmup=False, http_workers=1, http_backlog=1)
    with ServerThread(eng) as st:
        async def go():
            async with aiohttp.ClientSession() as s:
                long = {**BODY, "max_tokens": 400}
                first = asyncio.ensure_future(_stream(s, st.url, long))  # holds the worker
                second = asyncio.ensure_future(_stream(s, st.url, long))  # waits in the backlog
                await _until(st.url, active=1, waiting=1)
                third = await _stream(s, st.url)  # nowhere to wait
                first.cancel()
                second.cancel()
                return third

        third = asyncio.run(go())
        m = _metrics(st.url)
    assert third[0] == 503 and "front end overloaded" in third[1] and "\n" not in third[1]
    assert m["ttft_engine:request_rejected_total{frontend_full}"] == 1


def test_a_client_leaving_while_waiting_for_a_worker_takes_none():
    eng = build_engine(model="tiny", trace_memory=True, warmup=False, http_workers=1)
    with ServerThread(eng) as st:
        async def go():
            async with aiohttp.ClientSession() as s:
                first = asyncio.ensure_future(_stream(s, st.url, {**BODY, "max_tokens": 600}))
                await _until(st.url, active=1, waiting=0)
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s2:
                    gone = asyncio.ensure_future(_stream(s2, st.url))
                    await _until(st.url, active=1, waiting=1)
                    gone.cancel()  # closes its connection while it waits for the worker
                await _until(st.url, active=1, waiting=0)  # the first still streams
                first.cancel()
                return await asyncio.wait_for(_stream(s, st.url), 30)

        last = asyncio.run(go())
        m = _metrics(st.url)
    assert last[0] == 200
    assert m["ttft_engine:frontend_requests_waiting"] == 0 and m["ttft_engine:frontend_requests_active"] == 0
    assert len(_roots(eng)) == 2  # the one that left never reached the engine


def test_one_tokenizer_thread_makes_prompts_wait_for_it():
    """A slow tokenizer on one thread: concurrent requests wait for the thread (tokenizer wait),
    with two threads they wait less; the tokenize span itself stays per-request work."""
    waits = {}
    for n in (1, 2):
        eng = build_engine(model="tiny", trace_memory=True, warmup=False, tokenizer_workers=n,
                           faults=parse_injections(["tokenize_ms_per_token=5"]))
        with ServerThread(eng) as st:
            async def go():
                async with aiohttp.ClientSession() as s:
                    return await asyncio.gather(*(_stream(s, st.url, {**BODY, "max_tokens": 2}) for _ in range(4)))

            results = asyncio.run(go())
            roots = _roots(eng)
        assert all(r[0] == 200 for r in results)
        waits[n] = sorted(roots[r[1]].attributes[stages.ATTR_FRONTEND_TOKENIZER_WAIT_S] for r in results)
        assert all(roots[r[1]].attributes[stages.ATTR_FRONTEND_HTTP_WAIT_S] < 0.05 for r in results)
    # one thread: the 4th waits for three tokenizations (~8 tokens x 5 ms each); two threads: for about one
    assert waits[1][-1] > 0.06 and waits[1][-1] > 1.5 * waits[2][-1], waits


def test_fault_is_recorded_in_meta_with_the_front_end_sizes(tmp_path):
    eng = build_engine(model="tiny", warmup=False, capture_dir=tmp_path / "cap", http_workers=4,
                       faults=parse_injections(["frontend_workers=2"]))
    eng.shutdown()
    meta = json.loads((tmp_path / "cap" / "meta.json").read_text())
    assert meta["faults_injected"] == {"frontend_workers": 2.0}
    assert meta["engine_config"]["http_workers"] == 4 and meta["engine_config"]["tokenizer_workers"] == 1


def test_serve_flags_reach_the_config_and_bad_ones_exit_2(capsys):
    import argparse

    from diag.cli.commands import serve

    p = argparse.ArgumentParser()
    serve.add_parser(p.add_subparsers())
    a = p.parse_args(["serve", "--http-workers", "2", "--tokenizer-workers", "3", "--http-backlog", "5"])
    assert (a.http_workers, a.tokenizer_workers, a.http_backlog) == (2, 3, 5)
    d = p.parse_args(["serve"])
    assert (d.http_workers, d.tokenizer_workers) == (None, 1)  # today's behaviour: unbounded, one tokenizer thread
    assert serve.run(p.parse_args(["serve", "--http-workers", "0", "--port", "0"])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ttft serve: error:") and "--http-workers" in err and "\n" not in err
