"""One ``transformers serve`` request's instrumentation state and how its stages are recorded.

A :class:`ServeRequest` is made by the ASGI middleware (event-loop thread) for each traced HTTP
request and carried to the handler through a ``contextvars.ContextVar`` (:data:`CURRENT`); the
generation side finds it through the streamer (plain mode) or by request id (continuous
batching, :data:`BY_REQUEST_ID`). Times are Unix epoch ns (``time.time_ns()``).

Threading: fields before generation are written on the event-loop thread; the prefill / sample
fields are written on the generation thread (the inference thread in plain mode, the CB loop in
continuous batching) before the first token is handed over, and read afterwards by the thread
that records the first token; the request span is ended on the event-loop thread after the last
token. Every method is called under :meth:`HookStats.guard` by the hooks.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

from diag.ground import stages

ENGINE = "transformers"
#: the request being handled in this asyncio task (set by the ASGI middleware)
CURRENT: contextvars.ContextVar[ServeRequest | None] = contextvars.ContextVar("ttft_serve_request", default=None)
#: continuous batching: the CB loop finds requests by the id the handler gave ``add_request``
BY_REQUEST_ID: dict[str, ServeRequest] = {}
#: per generation thread: the plain-mode request whose ``model.generate`` runs on it, last forward
THREAD = threading.local()


class ServeRequest:
    """What one request's hooks have seen so far; records stage spans when they are complete."""

    def __init__(self, traceparent: str | None, path: str) -> None:
        self.traceparent = traceparent
        self.path = path
        self.trace: Any = None
        self.request_id = ""
        self.status = 0
        self.tokenizing = False
        self.tokenize_end_ns: int | None = None
        self.input_tokens: int | None = None
        self.streaming = False
        self.prompt_seen = False  # plain: model.generate handed the prompt to the streamer
        self.prefill_start_ns: int | None = None  # first forward over this request starts
        self.prefill_end_ns: int | None = None  # the forward that produced its first token ends
        self.sample_start_ns: int | None = None
        self.sample_end_ns: int | None = None  # first token id known on the host
        self.sample_hook: Any = None  # plain mode: a torch hook handle armed after prefill, or None
        self.first_token_ns: int | None = None
        self.last_token_ns: int | None = None
        self.output_tokens = 0
        self.ended = False

    # -- event-loop thread ------------------------------------------------------------------------

    def start(self, sink: Any, request_id: str, body: dict[str, Any]) -> None:
        """Open the request span (the handler has the parsed body)."""
        self.request_id = str(request_id)
        attrs: dict[str, Any] = {stages.ATTR_ENGINE: ENGINE, stages.GEN_AI_RESPONSE_ID: self.request_id,
                                 stages.GEN_AI_OPERATION: "chat" if "chat" in self.path else "text_completion"}
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if isinstance(max_tokens, int):
            attrs[stages.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
        if isinstance(body.get("temperature"), (int, float)):
            attrs[stages.GEN_AI_REQUEST_TEMPERATURE] = float(body["temperature"])
        model = body.get("model") if isinstance(body.get("model"), str) else None
        self.streaming = bool(body.get("stream"))
        self.trace = sink.start_request(self.request_id, model=model, attributes=attrs,
                                        traceparent=self.traceparent, start_ns=time.time_ns())

    def tokenized(self, start_ns: int, end_ns: int) -> None:
        self.tokenize_end_ns = end_ns
        self.trace.record_stage(stages.TOKENIZE, start_ns, end_ns)

    def finish(self, error: str | None = None) -> None:
        """End the request span once (last body sent, or the request failed)."""
        if self.ended or self.trace is None:
            return
        self.ended = True
        BY_REQUEST_ID.pop(self.request_id, None)
        tr = self.trace
        if self.first_token_ns is not None and self.last_token_ns is not None and self.output_tokens > 1:
            tr.record_stage(stages.DECODE, self.first_token_ns, self.last_token_ns)
        attrs: dict[str, Any] = {stages.GEN_AI_USAGE_OUTPUT_TOKENS: self.output_tokens}
        if self.input_tokens is not None:
            attrs[stages.GEN_AI_USAGE_INPUT_TOKENS] = self.input_tokens
        tr.set_attributes(attrs)
        if error is None and self.status >= 400:
            error = f"http_{self.status}"
        tr.end(error=error)

    # -- generation side --------------------------------------------------------------------------

    def first_forward(self, start_ns: int) -> None:
        """The first forward that works on this request starts: the queue ends here."""
        if self.prefill_start_ns is None:
            self.prefill_start_ns = start_ns
            queue_start = self.tokenize_end_ns or start_ns
            self.trace.record_stage(stages.QUEUE, queue_start, max(queue_start, start_ns))

    def prefill_done(self, forward_end_ns: int) -> None:
        """The forward that produced this request's first token returned."""
        if self.prefill_end_ns is None and self.prefill_start_ns is not None:
            self.prefill_end_ns = forward_end_ns
            self.sample_start_ns = forward_end_ns
            self.trace.record_stage(stages.PREFILL, self.prefill_start_ns, forward_end_ns)

    def sampled(self, end_ns: int) -> None:
        """The first token id is on the host (logits processing, sampling, device-to-host copy)."""
        if self.sample_end_ns is None and self.sample_start_ns is not None:
            self.sample_end_ns = end_ns
            self.trace.record_stage(stages.SAMPLE, self.sample_start_ns, end_ns)

    def disarm(self) -> None:
        """Remove the one-shot forward pre-hook armed after prefill (generation thread)."""
        hook, self.sample_hook = self.sample_hook, None
        if hook is not None:
            hook.remove()

    def tokens_out(self, start_ns: int, end_ns: int, n: int) -> None:
        """The streamer decoded ``n`` new tokens and queued their text (start..end of that call)."""
        if n <= 0:
            return
        if self.first_token_ns is None:
            self.first_token_ns = end_ns
            self.trace.record_stage(stages.DETOKENIZE, start_ns, end_ns)
        self.last_token_ns = end_ns
        self.output_tokens += n
        self.trace.add_token_time(end_ns, n)
