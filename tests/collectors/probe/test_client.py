"""The streaming client against a real local SSE server with known behaviour."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from collectors.probe import LoadSpec, ProbeConfig, WorkloadSpec, LengthSpec, run_probe
from collectors.probe.client import StreamingClient
from collectors.probe.endpoint import Endpoint, request_id_header, resolve_endpoint, split_url
from collectors.probe.workload import PromptItem

from support.probe_timings import FIRST_CONTENT_DELAY_S


def _probe(url: str, api: str = "completions", n: int = 3, **kw):
    load = LoadSpec(concurrency=kw.pop("concurrency", 1), requests=n, warmup_requests=0)
    wl = WorkloadSpec(LengthSpec.parse("32"), LengthSpec.parse(str(kw.pop("out", 4))))
    return run_probe(ProbeConfig(url, api=api, load=load, workload=wl, timeout_s=kw.pop("timeout_s", 5.0), **kw))


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_ttft_excludes_role_only_chunk(server, api):
    res = _probe(server.url("ok"), api, n=2)
    for r in res.results:
        assert r.error is None
        # the role-only / empty first event arrives at once; TTFT waits for real content
        assert (r.first_event_ns - r.start_ns) / 1e9 < FIRST_CONTENT_DELAY_S / 2
        assert r.ttft_s >= FIRST_CONTENT_DELAY_S * 0.95
        assert r.first_content_ns > r.first_event_ns
        assert r.start_ns <= r.connected_ns <= r.sent_ns <= r.headers_ns <= r.first_event_ns
        assert len(r.token_times_ns) == 4 and r.last_ns >= r.token_times_ns[-1]


def test_usage_counts_and_traceparent_reach_server(server):
    res = _probe(server.url("ok"), "chat", n=3, out=6)
    assert [r.usage_output_tokens for r in res.results] == [6, 6, 6]
    assert all(r.token_source == "server" and r.usage_input_tokens == 17 for r in res.results)
    seen = {s.headers["x-request-id"]: s for s in server.log if "x-request-id" in s.headers}
    for r in res.results:
        s = seen[request_id_header(r.trace_id)]  # a UUID any server accepts: the trace id
        assert str(uuid.UUID(s.headers["x-request-id"])) == s.headers["x-request-id"]
        tp = s.headers["traceparent"]
        assert tp.split("-")[1] == r.trace_id and len(r.trace_id) == 32
        assert s.body["stream_options"] == {"include_usage": True}
        assert s.body["max_tokens"] == 6 and s.body["min_tokens"] == 6 and s.body["ignore_eos"] is True
        assert s.body["model"] == "fake-model"


@pytest.mark.parametrize(
    "mode,kind",
    [
        ("http400", "http_4xx"),
        ("http503", "http_5xx"),
        ("malformed", "malformed_sse"),
        ("empty", "empty_body"),
        ("midclose", "closed_mid_stream"),
        ("json", "not_streamed"),
    ],
)
def test_errors_counted_by_kind_and_run_goes_on(server, mode, kind):
    res = _probe(server.url(mode), "completions", n=3)
    assert res.metrics["requests"]["total"] == 3
    assert res.metrics["errors"][kind]["count"] == 3
    assert res.metrics["errors"][kind]["example"]
    if kind.startswith("http_"):
        assert all(r.status in (400, 503) for r in res.results)


def test_timeout_when_server_never_answers(server):
    res = _probe(server.url("hang"), "completions", n=2, concurrency=2, timeout_s=0.3)
    assert res.metrics["errors"]["timeout"]["count"] == 2


def test_connection_refused_is_counted(refused_url):
    res = _probe(refused_url, "completions", n=3)
    assert res.metrics["errors"]["connect_refused"]["count"] == 3
    assert any("GET /v1/models failed" in n for n in res.notes)


def test_mixed_failures_keep_the_good_requests(server):
    res = _probe(server.url("flaky"), "completions", n=9)
    m = res.metrics
    assert m["requests"]["total"] == 9
    assert m["errors"]["http_5xx"]["count"] == 3 and m["requests"]["ok"] == 6
    assert m["ttft_s"]["count"] == 6


def test_crlf_comments_and_no_usage(server):
    res = _probe(server.url("crlf"), "chat", n=1)
    assert res.results[0].error is None and len(res.results[0].token_times_ns) == 4
    res = _probe(server.url("nousage"), "completions", n=1)
    r = res.results[0]
    assert r.error is None and r.usage_output_tokens is None
    assert r.token_source == "chunks" and r.output_tokens == 4


def test_output_length_not_honoured_is_reported(server):
    res = _probe(server.url("short"), "completions", n=2, out=8)
    ol = res.metrics["output_lengths"]
    assert ol["honoured"] is False and ol["requests_short"] == 2


def test_split_url_and_detection(server):
    assert split_url("http://h:1/v1/chat/completions") == ("http://h:1", "chat")
    assert split_url("http://h:1/v1") == ("http://h:1", None)
    assert split_url("h:1/x/v1/completions") == ("http://h:1/x", "completions")
    with pytest.raises(ValueError):
        split_url("ftp://h/x")
    ep, notes = asyncio.run(resolve_endpoint(server.url("ok")))
    assert ep.api == "completions" and ep.detected and ep.model == "fake-model"
    ep, _ = asyncio.run(resolve_endpoint(server.url("ok") + "/v1/chat/completions", model="m"))
    assert ep.api == "chat" and ep.model == "m" and not ep.detected


def test_client_without_sink_and_exact_output_off(server):
    async def go():
        ep = Endpoint(server.url("ok"), "completions", None)
        async with StreamingClient(ep, 1, timeout_s=5, exact_output=False) as c:
            return await c.request(PromptItem(prompt="hi", max_tokens=3), "x1")

    r = asyncio.run(go())
    assert r.error is None and r.trace_id == "" and len(r.token_times_ns) == 3
    body = server.log[-1].body
    assert "min_tokens" not in body and "model" not in body and body["prompt"] == "hi"


async def _two_requests(url: str, gap_s: float, **kw):
    """Two requests on one client, ``gap_s`` apart: the second may reuse the first's connection."""
    ep = Endpoint(url, "completions", None)
    async with StreamingClient(ep, 1, timeout_s=5, **kw) as c:
        first = await c.request(PromptItem(prompt="hi", max_tokens=3), "r1")
        await asyncio.sleep(gap_s)
        return first, await c.request(PromptItem(prompt="hi", max_tokens=3), "r2")


def test_idle_closed_keepalive_connection_is_retried_on_a_fresh_one(server):
    server.idle_close_s = 0.2
    first, second = asyncio.run(_two_requests(server.url("idleclose"), 0.5, keepalive_s=10.0))
    assert first.ok and first.conn_retries == 0
    # the pooled connection was reused, the server closed it unanswered, and the request went again
    assert len(server.idle_closed_ns) == 1
    assert second.ok and second.conn_retries == 1 and second.conn_reused is False
    # TTFT starts at the retry's send: after the dead connection was closed, with the lost time apart
    assert second.start_ns >= server.idle_closed_ns[0]
    assert second.conn_retry_lost_s > 0 and second.slot_wait_s >= second.conn_retry_lost_s
    assert second.ttft_s < FIRST_CONTENT_DELAY_S + 0.05


def test_without_the_retry_the_race_is_a_failure(server):
    # the control: the same race, not retried, is what the probe used to count as the server's failure
    server.idle_close_s = 0.2
    _, second = asyncio.run(_two_requests(server.url("idleclose"), 0.5, keepalive_s=10.0, retry_reused=False))
    assert second.error == "server_disconnected" and second.conn_reused is True and second.conn_retries == 0


def test_keepalive_below_the_server_idle_timeout_avoids_the_race(server):
    from collectors.probe.client import KEEPALIVE_S

    assert KEEPALIVE_S < 5.0  # uvicorn's and cpp-httplib's idle timeout
    server.idle_close_s = 0.4
    # a connection idle past the client's keep-alive is not reused: a new one, no race, no retry
    _, second = asyncio.run(_two_requests(server.url("idleclose"), 0.5, keepalive_s=0.3))
    assert second.ok and second.conn_reused is False and second.conn_retries == 0
    assert server.idle_closed_ns == []


def test_a_disconnect_on_a_fresh_connection_is_a_failure(server):
    # a server that drops every request: the fresh connection's disconnect is not retried
    first, second = asyncio.run(_two_requests(server.url("dropall"), 0.0))
    for r in (first, second):
        assert r.error == "server_disconnected" and r.conn_retries == 0 and r.conn_reused is False
    assert len(server.idle_closed_ns) == 2
