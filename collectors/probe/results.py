"""What the probe's client records of one request: :class:`RequestResult`, its error kinds, and
its client span.

Times are Unix ns (None when not reached), durations seconds. A result is a plain value: built on
the event loop that sent the request, then read on any thread or shipped to another process
(:meth:`RequestResult.to_dict`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from collectors.spans import RequestTrace
from diag.ground import stages

# Attribute keys of the probe (defined in diag.ground.stages).
ATTR_CLIENT_CONN_WAIT_S = stages.ATTR_CLIENT_CONN_WAIT_S
ATTR_CLIENT_CONN_REUSED = stages.ATTR_CLIENT_CONN_REUSED
ATTR_CLIENT_CONTENT_CHUNKS = stages.ATTR_CLIENT_CONTENT_CHUNKS
ATTR_CLIENT_FIRST_ANSWER_NS = stages.ATTR_CLIENT_FIRST_ANSWER_NS
ATTR_CLIENT_API = stages.ATTR_CLIENT_API
ATTR_CLIENT_INPUT_TOKENS_EST = stages.ATTR_CLIENT_INPUT_TOKENS_EST

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
