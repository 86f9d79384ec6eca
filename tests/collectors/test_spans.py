"""The span helpers emit real OpenTelemetry spans into a capture, OTLP or memory."""

from __future__ import annotations

import json
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.span_export import DroppingBatchProcessor
from collectors.spans import NULL_SINK, setup_tracing
from diag.ground import stages
from diag.ground.capture import SPANS_FILE, load_capture
from diag.ground.otlp_json import dict_to_request


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


def _content(spans):
    """Exported content of spans as OTLP JSON, ids replaced by their roles (root/child/own)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from diag.ground.otlp_json import request_to_dict

    doc = request_to_dict(encode_spans(spans))
    out = []
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                sp = dict(sp)
                sp["traceId"] = len(sp["traceId"])
                sp["spanId"] = len(sp["spanId"])
                sp["parentSpanId"] = sp.get("parentSpanId", "")[:8]  # the caller's id or a local one
                sp["parentSpanId"] = "caller" if sp["parentSpanId"] == "00f067aa" else bool(sp["parentSpanId"])
                out.append((json.dumps(ss["scope"], sort_keys=True), json.dumps(sp, sort_keys=True)))
    return sorted(out)


def test_spans_have_the_same_content_as_the_sdks_own():
    """What the cheap record path exports equals what Tracer.start_span/end would have made."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace as trace_api
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    sink = setup_tracing("svc", memory=True)
    req = sink.start_request("r1", model="m", attributes={"a": 1, "l": [1, 2]}, traceparent=tp, start_ns=1000)
    req.record_stage(stages.QUEUE, 2000, 3000)
    req.record_stage(stages.PREFILL, 3000, 2500, {stages.ATTR_DURATION_S: 0.5})
    req.add_token_time(4000)
    req.add_token_time(5000)
    req.set_attributes({"b": 2, "a": 3})
    req.end(end_ns=6000, error="disconnect")
    sink.record_step(10, 20, {stages.ATTR_STEP_INDEX: 1, stages.ATTR_STEP_KV_USAGE: 0.5})
    sink.record_cold_start(30, 40, "load", {stages.GEN_AI_REQUEST_MODEL: "m"})
    sink.start_request("c1", side="client", start_ns=7).end(end_ns=8)
    sink.force_flush()
    got = list(sink.memory.get_finished_spans())
    assert req.traceparent().startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")

    ref_sink = setup_tracing("svc", memory=True)  # the same resource + scope, spans made by the SDK
    tracer = ref_sink.provider.get_tracer("ttft-diag")
    parent = TraceContextTextMapPropagator().extract({"traceparent": tp})
    root = tracer.start_span(stages.SPAN_REQUEST, context=parent, kind=SpanKind.SERVER, start_time=1000, attributes={
        stages.ATTR_SIDE: "server", stages.ATTR_REQUEST_ID: "r1", stages.GEN_AI_REQUEST_MODEL: "m", "a": 1, "l": [1, 2]})
    ctx = trace_api.set_span_in_context(root)
    tracer.start_span(stages.QUEUE, context=ctx, start_time=2000).end(end_time=3000)
    tracer.start_span(stages.PREFILL, context=ctx, start_time=3000, attributes={stages.ATTR_DURATION_S: 0.5}).end(end_time=3000)
    root.set_attributes({"b": 2, "a": 3})
    root.set_attribute(stages.ATTR_TOKEN_TIMES_NS, [4000, 5000])
    root.set_attribute(stages.ATTR_FIRST_TOKEN_NS, 4000)
    root.set_attribute(stages.ATTR_ERROR, "disconnect")
    root.set_status(Status(StatusCode.ERROR, "disconnect"))
    root.end(end_time=6000)
    empty = otel_context.Context()
    tracer.start_span(stages.SPAN_ENGINE_STEP, context=empty, start_time=10,
                      attributes={stages.ATTR_STEP_INDEX: 1, stages.ATTR_STEP_KV_USAGE: 0.5}).end(end_time=20)
    tracer.start_span(stages.SPAN_COLD_START, context=empty, start_time=30, attributes={
        stages.ATTR_COLD_START_PHASE: "load", stages.GEN_AI_REQUEST_MODEL: "m"}).end(end_time=40)
    tracer.start_span(stages.SPAN_CLIENT_REQUEST, context=empty, kind=SpanKind.CLIENT, start_time=7,
                      attributes={stages.ATTR_SIDE: "client", stages.ATTR_REQUEST_ID: "c1"}).end(end_time=8)
    ref_sink.force_flush()
    ref = list(ref_sink.memory.get_finished_spans())

    assert _content(got) == _content(ref)
    by_name = {s.name: s for s in got}
    assert by_name[stages.QUEUE].parent.span_id == by_name[stages.SPAN_REQUEST].context.span_id
    assert by_name[stages.SPAN_REQUEST].parent.is_remote and by_name[stages.SPAN_REQUEST].parent.span_id == 0x00F067AA0BA902B7
    assert by_name[stages.SPAN_REQUEST].context.trace_flags == root.get_span_context().trace_flags
    assert by_name[stages.SPAN_ENGINE_STEP].context.trace_id != by_name[stages.SPAN_COLD_START].context.trace_id
    sink.shutdown()
    ref_sink.shutdown()


def test_unsampled_caller_gives_ids_but_records_nothing():
    sink = setup_tracing(memory=True)
    req = sink.start_request("s1", traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
    assert req.enabled and req.trace_id_hex == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert req.traceparent().endswith("-00")
    req.record_stage(stages.QUEUE, 1, 2)
    req.end()
    sink.force_flush()
    assert sink.memory.get_finished_spans() == ()
    sink.shutdown()


def test_sdk_spans_are_built_on_the_materialiser_thread_not_the_callers(monkeypatch):
    """The SDK spans are built on the materialiser thread, not in the record calls."""
    import threading

    import collectors.span_build as span_build

    builders: set[str] = set()
    real = span_build.ReadableSpan

    def spy(*a, **k):
        builders.add(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(span_build, "ReadableSpan", spy)
    sink = setup_tracing(memory=True, export_interval_s=0.05)
    for i in range(20):
        _one_request(sink, i)
        sink.record_step(1, 2, {stages.ATTR_STEP_INDEX: i})
    deadline = time.time() + 5
    while time.time() < deadline and len(sink.memory.get_finished_spans()) < 20 * 5:
        time.sleep(0.02)
    assert len(sink.memory.get_finished_spans()) == 20 * 5
    assert builders == {"ttft-span-build"}
    sink.shutdown()


def test_a_callers_traceparent_is_parsed_and_sampled_off_the_request_path(monkeypatch):
    """An instrumented server never asks for the ids: the sampler runs on the materialiser
    thread, and the exported root still joins the caller's trace; a caller that asks for
    them settles them once, on its own thread, and the export keeps the same ids."""
    import threading

    sink = setup_tracing(memory=True, export_interval_s=10)
    sampler = sink._tracer.sampler
    askers: list[str] = []
    real = sampler.should_sample

    def spy(*a, **k):
        askers.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(sampler, "should_sample", spy)
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    served = sink.start_request("s1", traceparent=tp)
    served.record_stage(stages.TOKENIZE, 1, 2)
    served.end()
    assert askers == []  # nothing settled on the caller's thread
    asked = sink.start_request("s2")
    header = asked.traceparent()
    assert askers == [threading.current_thread().name]
    asked.end()
    sink.force_flush()
    spans = {s.attributes.get(stages.ATTR_REQUEST_ID, s.name): s for s in sink.memory.get_finished_spans()}
    assert askers[1:] == [threading.current_thread().name]  # force_flush builds on the caller's thread
    assert format(spans["s1"].context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert spans["s1"].parent.span_id == 0x00F067AA0BA902B7 and spans["s1"].parent.is_remote
    assert spans[stages.TOKENIZE].parent.span_id == spans["s1"].context.span_id
    assert header.startswith(f"00-{spans['s2'].context.trace_id:032x}-{spans['s2'].context.span_id:016x}-")
    sink.shutdown()


def test_full_record_queue_drops_and_counts_without_blocking():
    sink = setup_tracing(memory=True, max_queue=50, export_interval_s=10)
    t0 = time.perf_counter()
    for i in range(500):
        sink.record_step(1, 2, {stages.ATTR_STEP_INDEX: i})
    assert time.perf_counter() - t0 < 0.5
    assert sink.dropped_spans >= 400
    sink.force_flush()
    assert len(sink.memory.get_finished_spans()) + sink.dropped_spans == 500
    sink.shutdown()
    sink.record_step(1, 2, {})  # after shutdown: counted, never raised
    assert len(sink.memory.get_finished_spans()) + sink.dropped_spans == 501


def test_plain_attribute_path_hands_anything_to_clean_to_bounded_attributes():
    """The materialiser's cheap path keeps only what BoundedAttributes would keep unchanged."""
    from opentelemetry.attributes import BoundedAttributes

    from collectors.span_build import plain_attributes

    clean = {"s": "abc", "i": 1, "f": 0.5, "b": True, "l": [1, 2], "t": ("x", "y")}
    got = plain_attributes(dict(clean), 128, None)
    assert got == dict(BoundedAttributes(128, clean, immutable=False))
    assert got["l"] == (1, 2)
    assert plain_attributes({"s": "x" * 11}, 128, 10) is None  # would be truncated
    assert plain_attributes({"m": {"k": 1}}, 128, None) is None  # a mapping value
    assert plain_attributes({"l": [1, None]}, 128, None) is None
    assert plain_attributes({"a": 1, "b": 2}, 1, None) is None  # over the count limit
    assert plain_attributes({"": 1}, 128, None) is None  # an invalid key is dropped by the SDK
