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

from collectors.spans import CaptureSpanExporter, otlp_json_request, setup_tracing
from diag import stages
from diag.capture import CaptureWriter
from diag.otlp_json import request_to_dict

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
        assert otlp_json_request(batch) == request_to_dict(encode_spans(batch))


def test_values_outside_the_fast_path_take_the_protobuf_route_and_the_capture_line_is_the_same(tmp_path):
    sink = setup_tracing(memory=True)
    sink.record_step(1, 2, {"ttft.nan": math.nan})
    sink.force_flush()
    spans = list(sink.memory.get_finished_spans())
    sink.shutdown()
    assert otlp_json_request(spans) is None
    writer = CaptureWriter(tmp_path / "cap")
    CaptureSpanExporter(writer).export(spans)
    CaptureSpanExporter(writer).export(_spans())
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "cap" / "spans.otlp.jsonl").read_text().splitlines()]
    assert lines[0] == request_to_dict(encode_spans(spans))
    assert len(lines[1]["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 6
