"""Span helpers: what an engine (or the probe) calls to emit request traces, stage spans,
engine-step spans and cold-start spans as real OpenTelemetry spans.

Front door: :func:`setup_tracing` returns a :class:`TraceSink`; :data:`NULL_SINK` is the
tracing-off sink whose calls are no-ops and cost one attribute lookup.

Threading: a sink and its RequestTraces may be used from any thread; one RequestTrace should
be driven by one thread at a time (the engine loop or the HTTP handler that owns it).
Record calls only note plain tuples on the caller's thread (a few microseconds, O(1));
the SDK spans are built on one ``ttft-span-build`` thread per sink (:class:`SpanMaterializer`)
and exported on a background thread per exporter (:class:`DroppingBatchProcessor`); a capture
with no other destination is written as OTLP JSON by the ``ttft-span-build`` thread itself (the
record path: :mod:`collectors.span_build`; processors and exporters: :mod:`collectors.span_export`).
Nothing blocks or raises on the caller's thread; when a queue is full, spans are dropped and counted
in :attr:`TraceSink.dropped_spans`. Spans reach exporters within about two export intervals,
or at once on :meth:`TraceSink.force_flush`.

Times are Unix epoch nanoseconds (``time.time_ns()``), OpenTelemetry's convention.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from collectors.otel_env import resource_for, traces_url
from collectors.span_build import EMPTY_CONTEXT, LOOSE, ROOT, SETTLE_LOCK, STAGE, AttributeValue, SpanMaterializer
from collectors.span_export import CaptureSpanExporter, DroppingBatchProcessor
from diag.ground import stages
from diag.ground.capture import CaptureWriter

_PROPAGATOR = TraceContextTextMapPropagator()


class RequestTrace:
    """One request's trace: a root span plus stage spans. Created by TraceSink.start_request.

    Calls only note plain values; each stage is handed on when it ends, the root when
    :meth:`end` is called, and the SDK spans are built on the sink's materialiser thread.
    The root's ids and sampling decision (the caller's ``traceparent`` parsed, the sampler
    asked) are settled once, on first need (:meth:`root_context`): by the caller when it asks
    for :meth:`traceparent` or :attr:`trace_id_hex`, else on the materialiser thread, off the
    request's path. A request its sampler does not record keeps its ids and exports nothing.
    Attribute values must not be mutated after they are passed in.
    """

    __slots__ = ("_mat", "_ctx", "parent_context", "name", "kind", "start_ns", "recorded_attributes",
                 "attribute_updates", "_token_times_ns", "_ended", "_pending")

    def __init__(
        self,
        materializer: SpanMaterializer | None = None,
        name: str = "",
        kind: SpanKind = SpanKind.INTERNAL,
        start_ns: int = 0,
        attributes: dict[str, AttributeValue] | None = None,
        traceparent: str | None = None,
    ) -> None:
        self._mat = materializer
        self._ctx: SpanContext | None = None
        self.parent_context: SpanContext | None = None
        self.name = name
        self.kind = kind
        self.start_ns = start_ns
        #: the root's attributes as the sampler returned them; None: not recorded (or not settled)
        self.recorded_attributes: Mapping[str, Any] | None = None
        self.attribute_updates: list[dict[str, AttributeValue]] = []
        self._token_times_ns: list[int] = []
        self._ended = False
        # (attributes, traceparent) until the root is settled; None for the tracing-off trace
        self._pending: tuple[dict[str, AttributeValue], str | None] | None = (
            (attributes or {}, traceparent) if materializer is not None else None)

    def root_context(self) -> SpanContext | None:
        """The root span's context (None when tracing is off); settles ids and sampling once (any thread)."""
        ctx = self._ctx
        if ctx is not None or self._pending is None:
            return ctx
        with SETTLE_LOCK:
            if self._pending is not None:
                attributes, traceparent = self._pending
                parent_context = EMPTY_CONTEXT
                if traceparent:
                    parent_context = _PROPAGATOR.extract({"traceparent": traceparent})
                    found = trace.get_current_span(parent_context).get_span_context()
                    if found.is_valid:
                        self.parent_context = found
                ctx, self.recorded_attributes = self._mat.new_root(  # type: ignore[union-attr]
                    self.name, self.kind, attributes, self.parent_context, parent_context)
                self._ctx = ctx
                self._pending = None
        return self._ctx

    @property
    def enabled(self) -> bool:
        return self._mat is not None

    @property
    def trace_id_hex(self) -> str:
        """The 32-hex-digit trace id ("" when tracing is off)."""
        ctx = self.root_context()
        return "" if ctx is None else format(ctx.trace_id, "032x")

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` header value that makes a callee join this trace."""
        ctx = self.root_context()
        if ctx is None:
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(trace.NonRecordingSpan(ctx)))
        return carrier.get("traceparent")

    @contextlib.contextmanager
    def stage(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[None]:
        """Time a stage on the calling thread as a child span of the request."""
        if self._mat is None:
            yield
            return
        attrs = dict(attributes) if attributes else None
        start_ns = time.time_ns()
        try:
            yield
        finally:
            self._mat.submit((STAGE, self, name, start_ns, time.time_ns(), attrs))

    def record_stage(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """Record a stage timed elsewhere (e.g. inside a batched engine step). O(1)."""
        if self._mat is None:
            return
        start_ns = int(start_ns)
        end_ns = int(end_ns)
        self._mat.submit(
            (STAGE, self, name, start_ns, end_ns if end_ns > start_ns else start_ns,
             dict(attributes) if attributes else None)
        )

    def add_token_time(self, ns: int, n: int = 1) -> None:
        """Note the Unix ns at which ``n`` tokens were emitted (kept as one array attribute)."""
        if self._mat is not None and not self._ended:
            if n == 1:
                self._token_times_ns.append(int(ns))
            elif n > 1:
                self._token_times_ns.extend([int(ns)] * n)

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        """Set attributes on the request span (ignored once it has ended, as the SDK does)."""
        if self._mat is not None and not self._ended:
            self.attribute_updates.append(dict(attributes))

    def end(self, end_ns: int | None = None, error: str | None = None) -> None:
        """End the request span; idempotent. ``error`` is a short kind like "disconnect"."""
        if self._mat is None or self._ended:
            return
        self._ended = True
        self._mat.submit(
            (ROOT, self, time.time_ns() if end_ns is None else int(end_ns), self._token_times_ns or None, error or None)
        )


NULL_REQUEST = RequestTrace()


class TraceSink:
    """Where spans go. Build one with :func:`setup_tracing`; :data:`NULL_SINK` is tracing off.

    Record calls are cheap on the caller's thread (see :class:`SpanMaterializer`); spans reach
    the processors within about ``interval_s`` or at :meth:`force_flush`/:meth:`shutdown`.
    ``direct``: ``writer`` is the only destination and the materialiser writes it itself.
    """

    def __init__(
        self,
        provider: TracerProvider | None = None,
        processors: Sequence[DroppingBatchProcessor] = (),
        writer: CaptureWriter | None = None,
        memory: InMemorySpanExporter | None = None,
        max_queue: int = 65536,
        interval_s: float = 0.5,
        provider_name: str | None = None,
        direct: bool = False,
        build_batch: int = 256,
    ) -> None:
        self.provider = provider
        #: gen_ai.provider.name (and the deprecated gen_ai.system) on every request root
        self._provider_attrs: dict[str, AttributeValue] = (
            {stages.GEN_AI_PROVIDER_NAME: provider_name, stages.GEN_AI_SYSTEM: provider_name} if provider_name else {})
        self._tracer = provider.get_tracer("ttft-diag") if provider is not None else None
        self._mat = (
            SpanMaterializer(self._tracer, max_queue=max_queue, batch=build_batch, interval_s=interval_s,
                             writer=writer if direct else None)
            if self._tracer is not None else None
        )
        self._processors = list(processors)
        self.writer = writer
        self.memory = memory

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @property
    def dropped_spans(self) -> int:
        """Spans dropped because a queue was full, an exporter failed or a span could not be built."""
        own = self._mat.dropped_spans if self._mat is not None else 0
        return own + sum(p.dropped_spans for p in self._processors)

    def start_request(
        self,
        request_id: str,
        model: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
        traceparent: str | None = None,
        start_ns: int | None = None,
        side: str = "server",
    ) -> RequestTrace:
        """Open a request's root span; joins the caller's trace when ``traceparent`` is given.

        O(1): the ``traceparent`` is parsed and the sampler asked when the root is first needed
        (:meth:`RequestTrace.root_context`), off the caller's path unless it asks for the ids.
        """
        mat = self._mat
        if mat is None:
            return NULL_REQUEST
        attrs: dict[str, AttributeValue] = {
            stages.ATTR_SIDE: side,
            stages.ATTR_REQUEST_ID: request_id,
        }
        if model:
            attrs[stages.GEN_AI_REQUEST_MODEL] = model
        if self._provider_attrs:
            attrs.update(self._provider_attrs)
        if attributes:
            attrs.update(attributes)
        name = stages.SPAN_CLIENT_REQUEST if side == "client" else stages.SPAN_REQUEST
        kind = SpanKind.CLIENT if side == "client" else SpanKind.SERVER
        return RequestTrace(mat, name, kind, time.time_ns() if start_ns is None else int(start_ns), attrs, traceparent)

    def _record(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]) -> None:
        if self._mat is None:
            return
        start_ns = int(start_ns)
        end_ns = int(end_ns)
        self._mat.submit((LOOSE, name, start_ns, end_ns if end_ns > start_ns else start_ns, dict(attributes)))

    def record_step(self, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue]) -> None:
        """One engine step (a forward over a batch) with its ATTR_STEP_* batch make-up. O(1)."""
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
        """Build every queued span and export what the processors hold (blocks the caller)."""
        if self._mat is not None:
            self._mat.drain()
        for p in self._processors:
            p.force_flush()

    def shutdown(self) -> None:
        """Flush and stop exporters; closes the capture writer (writes meta.json)."""
        if self._mat is not None:
            self._mat.shutdown()
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
    provider_name: str | None = None,
    build_batch: int = 256,
) -> TraceSink:
    """Build a TraceSink exporting to a capture directory, an OTLP/HTTP endpoint and/or memory.

    Returns NULL_SINK when no destination is given. ``otlp_endpoint`` is a base URL such as
    ``http://127.0.0.1:4318`` (``/v1/traces`` is appended when it has no path) or a traces URL
    (:func:`collectors.otel_env.traces_url`). The resource follows ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES``, ``service_name`` by default. ``provider_name`` goes on every
    request root as ``gen_ai.provider.name`` (and the deprecated ``gen_ai.system``). ``writer`` lets a
    caller share one CaptureWriter with other collectors. The span-build thread wakes every
    ``export_interval_s`` or when ``build_batch`` records wait.
    """
    if capture_dir is None and otlp_endpoint is None and not memory and writer is None:
        return NULL_SINK
    provider = TracerProvider(resource=resource_for(service_name))
    processors: list[DroppingBatchProcessor] = []
    if writer is None and capture_dir is not None:
        writer = CaptureWriter(capture_dir, meta=meta)
    elif writer is not None and meta:
        writer.update_meta(**meta)
    # a capture alone is written by the span-build thread itself (no SDK span objects, no export thread)
    direct = writer is not None and otlp_endpoint is None and not memory
    if writer is not None and not direct:
        processors.append(
            DroppingBatchProcessor(CaptureSpanExporter(writer), max_queue, interval_s=export_interval_s)
        )
    if otlp_endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = traces_url(otlp_endpoint)
        processors.append(
            DroppingBatchProcessor(OTLPSpanExporter(endpoint=url, timeout=5), max_queue, interval_s=export_interval_s)
        )
    mem = None
    if memory:
        mem = InMemorySpanExporter()
        processors.append(DroppingBatchProcessor(mem, max_queue, interval_s=export_interval_s))
    for p in processors:
        provider.add_span_processor(p)
    return TraceSink(provider, processors, writer, mem, max_queue=max_queue, interval_s=export_interval_s,
                     provider_name=provider_name, direct=direct, build_batch=build_batch)


def now_ns() -> int:
    """Unix epoch nanoseconds: the clock every span uses."""
    return time.time_ns()
