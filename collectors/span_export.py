"""Span export for :mod:`collectors.spans`: the dropping batch processor, the capture exporter,
and thread naming.

:class:`DroppingBatchProcessor` exports on a background thread of its own and drops (and counts)
spans when its queue is full, so the engine's thread never blocks; :class:`CaptureSpanExporter`
writes OTLP JSON lines into a capture on that thread.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from diag.ground.capture import CaptureWriter
from diag.ground.otlp_json import json_line, spans_to_dict

log = logging.getLogger("collectors.spans")


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
    (:func:`diag.ground.otlp_json.spans_to_dict`), the same document the protobuf encoder and
    ``diag.ground.otlp_json.request_to_dict`` give, at a fraction of their CPU on the export thread
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
