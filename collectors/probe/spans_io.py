"""Moving the probe's client spans from memory into a capture.

The probe traces into an in-memory exporter (``setup_tracing(memory=True)``) so that no
encoding happens on a background thread while requests are being timed (it would take the
GIL from the event loop and inflate measured TTFT). Between load phases the finished spans
are encoded to OTLP JSON lines (one ExportTraceServiceRequest per ``batch`` spans) and
appended to the capture.

Threading: call from the thread that ends the spans (the probe's loop thread) while no
request is finishing, e.g. between phases.
"""

from __future__ import annotations

from collections.abc import Sequence

from collectors.spans import TraceSink
from diag.ground.otlp_json import json_line, spans_to_dict
from diag.ground.capture import CaptureWriter


def drain_span_lines(sink: TraceSink, batch: int = 512) -> list[str]:
    """Flush the sink, take its finished in-memory spans and encode them as OTLP JSON lines."""
    if sink.memory is None:
        return []
    sink.force_flush()
    spans: Sequence = sink.memory.get_finished_spans()
    sink.memory.clear()
    return [_json_line(spans[i : i + batch]) for i in range(0, len(spans), batch)]


def _json_line(spans: Sequence) -> str:
    """One OTLP JSON line: built straight from the spans (``spans_to_dict``, the capture
    exporter's route, about a quarter of protobuf + MessageToDict's CPU), else via protobuf."""
    doc = spans_to_dict(spans)
    if doc is not None:
        return json_line(doc)
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from diag.ground.otlp_json import request_to_json_line

    return request_to_json_line(encode_spans(spans))


def flush_spans(sink: TraceSink, writer: CaptureWriter | None) -> int:
    """Append the sink's finished spans to ``writer``; returns the number of lines written."""
    lines = drain_span_lines(sink)
    if writer is not None and lines:
        writer.append_span_lines(lines)
    return len(lines)
