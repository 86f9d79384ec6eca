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
``RequestResult.error`` kinds (see :data:`ERROR_KINDS`).

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
import json
import time
import uuid
from dataclasses import dataclass, field
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from collectors.probe.ready import NOT_SERVING_STATUSES, ReadyWait, not_serving_text
from collectors.probe.lora import LoraRoles
from collectors.probe.schemas import SchemaRoles
from collectors.spans import NULL_REQUEST, RequestTrace, TraceSink
from diag import stages

try:  # orjson is optional; it parses small SSE payloads ~3x faster
    import orjson as _orjson

    _loads = _orjson.loads
    _dumps = _orjson.dumps
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


# Attribute keys of the probe (defined in diag.stages).
ATTR_CLIENT_CONN_WAIT_S = stages.ATTR_CLIENT_CONN_WAIT_S
ATTR_CLIENT_CONN_REUSED = stages.ATTR_CLIENT_CONN_REUSED
ATTR_CLIENT_CONTENT_CHUNKS = stages.ATTR_CLIENT_CONTENT_CHUNKS
ATTR_CLIENT_FIRST_ANSWER_NS = stages.ATTR_CLIENT_FIRST_ANSWER_NS
ATTR_CLIENT_API = stages.ATTR_CLIENT_API
ATTR_CLIENT_INPUT_TOKENS_EST = stages.ATTR_CLIENT_INPUT_TOKENS_EST

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

API_COMPLETIONS = "completions"
API_CHAT = "chat"
_PATHS = {API_COMPLETIONS: "/v1/completions", API_CHAT: "/v1/chat/completions"}

#: Error kinds a request can end with.
ERROR_KINDS: dict[str, str] = {
    "connect_refused": "TCP connection refused (nothing listening)",
    "connect_error": "could not connect (DNS, unreachable, TLS, reset while connecting)",
    "timeout": "no byte from the server for --timeout seconds (connect, first byte or between chunks)",
    "http_4xx": "the server answered 4xx (bad request, unknown model, context too long, ...)",
    "http_5xx": "the server answered 5xx",
    "malformed_sse": "a data: line was not a JSON object",
    "stream_error": "the stream carried an error event",
    "empty_body": "200 OK but no SSE event at all",
    "closed_mid_stream": "the connection ended before [DONE] or a finish_reason",
    "server_disconnected": "the server closed the connection before answering",
    "not_streamed": "the server ignored stream=true and answered one JSON body",
    "no_content": "the stream finished without any non-empty content",
    "client_error": "another client-side failure (see the example message)",
    "worker_lost": "the probe worker sending it was lost (Ray actor or node) before its outcome came back",
}


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it. Times are Unix ns (None when not reached)."""

    request_id: str
    segment: str | None = None
    warmup: bool = False
    scheduled_ns: int = 0
    start_ns: int = 0
    connected_ns: int | None = None
    sent_ns: int | None = None
    headers_ns: int | None = None
    first_event_ns: int | None = None
    first_content_ns: int | None = None
    first_answer_ns: int | None = None
    last_ns: int | None = None
    token_times_ns: list[int] = field(default_factory=list)
    status: int | None = None
    error: str | None = None
    error_detail: str | None = None
    finish_reason: str | None = None
    usage_input_tokens: int | None = None
    usage_output_tokens: int | None = None
    input_tokens_est: int | None = None
    input_tokens_target: int | None = None
    requested_output_tokens: int | None = None
    tokenizer_output_tokens: int | None = None
    conn_wait_s: float = 0.0
    conn_reused: bool | None = None
    #: sent again on a fresh connection after its reused one was found closed (0 or 1)
    conn_retries: int = 0
    #: seconds lost on the dead reused connection before the retry (not part of TTFT; in slot wait)
    conn_retry_lost_s: float = 0.0
    trace_id: str = ""
    output_text: str | None = None
    #: the workload's shared-prefix design (PromptItem.prefix_tokens / prefix_role)
    prefix_tokens: int = 0
    prefix_role: str | None = None
    #: ``--response-format``: the schema's key and this use's role (collectors.probe.schemas)
    schema_key: str | None = None
    schema_role: str | None = None
    #: ``--lora``: the adapter asked for and the adapters in flight at its send (collectors.probe.lora)
    lora: str | None = None
    lora_role: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        if self.first_content_ns is None:
            return None
        return (self.first_content_ns - self.start_ns) / 1e9

    @property
    def e2e_s(self) -> float | None:
        if self.last_ns is None:
            return None
        return (self.last_ns - self.start_ns) / 1e9

    @property
    def slot_wait_s(self) -> float:
        """Scheduled send time -> actual start: waiting for a client slot (and client lag)."""
        return max(0.0, (self.start_ns - self.scheduled_ns) / 1e9) if self.scheduled_ns else 0.0

    @property
    def output_tokens(self) -> int | None:
        """Output tokens: server usage, else the tokenizer's count, else content chunks."""
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        if self.tokenizer_output_tokens is not None:
            return self.tokenizer_output_tokens
        return len(self.token_times_ns) if self.token_times_ns else None

    @property
    def token_source(self) -> str:
        if self.usage_output_tokens is not None:
            return "server"
        if self.tokenizer_output_tokens is not None:
            return "tokenizer"
        return "chunks"

    @property
    def input_tokens(self) -> int | None:
        return self.usage_input_tokens if self.usage_input_tokens is not None else self.input_tokens_est

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1), seconds per output token after the first."""
        n = self.output_tokens
        ttft, e2e = self.ttft_s, self.e2e_s
        if n is None or n < 2 or ttft is None or e2e is None:
            return None
        return (e2e - ttft) / (n - 1)

    def itl_s(self) -> list[float]:
        """Gaps between content chunks (s): the per-chunk ITL samples of this request."""
        t = self.token_times_ns
        return [(t[i] - t[i - 1]) / 1e9 for i in range(1, len(t))]

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (for worker processes and --json)."""
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestResult:
        return cls(**d)


@dataclass
class Endpoint:
    """Where and how to send: ``url`` is the full POST URL."""

    base_url: str  # scheme://host:port (no /v1)
    api: str
    model: str | None
    detected: bool = False
    #: the first generation request the server answered (meta.json ``probe.first_contact``):
    #: ``{"request", "sent_ns" (Unix ns), "answer_s" (sent to last byte), "output_tokens"}``;
    #: a server still loading its model answers it late (cold start)
    first_contact: dict[str, Any] | None = None

    @property
    def url(self) -> str:
        return self.base_url + _PATHS[self.api]


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The bearer-token header for ``api_key`` (none without one); the key is never recorded."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def split_url(url: str) -> tuple[str, str | None]:
    """``http://h:p[/v1[/chat]/completions]`` -> (base ``http://h:p[/prefix]``, api or None)."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"bad URL {url!r}: expected http(s)://HOST:PORT[/v1[/chat]/completions]")
    path = parts.path.rstrip("/")
    api: str | None = None
    for a, suffix in (("chat", "/v1/chat/completions"), ("completions", "/v1/completions")):
        if path.endswith(suffix):
            api, path = a, path[: -len(suffix)]
            break
    else:
        if path.endswith("/v1"):
            path = path[:-3]
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")), api


#: What the probe sends that a server may refuse, each with the probe flag that turns it off.
#: A server that validates ``X-Request-Id`` as a UUID, or rejects unknown body fields
#: (``min_tokens``/``ignore_eos`` are vLLM/SGLang extensions; ``stream_options`` is newer than
#: some servers), answers 4xx to every request; the compatibility check finds which one.
#: The compatibility check tries them in this order: ``traceparent`` last, because a retry
#: without it reaches a traced server as a request that joins no client trace (a server-only
#: failure in the capture), so it is sent only when dropping the others did not help.
OPTIONAL_ELEMENTS: dict[str, str] = {
    "x_request_id": "--no-request-id",
    "exact_output": "--no-exact-output",
    "stream_options": "--no-stream-options",
    "traceparent": "--no-traceparent",
}
#: How each optional element reads in a message to the user.
OPTIONAL_ELEMENT_TEXT: dict[str, str] = {
    "x_request_id": "the X-Request-Id header",
    "traceparent": "the W3C traceparent header",
    "exact_output": "min_tokens/ignore_eos in the body",
    "stream_options": "stream_options.include_usage in the body",
}


def request_id_header(trace_id_hex: str) -> str:
    """The ``X-Request-Id`` value: the request's trace id as a UUID (any server accepts a UUID,
    and the id then names the same request as its trace); a random UUID without a trace."""
    if len(trace_id_hex) == 32:
        try:
            return str(uuid.UUID(hex=trace_id_hex))
        except ValueError:
            pass
    return str(uuid.uuid4())


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


def _one_line(text: str, limit: int = 160) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


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
        body = _dumps(self.build_body(item))
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
            res.error_detail = _one_line(str(exc))
        except asyncio.TimeoutError:
            res.error = "timeout"
            res.error_detail = f"no data for {self.timeout_s:g}s"
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError,
                ConnectionResetError) as exc:
            res.error = "closed_mid_stream" if res.headers_ns is not None else "server_disconnected"
            res.error_detail = _one_line(f"{type(exc).__name__}: {exc}")
        except aiohttp.ClientError as exc:
            res.error = "client_error"
            res.error_detail = _one_line(f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            res.error = "cancelled"
            res.error_detail = "cancelled (run ended or interrupted)"
            self._lora_roles.on_done(id(res))
            self._finish(res, timing, span)
            raise
        except Exception as exc:  # a client bug must not stop the run
            res.error = "client_error"
            res.error_detail = _one_line(f"{type(exc).__name__}: {exc}")
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
                    res.error_detail = f"HTTP {resp.status}: " + _one_line(raw.decode("utf-8", "replace"))
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
                    await self._read_stream(resp, res)

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

    async def _read_stream(self, resp: aiohttp.ClientResponse, res: RequestResult) -> None:
        """Parse the SSE stream, timestamping events as their bytes arrive (hot path)."""
        off = self.offset_ns
        chat = self.endpoint.api == API_CHAT
        keep = self.keep_text
        texts: list[str] | None = [] if keep else None
        times = res.token_times_ns
        pending = b""
        data_lines: list[bytes] = []
        done = False
        first_event = None
        first_content = None
        last = None
        n_events = 0
        reader = resp.content
        while not done:
            chunk = await reader.readany()
            if not chunk:
                break
            now = time.perf_counter_ns() + off
            if pending:
                chunk = pending + chunk
            lines = chunk.split(b"\n")
            pending = lines.pop()
            for line in lines:
                if line.endswith(b"\r"):
                    line = line[:-1]
                if line:
                    if line.startswith(b"data:"):
                        data_lines.append(line[5:].lstrip(b" "))
                    continue  # comments, event:, id:, retry: are ignored
                if not data_lines:
                    continue
                payload = data_lines[0] if len(data_lines) == 1 else b"\n".join(data_lines)
                data_lines = []
                n_events += 1
                if first_event is None:
                    first_event = now
                last = now
                if payload == b"[DONE]":
                    done = True
                    break
                try:
                    obj = _loads(payload)
                except ValueError:
                    res.error = "malformed_sse"
                    res.error_detail = "data line is not JSON: " + _one_line(payload[:120].decode("utf-8", "replace"))
                    done = True
                    break
                if type(obj) is not dict:
                    res.error = "malformed_sse"
                    res.error_detail = "data line is not a JSON object"
                    done = True
                    break
                choices = obj.get("choices")
                if choices:
                    c0 = choices[0]
                    if chat:
                        delta = c0.get("delta") or {}
                        text = delta.get("content")
                        if not text:
                            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                            if reasoning:
                                text = reasoning
                            elif delta.get("tool_calls"):
                                text = " "
                        elif res.first_answer_ns is None:
                            res.first_answer_ns = now
                    else:
                        text = c0.get("text")
                    if text:
                        times.append(now)
                        if first_content is None:
                            first_content = now
                            if res.schema_key is not None:
                                self._schema_roles.on_first_token(res.schema_key)
                        if texts is not None:
                            texts.append(text)
                    fr = c0.get("finish_reason")
                    if fr:
                        res.finish_reason = fr
                usage = obj.get("usage")
                if usage:
                    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
                    if isinstance(pt, int):
                        res.usage_input_tokens = pt
                    if isinstance(ct, int):
                        res.usage_output_tokens = ct
                if "error" in obj and not choices:
                    err = obj["error"]
                    res.error = "stream_error"
                    res.error_detail = _one_line(err.get("message", err) if isinstance(err, dict) else err)
                    done = True
                    break
        if not done and data_lines:  # a last event without its blank line
            payload = b"\n".join(data_lines)
            n_events += 1
            if payload == b"[DONE]":
                done = True
        res.first_event_ns = first_event
        res.first_content_ns = first_content
        res.last_ns = last
        if texts is not None:
            res.output_text = "".join(texts)
        if res.error is not None:
            return
        if n_events == 0:
            res.error = "empty_body"
            res.error_detail = "200 OK with no SSE event"
        elif not done and res.finish_reason is None:
            res.error = "closed_mid_stream"
            res.error_detail = f"stream ended after {n_events} events without [DONE] or finish_reason"
        elif first_content is None:
            res.error = "no_content"
            res.error_detail = "stream finished without non-empty content"

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


def record_result_on_span(span: RequestTrace, res: RequestResult) -> None:
    """Put a finished result's timestamps and counts on its client span and end it."""
    attrs: dict[str, Any] = {
        stages.ATTR_CLIENT_START_NS: res.start_ns,
        stages.ATTR_CLIENT_SCHEDULED_NS: res.scheduled_ns,
        stages.ATTR_CLIENT_SLOT_WAIT_S: res.slot_wait_s,
        ATTR_CLIENT_CONN_WAIT_S: res.conn_wait_s,
    }
    for key, val in (
        (stages.ATTR_CLIENT_CONNECTED_NS, res.connected_ns),
        (stages.ATTR_CLIENT_SENT_NS, res.sent_ns),
        (stages.ATTR_CLIENT_HEADERS_NS, res.headers_ns),
        (stages.ATTR_CLIENT_FIRST_EVENT_NS, res.first_event_ns),
        (stages.ATTR_CLIENT_FIRST_CONTENT_NS, res.first_content_ns),
        (ATTR_CLIENT_FIRST_ANSWER_NS, res.first_answer_ns),
        (stages.ATTR_CLIENT_LAST_NS, res.last_ns),
        (stages.ATTR_CLIENT_HTTP_STATUS, res.status),
        (stages.GEN_AI_REQUEST_MAX_TOKENS, res.requested_output_tokens),
        (ATTR_CLIENT_INPUT_TOKENS_EST, res.input_tokens_est),
        (ATTR_CLIENT_CONN_REUSED, res.conn_reused),
    ):
        if val is not None:
            attrs[key] = val
    if res.finish_reason:
        attrs[stages.GEN_AI_RESPONSE_FINISH_REASONS] = [res.finish_reason]
    if res.lora_role:
        attrs[stages.ATTR_CLIENT_LORA_ROLE] = res.lora_role
        attrs[stages.ATTR_CLIENT_LORA] = res.lora
    if res.schema_role:
        attrs[stages.ATTR_CLIENT_SCHEMA_ROLE] = res.schema_role
        attrs[stages.ATTR_CLIENT_SCHEMA_KEY] = res.schema_key
    if res.prefix_role:
        attrs[stages.ATTR_CLIENT_PREFIX_ROLE] = res.prefix_role
        attrs[stages.ATTR_CLIENT_PREFIX_TOKENS] = int(res.prefix_tokens)
    if res.token_times_ns:
        attrs[ATTR_CLIENT_CONTENT_CHUNKS] = len(res.token_times_ns)
    inp, out = res.input_tokens, res.output_tokens
    if inp is not None:
        attrs[stages.GEN_AI_USAGE_INPUT_TOKENS] = int(inp)
    if out is not None:
        attrs[stages.GEN_AI_USAGE_OUTPUT_TOKENS] = int(out)
        attrs[stages.ATTR_CLIENT_USAGE_SOURCE] = res.token_source
    span.set_attributes(attrs)
    for t in res.token_times_ns:
        span.add_token_time(t)
    end_ns = res.last_ns or res.headers_ns or time.time_ns()
    span.end(end_ns=max(end_ns, res.start_ns), error=res.error)


# --- endpoint discovery -----------------------------------------------------------------------


async def resolve_endpoint(
    url: str,
    api: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 10.0,
    ready: ReadyWait | None = None,
) -> tuple[Endpoint, list[str]]:
    """Find the API and model: URL path or ``api``; else try completions, then chat.

    Returns (endpoint, notes). The model comes from ``GET /v1/models`` when not given (the
    first listed). Detection requests are one-token and are not part of the results. With
    ``ready`` (the wait for a starting server), a detection answered 502/503/504 is sent again
    while that wait has time left.
    """
    base, api_from_url = split_url(url)
    notes: list[str] = []
    api = api or api_from_url
    headers = auth_headers(api_key)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        if model is None:
            try:
                async with session.get(base + "/v1/models") as r:
                    if r.status == 200:
                        doc = await r.json(content_type=None)
                        data = doc.get("data") if isinstance(doc, dict) else None
                        if data and isinstance(data[0], dict) and data[0].get("id"):
                            model = str(data[0]["id"])
                            notes.append(f"model {model!r} from GET /v1/models")
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                pass
            if model is None:
                notes.append("model unknown (GET /v1/models failed); requests carry no 'model' field")
        if api is not None:
            return Endpoint(base, api, model, detected=False), notes
        for candidate in (API_COMPLETIONS, API_CHAT):
            body: dict[str, Any] = {"max_tokens": 1, "stream": True}
            if model:
                body["model"] = model
            if candidate == API_CHAT:
                body["messages"] = [{"role": "user", "content": "hi"}]
            else:
                body["prompt"] = "hi"
            try:
                while True:
                    sent_ns = time.time_ns()
                    async with session.post(base + _PATHS[candidate], json=body) as r:
                        raw = await r.read()
                    if r.status not in NOT_SERVING_STATUSES or ready is None or not await ready.again(
                            not_serving_text(r.status, raw, _PATHS[candidate])):
                        break
                if r.status < 400:
                    notes.append(f"API detected: {candidate} ({_PATHS[candidate]} answered {r.status})")
                    contact = {"request": "api_detection", "sent_ns": sent_ns,
                               "answer_s": (time.time_ns() - sent_ns) / 1e9, "output_tokens": 1}
                    return Endpoint(base, candidate, model, detected=True, first_contact=contact), notes
                notes.append(f"{_PATHS[candidate]} answered {r.status}")
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                notes.append(f"{_PATHS[candidate]}: {type(exc).__name__}")
                break  # the server is not reachable: do not try the other path
    notes.append("API not detected; using completions (pass --api to choose)")
    return Endpoint(base, API_COMPLETIONS, model, detected=False), notes
