"""Span helpers: what an engine (or the probe) calls to emit request traces, stage spans,
engine-step spans and cold-start spans as real OpenTelemetry spans.

Front door: :func:`setup_tracing` returns a :class:`TraceSink`; :data:`NULL_SINK` is the
tracing-off sink whose calls are no-ops and cost one attribute lookup.

Threading: a sink and its RequestTraces may be used from any thread; one RequestTrace should
be driven by one thread at a time (the engine loop or the HTTP handler that owns it).
Exporting happens on a background thread per exporter (:class:`DroppingBatchProcessor`):
``on_end`` never blocks and never raises; when the queue is full, spans are dropped and
counted in :attr:`TraceSink.dropped_spans`.

Times are Unix epoch nanoseconds (``time.time_ns()``), OpenTelemetry's convention.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from diag import stages
from diag.capture import CaptureWriter

log = logging.getLogger(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]


class DroppingBatchProcessor(SpanProcessor):
    """A batch span processor that never blocks the caller: a bounded deque, a worker thread.

    ``on_end`` runs on the caller's thread and only appends (O(1)) or counts a drop.
    The worker exports batches of up to ``max_batch`` spans every ``interval_s`` or when a
    batch is full. Exporter failures are logged once per kind and counted as dropped.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue: int = 65536,
        max_batch: int = 512,
        interval_s: float = 0.5,
    ) -> None:
        self._exporter = exporter
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()
        self.dropped_spans = 0
        self.exported_spans = 0
        self._worker = threading.Thread(target=self._run, name="ttft-span-export", daemon=True)
        self._worker.start()

    def on_start(self, span: Any, parent_context: Any = None) -> None:  # noqa: D102
        return None

    def on_end(self, span: ReadableSpan) -> None:  # noqa: D102
        if len(self._queue) >= self._max_queue or self._stopping:
            self.dropped_spans += 1
            return
        self._queue.append(span)
        if len(self._queue) >= self._max_batch:
            self._wake.set()

    def _drain(self) -> None:
        with self._lock:
            while self._queue:
                batch: list[ReadableSpan] = []
                while self._queue and len(batch) < self._max_batch:
                    batch.append(self._queue.popleft())
                try:
                    result = self._exporter.export(batch)
                except Exception as exc:  # an exporter must never take the engine down
                    log.warning("span export failed: %s", exc)
                    result = SpanExportResult.FAILURE
                if result == SpanExportResult.SUCCESS:
                    self.exported_spans += len(batch)
                else:
                    self.dropped_spans += len(batch)

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self._drain()

    def force_flush(self, timeout_millis: int = 30000) -> bool:  # noqa: D102
        self._drain()
        return True

    def shutdown(self) -> None:  # noqa: D102
        self._stopping = True
        self._wake.set()
        self._worker.join(timeout=5)
        self._drain()
        self._exporter.shutdown()


class CaptureSpanExporter(SpanExporter):
    """Writes spans into a capture's ``spans.otlp.jsonl``: one OTLP JSON request per batch."""

    def __init__(self, writer: CaptureWriter) -> None:
        self._writer = writer

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:  # noqa: D102
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        self._writer.append_span_request(encode_spans(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:  # noqa: D102
        return None


class RequestTrace:
    """One request's trace: a root span plus stage spans. Created by TraceSink.start_request."""

    __slots__ = ("_tracer", "_span", "_ctx", "_token_times_ns", "_ended")

    def __init__(self, tracer: trace.Tracer | None, span: trace.Span | None) -> None:
        self._tracer = tracer
        self._span = span
        self._ctx = trace.set_span_in_context(span) if span is not None else None
        self._token_times_ns: list[int] = []
        self._ended = False

    @property
    def enabled(self) -> bool:
        return self._span is not None

    @property
    def trace_id_hex(self) -> str:
        """The 32-hex-digit trace id ("" when tracing is off)."""
        if self._span is None:
            return ""
        return format(self._span.get_span_context().trace_id, "032x")

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` header value that makes a callee join this trace."""
        if self._ctx is None:
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=self._ctx)
        return carrier.get("traceparent")

    @contextlib.contextmanager
    def stage(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[None]:
        """Time a stage on the calling thread as a child span of the request."""
        if self._tracer is None:
            yield
            return
        span = self._tracer.start_span(name, context=self._ctx, attributes=attributes)
        try:
            yield
        finally:
            span.end()

    def record_stage(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """Record a stage timed elsewhere (e.g. inside a batched engine step)."""
        if self._tracer is None:
            return
        span = self._tracer.start_span(
            name, context=self._ctx, start_time=int(start_ns), attributes=attributes
        )
        span.end(end_time=max(int(end_ns), int(start_ns)))

    def add_token_time(self, ns: int) -> None:
        """Note the Unix ns at which a token was emitted (kept as one array attribute)."""
        if self._span is not None:
            self._token_times_ns.append(int(ns))

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self._span is not None:
            self._span.set_attributes(dict(attributes))

    def end(self, end_ns: int | None = None, error: str | None = None) -> None:
        """End the request span; idempotent. ``error`` is a short kind like "disconnect"."""
        if self._span is None or self._ended:
            return
        self._ended = True
        if self._token_times_ns:
            self._span.set_attribute(stages.ATTR_TOKEN_TIMES_NS, self._token_times_ns)
            self._span.set_attribute(stages.ATTR_FIRST_TOKEN_NS, self._token_times_ns[0])
        if error:
            self._span.set_attribute(stages.ATTR_ERROR, error)
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end(end_time=end_ns)


NULL_REQUEST = RequestTrace(None, None)


class TraceSink:
    """Where spans go. Build one with :func:`setup_tracing`; :data:`NULL_SINK` is tracing off."""

    def __init__(
        self,
        provider: TracerProvider | None = None,
        processors: Sequence[DroppingBatchProcessor] = (),
        writer: CaptureWriter | None = None,
        memory: InMemorySpanExporter | None = None,
    ) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("ttft-diag") if provider is not None else None
        self._processors = list(processors)
        self.writer = writer
        self.memory = memory

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @property
    def dropped_spans(self) -> int:
        """Spans dropped because an export queue was full or an exporter failed."""
        return sum(p.dropped_spans for p in self._processors)

    def start_request(
        self,
        request_id: str,
        model: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
        traceparent: str | None = None,
        start_ns: int | None = None,
        side: str = "server",
    ) -> RequestTrace:
        """Open a request's root span; joins the caller's trace when ``traceparent`` is given."""
        if self._tracer is None:
            return NULL_REQUEST
        parent = otel_context.Context()
        if traceparent:
            parent = _PROPAGATOR.extract({"traceparent": traceparent})
        attrs: dict[str, AttributeValue] = {
            stages.ATTR_SIDE: side,
            stages.ATTR_REQUEST_ID: request_id,
        }
        if model:
            attrs[stages.GEN_AI_REQUEST_MODEL] = model
        if attributes:
            attrs.update(attributes)
        name = stages.SPAN_CLIENT_REQUEST if side == "client" else stages.SPAN_REQUEST
        kind = SpanKind.CLIENT if side == "client" else SpanKind.SERVER
        span = self._tracer.start_span(
            name, context=parent, kind=kind, attributes=attrs, start_time=start_ns
        )
        return RequestTrace(self._tracer, span)

    def _record(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]) -> None:
        if self._tracer is None:
            return
        span = self._tracer.start_span(
            name, context=otel_context.Context(), start_time=int(start_ns), attributes=attributes
        )
        span.end(end_time=max(int(end_ns), int(start_ns)))

    def record_step(self, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue]) -> None:
        """One engine step (a forward over a batch) with its ATTR_STEP_* batch make-up."""
        self._record(stages.SPAN_ENGINE_STEP, start_ns, end_ns, attributes)

    def record_cold_start(
        self, start_ns: int, end_ns: int, phase: str, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        """Model load / warm-up: start-up cost, outside any request (never TTFT)."""
        attrs: dict[str, Any] = {stages.ATTR_COLD_START_PHASE: phase}
        if attributes:
            attrs.update(attributes)
        self._record(stages.SPAN_COLD_START, start_ns, end_ns, attrs)

    def set_meta(self, **fields: Any) -> None:
        """Merge fields into the capture's meta.json (no-op without a capture)."""
        if self.writer is not None:
            self.writer.update_meta(**fields)

    def force_flush(self) -> None:
        for p in self._processors:
            p.force_flush()

    def shutdown(self) -> None:
        """Flush and stop exporters; closes the capture writer (writes meta.json)."""
        if self.provider is not None:
            self.provider.shutdown()  # shuts down the processors (flushes)
        if self.writer is not None:
            self.writer.update_meta(dropped_spans=self.dropped_spans)
            self.writer.close()


NULL_SINK = TraceSink()


def setup_tracing(
    service_name: str = "ttft-diag",
    capture_dir: str | Path | None = None,
    otlp_endpoint: str | None = None,
    memory: bool = False,
    meta: Mapping[str, Any] | None = None,
    max_queue: int = 65536,
    export_interval_s: float = 0.5,
    writer: CaptureWriter | None = None,
) -> TraceSink:
    """Build a TraceSink exporting to a capture directory, an OTLP/HTTP endpoint and/or memory.

    Returns NULL_SINK when no destination is given. ``otlp_endpoint`` is a base URL such as
    ``http://127.0.0.1:4318`` (``/v1/traces`` is appended when missing). ``writer`` lets a
    caller share one CaptureWriter with other collectors.
    """
    if capture_dir is None and otlp_endpoint is None and not memory and writer is None:
        return NULL_SINK
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    processors: list[DroppingBatchProcessor] = []
    if writer is None and capture_dir is not None:
        writer = CaptureWriter(capture_dir, meta=meta)
    elif writer is not None and meta:
        writer.update_meta(**meta)
    if writer is not None:
        processors.append(
            DroppingBatchProcessor(CaptureSpanExporter(writer), max_queue, interval_s=export_interval_s)
        )
    if otlp_endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = otlp_endpoint.rstrip("/")
        if not url.endswith("/v1/traces"):
            url += "/v1/traces"
        processors.append(
            DroppingBatchProcessor(OTLPSpanExporter(endpoint=url, timeout=5), max_queue, interval_s=export_interval_s)
        )
    mem = None
    if memory:
        mem = InMemorySpanExporter()
        processors.append(DroppingBatchProcessor(mem, max_queue, interval_s=export_interval_s))
    for p in processors:
        provider.add_span_processor(p)
    return TraceSink(provider, processors, writer, mem)


def now_ns() -> int:
    """Unix epoch nanoseconds: the clock every span uses."""
    return time.time_ns()
