"""The probe's async streaming client for OpenAI-compatible /v1/completions and
/v1/chat/completions.

One :class:`StreamingClient` owns one ``aiohttp.ClientSession`` whose connector is sized to the
concurrency (``limit=concurrency``; no 100-connection cap) and whose read buffer is large
(``read_bufsize`` 4 MiB; not aiohttp's 64 KiB). Each request records, on one monotonic clock
(``perf_counter_ns``) converted to Unix ns with one offset taken when the client opens:

* start: just before the request is handed to aiohttp (it then takes/opens a connection); for
  a request sent again after its reused connection was found closed, the second send's;
* connected: connection created or reused (aiohttp TraceConfig);
* sent: request body written (TraceConfig ``on_request_chunk_sent``);
* headers: response status and headers read;
* first SSE event (role-only included) and first event whose choices carry non-empty
  text/content (TTFT end; role-only, empty and usage-only chunks do not count);
* every content chunk's arrival time, the last event, and ``usage`` (asked for with
  ``stream_options.include_usage``).

Failures never raise out of :meth:`StreamingClient.request`; they come back as
``RequestResult.error`` kinds (see :data:`~collectors.probe.results.ERROR_KINDS`).

Idle pooled connections are kept at most :data:`KEEPALIVE_S` (below the 5 s idle timeout common
to LLM servers), and a request whose reused connection turns out closed before any response
byte is sent once more on a fresh connection (:meth:`StreamingClient.request` says which times
it keeps); the retry is counted on the result (``conn_retries``), not as a failure.

Threading: a client and its session belong to the event loop that opened it; call its
coroutines from that loop only.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiohttp

from collectors.probe.endpoint import (API_CHAT, OPTIONAL_ELEMENT_TEXT, OPTIONAL_ELEMENTS, Endpoint, auth_headers,
                                       request_id_header, resolve_endpoint, split_url)
from collectors.probe.lora import LoraRoles
from collectors.probe.results import ATTR_CLIENT_API, RequestResult, record_result_on_span
from collectors.probe.schemas import SchemaRoles
from collectors.probe.sse import dumps, one_line, read_stream
from collectors.spans import NULL_REQUEST, RequestTrace, TraceSink
from diag.ground import stages

#: names that importers of this module use (``collectors.probe.session``, ``.session_types``): the
#: client's request types and endpoint helpers, defined in :mod:`collectors.probe.results` and
#: :mod:`collectors.probe.endpoint`
__all__ = ["KEEPALIVE_S", "OPTIONAL_ELEMENTS", "OPTIONAL_ELEMENT_TEXT", "Endpoint", "RequestResult",
           "StreamingClient", "auth_headers", "resolve_endpoint", "split_url"]

#: Seconds an idle pooled connection may be reused (aiohttp's ``keepalive_timeout``). Servers close
#: idle keep-alive connections on their own clock: uvicorn (under vLLM, SGLang, llama-cpp-python)
#: after ``timeout_keep_alive`` = 5 s (Kludex/uvicorn@72d0fa4de2200fa3de95c847440fb15232906290,
#: ``uvicorn/config.py`` ``Config.__init__``), cpp-httplib (llama.cpp's server) after
#: ``CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND`` = 5 s (yhirose/cpp-httplib@510b4eaaaed7042ee4af66183107e3f4d8020b41,
#: ``httplib.h``). aiohttp's own default is 15 s, and its connector reuses a pooled connection
#: while ``now - released <= keepalive_timeout`` (aio-libs/aiohttp@feffaed94e5bf718bf05d86239f420e6e466978a,
#: ``aiohttp/connector.py`` ``BaseConnector._get``): past 5 s it would hand out connections the
#: server is closing. The server's idle clock starts when it sent the last byte, ours when we read
#: it, and our next request reaches it a one-way trip later: 4 s leaves a second for that.
KEEPALIVE_S = 4.0


class _Timing(SimpleNamespace):
    """Per-request timestamps filled by the TraceConfig hooks (perf_counter_ns)."""

    queued_ns: int = 0
    conn_wait_ns: int = 0
    connected_ns: int = 0
    sent_ns: int = 0
    reused: bool | None = None


async def _on_queued_start(_s: Any, ctx: Any, _p: Any) -> None:
    ctx.trace_request_ctx.queued_ns = time.perf_counter_ns()


async def _on_queued_end(_s: Any, ctx: Any, _p: Any) -> None:
    t = ctx.trace_request_ctx
    t.conn_wait_ns += time.perf_counter_ns() - t.queued_ns


async def _on_create_end(_s: Any, ctx: Any, _p: Any) -> None:
    t = ctx.trace_request_ctx
    t.connected_ns = time.perf_counter_ns()
    t.reused = False


async def _on_reuse(_s: Any, ctx: Any, _p: Any) -> None:
    t = ctx.trace_request_ctx
    t.connected_ns = time.perf_counter_ns()
    t.reused = True


async def _on_chunk_sent(_s: Any, ctx: Any, _p: Any) -> None:
    ctx.trace_request_ctx.sent_ns = time.perf_counter_ns()


def _trace_config() -> aiohttp.TraceConfig:
    tc = aiohttp.TraceConfig(trace_config_ctx_factory=SimpleNamespace)
    tc.on_connection_queued_start.append(_on_queued_start)
    tc.on_connection_queued_end.append(_on_queued_end)
    tc.on_connection_create_end.append(_on_create_end)
    tc.on_connection_reuseconn.append(_on_reuse)
    tc.on_request_chunk_sent.append(_on_chunk_sent)
    return tc




class StreamingClient:
    """An async OpenAI-compatible streaming client that timestamps every stage of a request.

    ``concurrency`` sizes the connection pool; ``timeout_s`` bounds each wait for bytes
    (connect, first byte, between chunks). ``keep_text`` keeps the streamed output text on
    results (for tokenizer counts; never written to the capture). ``record_prompts`` puts the
    prompt on the span (off by default). ``dropped`` names :data:`OPTIONAL_ELEMENTS` not to send
    (what the compatibility check found the server refuses, or the user turned off).
    ``keepalive_s`` is how long an idle pooled connection may be reused (:data:`KEEPALIVE_S`);
    ``retry_reused`` sends a request once more on a fresh connection when its reused one was
    closed before any response byte (off: such a request fails as ``server_disconnected``).
    """

    READ_BUFSIZE_BYTES = 4 * 1024 * 1024

    def __init__(
        self,
        endpoint: Endpoint,
        concurrency: int,
        timeout_s: float = 60.0,
        sink: TraceSink | None = None,
        api_key: str | None = None,
        exact_output: bool = True,
        keep_text: bool = False,
        record_prompts: bool = False,
        extra_body: dict[str, Any] | None = None,
        dropped: frozenset[str] | set[str] = frozenset(),
        keepalive_s: float = KEEPALIVE_S,
        retry_reused: bool = True,
    ) -> None:
        unknown = set(dropped) - set(OPTIONAL_ELEMENTS)
        if unknown:
            raise ValueError(f"unknown optional element(s) {sorted(unknown)}; known: {sorted(OPTIONAL_ELEMENTS)}")
        self.endpoint = endpoint
        self.concurrency = max(1, int(concurrency))
        self.timeout_s = float(timeout_s)
        self.sink = sink
        self.api_key = api_key
        self.dropped: frozenset[str] = frozenset(dropped) | (frozenset() if exact_output else {"exact_output"})
        self.keep_text = keep_text
        self.record_prompts = record_prompts
        self.extra_body = dict(extra_body or {})
        #: counts tokens of the streamed text when set (a --tokenizer); the text is then dropped
        self.count_tokens: Callable[[str], int] | None = None
        self.keepalive_s = float(keepalive_s)
        self.retry_reused = retry_reused
        self.session: aiohttp.ClientSession | None = None
        #: one-connection-per-request session for retries (opened at the first retry)
        self._fresh: aiohttp.ClientSession | None = None
        # perf_counter_ns -> Unix ns: one offset for the whole run (monotonic intervals)
        self.offset_ns = time.time_ns() - time.perf_counter_ns()
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers(api_key)}
        self._schema_roles = SchemaRoles()
        self._lora_roles = LoraRoles()

    @property
    def exact_output(self) -> bool:
        """Whether bodies ask for exactly ``max_tokens`` (min_tokens + ignore_eos)."""
        return "exact_output" not in self.dropped

    def unix_ns(self, perf_ns: int) -> int:
        """Convert a perf_counter_ns reading to Unix ns (the offset taken at construction)."""
        return perf_ns + self.offset_ns

    async def open(self) -> StreamingClient:
        """Create the session (on the running loop)."""
        if self.session is None:
            self.session = self._new_session(aiohttp.TCPConnector(
                limit=self.concurrency, limit_per_host=0, ttl_dns_cache=300, enable_cleanup_closed=False,
                keepalive_timeout=self.keepalive_s))
        return self

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s),
            read_bufsize=self.READ_BUFSIZE_BYTES,
            trace_configs=[_trace_config()],
            auto_decompress=True,
        )

    def _fresh_session(self) -> aiohttp.ClientSession:
        """The session retries go through: every request on a new connection, closed after it."""
        if self._fresh is None:
            self._fresh = self._new_session(aiohttp.TCPConnector(limit=self.concurrency, force_close=True,
                                                                 ttl_dns_cache=300, enable_cleanup_closed=False))
        return self._fresh

    async def close(self) -> None:
        for session in (self.session, self._fresh):
            if session is not None:
                await session.close()
        self.session = self._fresh = None

    async def __aenter__(self) -> StreamingClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- request body ---------------------------------------------------------------------

    def build_body(self, item: Any) -> dict[str, Any]:
        """The JSON body for one PromptItem on this endpoint's API."""
        body: dict[str, Any] = {}
        model = getattr(item, "lora", None) or self.endpoint.model
        if model:
            body["model"] = model
        if self.endpoint.api == API_CHAT:
            body["messages"] = item.messages_for_chat()
        else:
            body["prompt"] = item.text_for_completions()
        if item.max_tokens:
            body["max_tokens"] = int(item.max_tokens)
            if self.exact_output:
                body["min_tokens"] = int(item.max_tokens)
                body["ignore_eos"] = True
        if getattr(item, "response_format", None) is not None:
            body["response_format"] = item.response_format
        body["stream"] = True
        if "stream_options" not in self.dropped:
            body["stream_options"] = {"include_usage": True}
        body.update(self.extra_body)
        return body

    # --- one request ----------------------------------------------------------------------

    async def request(
        self,
        item: Any,
        request_id: str,
        segment: str | None = None,
        warmup: bool = False,
        scheduled_perf_ns: int | None = None,
    ) -> RequestResult:
        """Send one streaming request and time it; never raises (errors are kinds). A reused
        connection found closed before any response byte gets the request once more on a fresh
        one (see :meth:`_begin_retry` for the times kept); any other failure is final."""
        assert self.session is not None, "StreamingClient.open() first"
        body = dumps(self.build_body(item))
        res = RequestResult(request_id=request_id, segment=segment, warmup=warmup,
                            requested_output_tokens=item.max_tokens, input_tokens_est=item.input_tokens_est,
                            input_tokens_target=item.input_tokens_target,
                            prefix_tokens=getattr(item, "prefix_tokens", 0), prefix_role=getattr(item, "prefix_role", None))
        res.schema_key = getattr(item, "schema_key", None)
        if res.schema_key is not None:
            res.schema_role = self._schema_roles.on_send(res.schema_key)
        res.lora = getattr(item, "lora", None)
        if res.lora is not None:
            res.lora_role = self._lora_roles.on_send(id(res), res.lora)
        off = self.offset_ns
        dispatch_ns = time.perf_counter_ns()
        res.scheduled_ns = (scheduled_perf_ns if scheduled_perf_ns is not None else dispatch_ns) + off
        span: RequestTrace = NULL_REQUEST
        headers = self._headers
        if self.sink is not None and self.sink.enabled:
            attrs: dict[str, Any] = {ATTR_CLIENT_API: self.endpoint.api}
            if segment is not None:
                attrs[stages.ATTR_SEGMENT] = segment
            if warmup:
                attrs[stages.ATTR_WARMUP] = True
            span = self.sink.start_request(request_id, model=self.endpoint.model, attributes=attrs,
                                           start_ns=dispatch_ns + off, side="client")
            tp = span.traceparent()
            headers = dict(headers)
            if tp and "traceparent" not in self.dropped:
                headers["traceparent"] = tp
            res.trace_id = span.trace_id_hex
            if self.record_prompts:
                span.set_attributes({stages.ATTR_PROMPT_TEXT: item.text_for_completions()[:65536]})
        else:
            headers = dict(headers)
        if "x_request_id" not in self.dropped:
            headers["X-Request-Id"] = request_id_header(res.trace_id)
        timing = _Timing()
        res.start_ns = time.perf_counter_ns() + off
        try:
            try:
                await self._attempt(self.session, body, headers, timing, res)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError) as exc:
                if not self._may_retry(exc, timing, res):
                    raise
                timing = self._begin_retry(timing, res)
                await self._attempt(self._fresh_session(), body, headers, timing, res)
        except aiohttp.ClientConnectorError as exc:
            refused = getattr(exc, "os_error", None)
            refused_errno = getattr(refused, "errno", None) == errno.ECONNREFUSED
            res.error = "connect_refused" if refused_errno else "connect_error"
            res.error_detail = one_line(str(exc))
        except asyncio.TimeoutError:
            res.error = "timeout"
            res.error_detail = f"no data for {self.timeout_s:g}s"
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError,
                ConnectionResetError) as exc:
            res.error = "closed_mid_stream" if res.headers_ns is not None else "server_disconnected"
            res.error_detail = one_line(f"{type(exc).__name__}: {exc}")
        except aiohttp.ClientError as exc:
            res.error = "client_error"
            res.error_detail = one_line(f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            res.error = "cancelled"
            res.error_detail = "cancelled (run ended or interrupted)"
            self._lora_roles.on_done(id(res))
            self._finish(res, timing, span)
            raise
        except Exception as exc:  # a client bug must not stop the run
            res.error = "client_error"
            res.error_detail = one_line(f"{type(exc).__name__}: {exc}")
        if res.schema_key is not None:  # answered or failed: later uses no longer wait on this one
            self._schema_roles.on_first_token(res.schema_key)
        if res.lora is not None:
            self._lora_roles.on_done(id(res))
        self._finish(res, timing, span)
        return res

    async def _attempt(self, session: aiohttp.ClientSession, body: bytes, headers: dict[str, str], timing: _Timing,
                       res: RequestResult) -> None:
        """One send of the request on ``session``, reading the answer into ``res``; connection
        errors and timeouts raise (:meth:`request` classifies them)."""
        off = self.offset_ns
        async with session.post(self.endpoint.url, data=body, headers=headers, trace_request_ctx=timing) as resp:
            res.headers_ns = time.perf_counter_ns() + off
            res.status = resp.status
            if resp.status >= 400:
                res.error = "http_4xx" if resp.status < 500 else "http_5xx"
                try:
                    raw = await resp.content.read(2048)
                    res.error_detail = f"HTTP {resp.status}: " + one_line(raw.decode("utf-8", "replace"))
                except Exception:
                    res.error_detail = f"HTTP {resp.status}"
            else:
                ctype = resp.headers.get("Content-Type", "")
                if ctype.startswith("application/json"):
                    await resp.read()
                    res.last_ns = time.perf_counter_ns() + off
                    res.error = "not_streamed"
                    res.error_detail = f"Content-Type {ctype}: the server ignored stream=true"
                else:
                    await read_stream(resp, res, offset_ns=self.offset_ns, chat=self.endpoint.api == API_CHAT,
                                      keep_text=self.keep_text, schema_roles=self._schema_roles)

    def _may_retry(self, exc: BaseException, timing: _Timing, res: RequestResult) -> bool:
        """Whether a connection error is the stale keep-alive race: on a reused pooled
        connection, before any response byte, and not retried yet."""
        return (self.retry_reused and timing.reused is True and res.headers_ns is None and res.conn_retries == 0
                and not isinstance(exc, aiohttp.ClientConnectorError))

    def _begin_retry(self, dead: _Timing, res: RequestResult) -> _Timing:
        """Mark ``res`` as sent again on a fresh connection (:meth:`_fresh_session`); returns
        the hook timings for the new send.

        The server closed the reused connection before answering (its idle timeout crossed our
        request on the wire), so it never worked on the first send. Clocks: ``scheduled_ns``
        stays the first send's, ``start_ns`` becomes the retry's send. TTFT is then what the
        server and the network took for the request the server answered (a new connection's
        handshake included, as for any fresh connection), and the time lost on the dead
        connection is client-side delay: it shows in ``slot_wait_s`` (start - scheduled,
        reported beside TTFT and in TTFT + slot wait) and in ``conn_retry_lost_s``, never in
        TTFT. A user's client whose pool met the same race would retry the same way; one whose
        pool is kept below the server's idle timeout would not meet it at all.
        """
        now = time.perf_counter_ns() + self.offset_ns
        res.conn_retries = 1
        res.conn_retry_lost_s = max(0.0, (now - res.start_ns) / 1e9)
        res.start_ns = now
        timing = _Timing()
        timing.conn_wait_ns = dead.conn_wait_ns  # both sends waited for the pool
        return timing

    def _finish(self, res: RequestResult, timing: _Timing, span: RequestTrace) -> None:
        """Copy hook timings into the result and end the span with every attribute."""
        off = self.offset_ns
        if timing.connected_ns:
            res.connected_ns = timing.connected_ns + off
        if timing.sent_ns:
            res.sent_ns = timing.sent_ns + off
        res.conn_reused = timing.reused
        res.conn_wait_s = timing.conn_wait_ns / 1e9
        if res.output_text is not None and self.count_tokens is not None:
            try:
                res.tokenizer_output_tokens = self.count_tokens(res.output_text)
            except Exception:
                pass
            res.output_text = None
        if span.enabled:
            record_result_on_span(span, res)
