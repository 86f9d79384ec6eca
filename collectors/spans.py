"""Span helpers: what an engine (or the probe) calls to emit request traces, stage spans,
engine-step spans and cold-start spans as real OpenTelemetry spans.

Front door: :func:`setup_tracing` returns a :class:`TraceSink`; :data:`NULL_SINK` is the
tracing-off sink whose calls are no-ops and cost one attribute lookup.

Threading: a sink and its RequestTraces may be used from any thread; one RequestTrace should
be driven by one thread at a time (the engine loop or the HTTP handler that owns it).
Record calls only note plain tuples on the caller's thread (a few microseconds, O(1));
the SDK spans are built on one ``ttft-span-build`` thread per sink (:class:`SpanMaterializer`)
and exported on a background thread per exporter (:class:`DroppingBatchProcessor`); a capture
with no other destination is written as OTLP JSON by the ``ttft-span-build`` thread itself. Nothing
blocks or raises on the caller's thread; when a queue is full, spans are dropped and counted
in :attr:`TraceSink.dropped_spans`. Spans reach exporters within about two export intervals,
or at once on :meth:`TraceSink.force_flush`.

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
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from collectors.otel_env import resource_for, traces_url
from diag import stages
from diag.capture import CaptureWriter
from diag.otlp_json import NotPlainValue, json_line, resource_spans_to_dict, span_to_dict, spans_to_dict

log = logging.getLogger(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]


def name_native_thread() -> None:
    """Give the calling thread its Python name in the OS (``top -H``, ``/proc/PID/task/TID/comm``),
    cut to Linux's 15 bytes, so our threads can be told apart in the process they run in. Best effort."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(threading.current_thread().name[:15])
    except OSError:
        pass


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
        name_native_thread()
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
    """Writes spans into a capture's ``spans.otlp.jsonl``: one OTLP JSON request per batch.

    Spans without events or links (all of ours) go straight to an OTLP JSON dict
    (:func:`diag.otlp_json.spans_to_dict`), the same document the protobuf encoder and
    ``diag.otlp_json.request_to_dict`` give, at a fraction of their CPU on the export thread
    (which shares the GIL with the engine it observes); any other batch takes that route.
    """

    def __init__(self, writer: CaptureWriter) -> None:
        self._writer = writer

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:  # noqa: D102
        doc = spans_to_dict(spans)
        if doc is None:
            from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

            self._writer.append_span_request(encode_spans(spans))
        else:
            self._writer.append_span_lines([json_line(doc)])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:  # noqa: D102
        return None


# --- the record path: plain tuples on the caller's thread, SDK spans on the materialiser's ------

_STAGE = 0  # (_STAGE, RequestTrace, name, start_ns, end_ns, attributes | None)
_ROOT = 1  # (_ROOT, RequestTrace, end_ns, token times | None, error | None)
_LOOSE = 2  # (_LOOSE, name, start_ns, end_ns, attributes): a root span of its own trace
_EMPTY_CONTEXT = otel_context.Context()
_LINE_SPANS = 512  # spans per OTLP JSON line written by the materialiser (the batch processor's batch)
_SETTLE_LOCK = threading.Lock()  # settles a RequestTrace's root once, whichever thread asks first
_UNSET = Status(StatusCode.UNSET)


_SCALARS = (bool, int, float)


def _plain_attributes(attrs: dict[str, Any], max_attrs: int | None, max_len: int | None) -> dict[str, Any] | None:
    """``attrs`` as ``BoundedAttributes`` would clean them, or None when cleaning would change them."""
    if max_attrs is not None and len(attrs) > max_attrs:
        return None
    for key, value in attrs.items():
        if not isinstance(key, str) or not key:
            return None
        t = type(value)
        if t in _SCALARS:
            continue
        if t is str:
            if max_len is not None and len(value) > max_len:
                return None
            continue
        if t is list or t is tuple:
            for v in value:
                tv = type(v)
                if not (tv in _SCALARS or (tv is str and (max_len is None or len(v) <= max_len))):
                    return None
            if t is list:
                attrs[key] = tuple(value)
            continue
        return None
    return attrs


class SpanMaterializer:
    """Builds OpenTelemetry SDK spans from plain records, on its own thread.

    The caller's side (:meth:`submit`) only appends a tuple to a bounded deque: O(1), never
    blocks, never raises; a full queue drops and counts (:attr:`dropped_spans`). The
    ``ttft-span-build`` thread settles each request root's ids and sampling (:meth:`new_root`,
    unless the caller asked for them first) and turns records into :class:`ReadableSpan` objects with the tracer's resource,
    scope, span limits and id generator (the same content ``Tracer.start_span``/``end`` give:
    names, ids, parents, timestamps in Unix ns, attributes, status) and hands each to the
    provider's span processor's ``on_end`` (exporters then run on the processors' threads).
    Children follow their request root's sampling decision (what ``ParentBased`` does).
    It wakes every ``interval_s`` or when ``batch`` records wait; :meth:`drain` builds now.

    With a ``writer`` (a capture and nothing else to export to), the thread skips the SDK
    objects and the export thread: it writes each span's OTLP JSON (the document
    :class:`CaptureSpanExporter` writes for the same spans) into the capture itself, one line
    per :data:`_LINE_SPANS` spans; a write that fails drops and counts its spans.
    """

    def __init__(self, tracer: Any, max_queue: int = 65536, batch: int = 256, interval_s: float = 0.5,
                 writer: CaptureWriter | None = None) -> None:
        self._tracer = tracer
        self._writer = writer
        #: the capture exporter, for a span the direct JSON cannot write (its protobuf route)
        self._protobuf = CaptureSpanExporter(writer) if writer is not None else None
        self._processor: SpanProcessor = tracer.span_processor
        self._sampler = tracer.sampler
        self._ids = tracer.id_generator
        self._resource = tracer.resource
        self._info = tracer.instrumentation_info
        self._scope = getattr(tracer, "_instrumentation_scope", None)
        limits = getattr(tracer, "_span_limits", None) or SpanLimits()
        self._max_attrs = limits.max_span_attributes
        self._max_value_len = limits.max_span_attribute_length
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._max_queue = max_queue
        self._batch = batch
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self.dropped_spans = 0
        self._failures_logged: set[str] = set()
        self._worker = threading.Thread(target=self._run, name="ttft-span-build", daemon=True)
        self._worker.start()

    # -- caller's thread -------------------------------------------------------------------------

    def submit(self, record: tuple[Any, ...]) -> None:
        """Queue one span record (any thread; O(1); drops and counts when full or closed)."""
        q = self._queue
        if self._closed or len(q) >= self._max_queue:
            self.dropped_spans += 1
            return
        q.append(record)
        if len(q) >= self._batch and not self._wake.is_set():
            self._wake.set()

    def new_root(
        self,
        name: str,
        kind: SpanKind,
        attributes: dict[str, AttributeValue],
        parent: SpanContext | None,
        parent_context: otel_context.Context,
    ) -> tuple[SpanContext, Mapping[str, Any] | None]:
        """Ids and sampling for a request root, as ``Tracer.start_span`` decides them.

        Returns (its SpanContext, the attributes to record) - attributes None when the
        sampler does not record it (then nothing of the request is exported).
        """
        ids = self._ids
        trace_id = parent.trace_id if parent is not None else ids.generate_trace_id()
        result = self._sampler.should_sample(parent_context, trace_id, name, kind, attributes, ())
        flags = TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT
        random_id = ids.is_trace_id_random() if parent is None else parent.trace_flags.random_trace_id
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        ctx = SpanContext(trace_id, ids.generate_span_id(), False, TraceFlags(flags), result.trace_state)
        return ctx, (result.attributes if result.decision.is_recording() else None)

    # -- the materialiser's thread -----------------------------------------------------------------

    def _attrs(self, *maps: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """The span's attributes as the SDK would keep them (cleaned, bounded).

        When every value is already clean (str within the length limit, bool, int, float, or a
        list of those) and they fit the count limit, a plain dict holds exactly what
        ``BoundedAttributes`` would (lists as tuples, nothing dropped) at a fifth of its cost on
        this thread; anything else goes through ``BoundedAttributes``.
        """
        merged: dict[str, Any] = dict(maps[0]) if maps[0] else {}
        for extra in maps[1:]:
            if extra:
                for key, value in extra.items():
                    merged.pop(key, None)  # a key set again moves to the end, as in BoundedAttributes
                    merged[key] = value
        plain = _plain_attributes(merged, self._max_attrs, self._max_value_len)
        if plain is not None:
            return plain
        attrs = BoundedAttributes(self._max_attrs, maps[0], immutable=False, max_value_len=self._max_value_len)
        for extra in maps[1:]:
            if extra:
                for key, value in extra.items():
                    attrs[key] = value
        return attrs

    def _fields(self, rec: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """(name, context, parent, kind, attributes, start_ns, end_ns, status) of a record's span;
        None when its request is not sampled."""
        tag = rec[0]
        if tag == _STAGE:
            _, req, name, start_ns, end_ns, attributes = rec
            root = req.root_context()
            if req.recorded_attributes is None:
                return None
            ctx = SpanContext(root.trace_id, self._ids.generate_span_id(), False, root.trace_flags, root.trace_state)
            return name, ctx, root, SpanKind.INTERNAL, self._attrs(attributes), start_ns, end_ns, _UNSET
        if tag == _ROOT:
            _, req, end_ns, token_times, error = rec
            ctx = req.root_context()
            if req.recorded_attributes is None:
                return None
            attrs = self._attrs(req.recorded_attributes, *req.attribute_updates)
            if token_times:
                attrs[stages.ATTR_TOKEN_TIMES_NS] = token_times
                attrs[stages.ATTR_FIRST_TOKEN_NS] = token_times[0]
            status = _UNSET
            if error:
                attrs[stages.ATTR_ERROR] = error
                status = Status(StatusCode.ERROR, error)
            return req.name, ctx, req.parent_context, req.kind, attrs, req.start_ns, end_ns, status
        _, name, start_ns, end_ns, attributes = rec  # _LOOSE: a root of its own trace
        ctx, recorded = self.new_root(name, SpanKind.INTERNAL, attributes, None, _EMPTY_CONTEXT)
        if recorded is None:
            return None
        return name, ctx, None, SpanKind.INTERNAL, self._attrs(recorded), start_ns, end_ns, _UNSET

    def _span(self, name: str, ctx: SpanContext, parent: SpanContext | None, kind: SpanKind,
              attributes: Mapping[str, Any], start_ns: int, end_ns: int, status: Status = _UNSET) -> ReadableSpan:
        return ReadableSpan(
            name=name, context=ctx, parent=parent, resource=self._resource, attributes=attributes,
            kind=kind, instrumentation_info=self._info, status=status, start_time=start_ns, end_time=end_ns,
            instrumentation_scope=self._scope,
        )

    def _doc(self, fields: tuple[Any, ...]) -> dict[str, Any]:
        """A span's OTLP JSON straight from its fields (raises NotPlainValue for the protobuf route)."""
        name, ctx, parent, kind, attrs, start_ns, end_ns, status = fields
        dropped = attrs.dropped if isinstance(attrs, BoundedAttributes) else 0
        return span_to_dict(ctx, parent, name, kind, start_ns, end_ns, attrs, dropped, status)

    def drain(self) -> None:
        """Build and hand on every queued record now (any thread; records keep their order)."""
        with self._lock:
            q = self._queue
            docs: list[dict[str, Any]] = []
            while q:
                rec = q.popleft()
                try:
                    fields = self._fields(rec)
                    if fields is None:
                        continue
                    if self._writer is None:
                        self._processor.on_end(self._span(*fields))
                        continue
                    try:
                        docs.append(self._doc(fields))
                    except NotPlainValue:  # a value the fast path leaves to protobuf: its own line, in order
                        self._write(docs)
                        docs = []
                        self._protobuf.export([self._span(*fields)])  # type: ignore[union-attr]
                    if len(docs) >= _LINE_SPANS:
                        self._write(docs)
                        docs = []
                except Exception as exc:  # never let one bad record stop the others
                    self._failed(exc)
            self._write(docs)

    def _write(self, docs: list[dict[str, Any]]) -> None:
        """Append span docs to the capture as one OTLP JSON line (a failure drops and counts them)."""
        if not docs or self._writer is None:
            return
        try:
            doc = {"resourceSpans": [resource_spans_to_dict(self._resource, {self._scope: docs})]}
            self._writer.append_span_lines([json_line(doc)])
        except Exception as exc:
            self._failed(exc, len(docs))

    def _failed(self, exc: Exception, spans: int = 1) -> None:
        self.dropped_spans += spans
        kind = type(exc).__name__
        if kind not in self._failures_logged:
            self._failures_logged.add(kind)
            log.warning("building or writing a span failed (%s): %s", kind, exc)

    def _run(self) -> None:
        name_native_thread()
        while not self._closed:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self.drain()

    def shutdown(self) -> None:
        """Stop taking records, build what is queued, stop the thread. Idempotent."""
        self._closed = True
        self._wake.set()
        if self._worker is not threading.current_thread():
            self._worker.join(timeout=5)
        self.drain()


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
        with _SETTLE_LOCK:
            if self._pending is not None:
                attributes, traceparent = self._pending
                parent_context = _EMPTY_CONTEXT
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
            self._mat.submit((_STAGE, self, name, start_ns, time.time_ns(), attrs))

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
            (_STAGE, self, name, start_ns, end_ns if end_ns > start_ns else start_ns,
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
            (_ROOT, self, time.time_ns() if end_ns is None else int(end_ns), self._token_times_ns or None, error or None)
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
        self._mat.submit((_LOOSE, name, start_ns, end_ns if end_ns > start_ns else start_ns, dict(attributes)))

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
