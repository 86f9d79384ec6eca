"""The capture exporter's direct OTLP JSON is the document the protobuf route gives, span for span.

``ttft instrument`` exports from a thread that shares the GIL with the engine; the capture
exporter therefore builds OTLP JSON without protobuf. What lands in ``spans.otlp.jsonl`` must
not change: the same dict as ``request_to_dict(encode_spans(...))``, for every kind of span the
sinks emit (request roots joined to a remote caller, stages, token times, errors, engine steps,
cold starts) and for values the fast path leaves to protobuf.
"""

from __future__ import annotations

import json
import math

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from collectors.span_export import CaptureSpanExporter
from collectors.spans import setup_tracing
from diag.ground.otlp_json import spans_to_dict
from diag.ground import stages
from diag.ground.capture import CaptureWriter
from diag.ground.otlp_json import request_to_dict

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _spans():
    sink = setup_tracing(service_name="transformers", memory=True)
    joined = sink.start_request("r-1", model="tiny", traceparent=CALLER,
                                attributes={stages.GEN_AI_REQUEST_TEMPERATURE: 0.7, "ttft.flag": True,
                                            "ttft.names": ["a", "b"], "ttft.empty": []})
    joined.record_stage(stages.TOKENIZE, 1_000, 2_000)
    joined.record_stage(stages.PREFILL, 2_000, 5_000, {"ttft.tokens": 64})
    for t in (6_000, 7_000, 8_000):
        joined.add_token_time(t)
    joined.set_attributes({stages.GEN_AI_USAGE_OUTPUT_TOKENS: 3, "ttft.ratio": 0.25})
    joined.end(end_ns=9_000)
    alone = sink.start_request("r-2", side="client")
    alone.end(end_ns=12_345, error="disconnect")
    sink.record_step(3_000, 4_000, {stages.ATTR_STEP_PREFILL_TOKENS: 64, stages.ATTR_STEP_DECODE_SEQS: 0})
    sink.record_cold_start(10, 20, "load", {stages.GEN_AI_REQUEST_MODEL: "tiny"})
    sink.force_flush()
    spans = list(sink.memory.get_finished_spans())
    sink.shutdown()
    return spans


def test_direct_json_is_the_protobuf_routes_document_for_every_span_we_emit():
    spans = _spans()
    assert len(spans) == 6  # 2 roots, 2 stages, a step, a cold start
    assert any(s.parent is not None and s.parent.is_remote for s in spans)  # the joined root
    assert any(s.status.status_code.value == 2 for s in spans)  # the error root
    for batch in (spans, spans[:1], spans[3:], list(reversed(spans))):
        assert spans_to_dict(batch) == request_to_dict(encode_spans(batch))


def test_values_outside_the_fast_path_take_the_protobuf_route_and_the_capture_line_is_the_same(tmp_path):
    sink = setup_tracing(memory=True)
    sink.record_step(1, 2, {"ttft.nan": math.nan})
    sink.force_flush()
    spans = list(sink.memory.get_finished_spans())
    sink.shutdown()
    assert spans_to_dict(spans) is None
    writer = CaptureWriter(tmp_path / "cap")
    CaptureSpanExporter(writer).export(spans)
    CaptureSpanExporter(writer).export(_spans())
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "cap" / "spans.otlp.jsonl").read_text().splitlines()]
    assert lines[0] == request_to_dict(encode_spans(spans))
    assert len(lines[1]["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 6


class _CountingIds:
    """Deterministic span and trace ids, so two sinks fed the same records give the same spans."""

    def __init__(self) -> None:
        self.n = 0

    def generate_span_id(self) -> int:
        self.n += 1
        return self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return (self.n << 64) | self.n

    def is_trace_id_random(self) -> bool:
        return True


def _feed(sink):
    sink._mat._ids = _CountingIds()
    joined = sink.start_request("r-1", model="tiny", traceparent=CALLER, start_ns=500,
                                attributes={stages.GEN_AI_REQUEST_TEMPERATURE: 0.7, "ttft.names": ["a", "b"]})
    joined.record_stage(stages.TOKENIZE, 1_000, 2_000)
    joined.record_stage(stages.PREFILL, 2_000, 5_000, {"ttft.tokens": 64})
    joined.add_token_time(6_000, 3)
    joined.set_attributes({stages.GEN_AI_USAGE_OUTPUT_TOKENS: 3})
    joined.end(end_ns=9_000)
    sink.record_step(3_000, 4_000, {"ttft.nan": math.nan})  # the protobuf route, in order
    alone = sink.start_request("r-2", start_ns=1, traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
    alone.record_stage(stages.QUEUE, 1, 2)  # not sampled by its caller: nothing of it is written
    alone.end(end_ns=10)
    sink.record_cold_start(10, 20, "load", {stages.GEN_AI_REQUEST_MODEL: "tiny"})
    failed = sink.start_request("r-3", start_ns=12_000)
    failed.end(end_ns=12_345, error="disconnect")
    sink.force_flush()
    sink.shutdown()


def _lines(path):
    return [json.loads(x) for x in (path / "spans.otlp.jsonl").read_text().splitlines()]


def test_a_capture_alone_is_written_by_the_build_thread_as_the_exporter_would_write_it(tmp_path):
    """Capture only: no SDK span objects, no export thread; the file is the one the SDK route
    (materialiser -> batch processor -> CaptureSpanExporter) writes for the same records."""
    direct = setup_tracing(service_name="transformers", capture_dir=tmp_path / "direct", export_interval_s=3600)
    assert direct._processors == [] and direct._mat._writer is direct.writer
    _feed(direct)
    via_sdk = setup_tracing(service_name="transformers", capture_dir=tmp_path / "sdk", memory=True,
                            export_interval_s=3600)
    assert via_sdk._mat._writer is None
    _feed(via_sdk)
    got, want = _lines(tmp_path / "direct"), _lines(tmp_path / "sdk")
    spans = [s for line in got for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert [s["name"] for s in spans] == [stages.TOKENIZE, stages.PREFILL, stages.SPAN_REQUEST,
                                          stages.SPAN_ENGINE_STEP, stages.SPAN_COLD_START, stages.SPAN_REQUEST]
    assert len(got) == 3  # before the NaN step, the step (protobuf), after it
    assert [s for line in want for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]] == spans
    assert got[0]["resourceSpans"][0]["resource"] == want[0]["resourceSpans"][0]["resource"]
    assert got[0]["resourceSpans"][0]["scopeSpans"][0]["scope"] == want[0]["resourceSpans"][0]["scopeSpans"][0]["scope"]


def test_a_capture_write_that_fails_drops_and_counts_its_spans_and_the_next_lines_still_land(tmp_path, monkeypatch):
    sink = setup_tracing(capture_dir=tmp_path / "cap", export_interval_s=3600)
    real = sink.writer.append_span_lines
    calls = []

    def flaky(lines):
        calls.append(len(lines))
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(lines)

    monkeypatch.setattr(sink.writer, "append_span_lines", flaky)
    for i in range(3):
        sink.record_step(i, i + 1, {stages.ATTR_STEP_INDEX: i})
    sink.force_flush()
    assert sink.dropped_spans == 3
    sink.record_step(5, 6, {stages.ATTR_STEP_INDEX: 5})
    sink.shutdown()
    assert [len(line["resourceSpans"][0]["scopeSpans"][0]["spans"]) for line in _lines(tmp_path / "cap")] == [1]
    assert json.loads((tmp_path / "cap" / "meta.json").read_text())["dropped_spans"] == 3
