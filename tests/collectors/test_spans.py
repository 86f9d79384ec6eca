"""The span helpers emit real OpenTelemetry spans into a capture, OTLP or memory."""

from __future__ import annotations

import json
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.spans import NULL_SINK, DroppingBatchProcessor, setup_tracing
from diag import stages
from diag.capture import SPANS_FILE, load_capture
from diag.otlp_json import dict_to_request


def _one_request(sink, i=0, tokens=3):
    req = sink.start_request(f"req-{i}", model="tiny", attributes={stages.GEN_AI_USAGE_INPUT_TOKENS: 7})
    with req.stage(stages.TOKENIZE):
        time.sleep(0.001)
    t0 = time.time_ns()
    req.record_stage(stages.QUEUE, t0, t0 + 2_000_000)
    req.record_stage(stages.PREFILL, t0 + 2_000_000, t0 + 5_000_000)
    for k in range(tokens):
        req.add_token_time(t0 + 6_000_000 + k * 1_000_000)
    req.set_attributes({stages.GEN_AI_USAGE_OUTPUT_TOKENS: tokens})
    req.end()
    return req


def test_memory_sink_gets_request_and_stage_spans_in_one_trace():
    sink = setup_tracing(memory=True)
    req = _one_request(sink)
    sink.force_flush()
    spans = sink.memory.get_finished_spans()
    names = sorted(s.name for s in spans)
    assert names == sorted([stages.SPAN_REQUEST, "tokenize", "queue", "prefill"])
    assert {format(s.context.trace_id, "032x") for s in spans} == {req.trace_id_hex}
    root = next(s for s in spans if s.name == stages.SPAN_REQUEST)
    assert list(root.attributes[stages.ATTR_TOKEN_TIMES_NS])[0] == root.attributes[stages.ATTR_FIRST_TOKEN_NS]
    assert not any(s.name == "token" for s in spans)  # no per-token spans
    sink.shutdown()


def test_capture_round_trip_is_lossless_and_real_otlp(capture_dir):
    sink = setup_tracing("engine-x", capture_dir=capture_dir, meta={"what_ran": "unit test"})
    reqs = [_one_request(sink, i) for i in range(5)]
    sink.record_step(time.time_ns(), time.time_ns() + 1000, {stages.ATTR_STEP_PREFILL_TOKENS: 12})
    sink.record_cold_start(time.time_ns(), time.time_ns() + 5000, phase="load")
    sink.shutdown()

    lines = (capture_dir / SPANS_FILE).read_text().splitlines()
    assert lines
    for line in lines:
        doc = json.loads(line)
        msg = dict_to_request(doc)  # real OTLP: parses as opentelemetry.proto
        assert isinstance(msg, ExportTraceServiceRequest)
        span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        assert len(span["traceId"]) == 32 and int(span["traceId"], 16) >= 0  # hex, not base64
        assert isinstance(span["startTimeUnixNano"], str)  # 64-bit ints as strings
    cap = load_capture(capture_dir)
    assert cap.warnings == []
    assert len(cap.spans) == 5 * 4 + 2
    assert set(cap.spans["trace_id"].astype(str)) >= {r.trace_id_hex for r in reqs}
    assert cap.meta["what_ran"] == "unit test"
    assert cap.meta["ttft_boundary"]["server"]["side"] == "server"
    assert cap.meta["dropped_spans"] == 0
    assert set(cap.spans["service"].astype(str)) == {"engine-x"}


def test_traceparent_joins_callee_to_callers_trace():
    sink = setup_tracing(memory=True)
    client = sink.start_request("c1", side="client")
    header = client.traceparent()
    assert header and header.startswith("00-" + client.trace_id_hex)
    server = sink.start_request("s1", traceparent=header)
    assert server.trace_id_hex == client.trace_id_hex
    server.end()
    client.end()
    sink.force_flush()
    spans = {s.name: s for s in sink.memory.get_finished_spans()}
    assert spans[stages.SPAN_REQUEST].parent.span_id == spans[stages.SPAN_CLIENT_REQUEST].context.span_id
    sink.shutdown()


def test_tracing_off_costs_nothing_and_never_fails():
    req = NULL_SINK.start_request("x")
    with req.stage("tokenize"):
        pass
    req.record_stage("queue", 1, 2)
    req.add_token_time(3)
    req.end()
    assert not req.enabled and req.traceparent() is None
    NULL_SINK.record_step(1, 2, {})
    NULL_SINK.shutdown()


class _SlowExporter:
    def __init__(self):
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        time.sleep(0.2)
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


class _FailingExporter(_SlowExporter):
    def export(self, spans):
        raise RuntimeError("collector down")


def test_full_queue_drops_and_counts_without_blocking():
    from opentelemetry.sdk.trace import TracerProvider

    proc = DroppingBatchProcessor(_SlowExporter(), max_queue=10, max_batch=5, interval_s=0.05)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("t")
    t0 = time.perf_counter()
    for _ in range(500):
        tracer.start_span("x").end()
    assert time.perf_counter() - t0 < 0.5  # the caller never waited for the slow exporter
    assert proc.dropped_spans > 0
    provider.shutdown()


def test_failing_exporter_is_counted_not_raised():
    from opentelemetry.sdk.trace import TracerProvider

    proc = DroppingBatchProcessor(_FailingExporter(), max_queue=100, interval_s=0.01)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    provider.get_tracer("t").start_span("x").end()
    proc.force_flush()
    assert proc.dropped_spans == 1
    provider.shutdown()
