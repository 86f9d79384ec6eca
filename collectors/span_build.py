"""The record path of :mod:`collectors.spans`: plain tuples noted on the caller's thread become
SDK spans (or OTLP JSON lines written straight into a capture) on one ``ttft-span-build`` thread.

:class:`SpanMaterializer` owns that thread and its bounded queue (full: the record is dropped
and counted). Times are Unix ns.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from collectors.span_export import CaptureSpanExporter, name_native_thread
from diag.ground import stages
from diag.ground.capture import CaptureWriter
from diag.ground.otlp_json import NotPlainValue, json_line, resource_spans_to_dict, span_to_dict

log = logging.getLogger("collectors.spans")

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]

STAGE = 0  # (STAGE, RequestTrace, name, start_ns, end_ns, attributes | None)
ROOT = 1  # (ROOT, RequestTrace, end_ns, token times | None, error | None)
LOOSE = 2  # (LOOSE, name, start_ns, end_ns, attributes): a root span of its own trace
EMPTY_CONTEXT = otel_context.Context()
_LINE_SPANS = 512  # spans per OTLP JSON line written by the materialiser (the batch processor's batch)
SETTLE_LOCK = threading.Lock()  # settles a RequestTrace's root once, whichever thread asks first
_UNSET = Status(StatusCode.UNSET)

_SCALARS = (bool, int, float)


def plain_attributes(attrs: dict[str, Any], max_attrs: int | None, max_len: int | None) -> dict[str, Any] | None:
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
        plain = plain_attributes(merged, self._max_attrs, self._max_value_len)
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
        if tag == STAGE:
            _, req, name, start_ns, end_ns, attributes = rec
            root = req.root_context()
            if req.recorded_attributes is None:
                return None
            ctx = SpanContext(root.trace_id, self._ids.generate_span_id(), False, root.trace_flags, root.trace_state)
            return name, ctx, root, SpanKind.INTERNAL, self._attrs(attributes), start_ns, end_ns, _UNSET
        if tag == ROOT:
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
        _, name, start_ns, end_ns, attributes = rec  # LOOSE: a root of its own trace
        ctx, recorded = self.new_root(name, SpanKind.INTERNAL, attributes, None, EMPTY_CONTEXT)
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
