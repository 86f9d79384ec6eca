"""OTLP receiver: the real OTLP exporters as clients, hand-made JSON/gzip bodies, malformed ones."""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import threading
import time

import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from collectors.otlp_receiver import OTLPReceiver, count_spans
from diag.ground import stages

TRACE_HEX = "5b8efff798038103d269b633813fc60c"
SPAN_HEX = "eee19b7ec3c1b174"


def otlp_json_doc(n_spans: int = 2, trace_hex: str = TRACE_HEX) -> dict:
    spans = []
    for i in range(n_spans):
        spans.append({
            "traceId": trace_hex,
            "spanId": f"{i + 1:016x}",
            "parentSpanId": SPAN_HEX,
            "name": "llm_request",
            "kind": 2,
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001600000000",
            "attributes": [
                {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.5}},
                {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "1000"}},
            ],
        })
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
        "scopeSpans": [{"scope": {"name": "vllm.llm_engine"}, "spans": spans}],
    }]}


class Collected:
    """A sink that records messages; optionally blocks until released."""

    def __init__(self, block: bool = False) -> None:
        self.messages: list[ExportTraceServiceRequest] = []
        self.release = threading.Event()
        if not block:
            self.release.set()
        self.entered = threading.Event()

    def __call__(self, msg: ExportTraceServiceRequest) -> None:
        self.entered.set()
        self.release.wait(10)
        self.messages.append(msg)

    def wait_for(self, n: int, timeout_s: float = 5.0) -> None:
        deadline = time.time() + timeout_s
        while len(self.messages) < n and time.time() < deadline:
            time.sleep(0.01)
        assert len(self.messages) >= n, f"got {len(self.messages)} of {n} messages"

    def spans(self) -> list:
        return [s for m in self.messages for rs in m.resource_spans for ss in rs.scope_spans for s in ss.spans]


@pytest.fixture
def receiver():
    sink = Collected()
    r = OTLPReceiver(sink, port=0)
    r.start()
    r.sink_ref = sink
    yield r
    r.stop()


def post(addr, body: bytes, ctype: str = "application/x-protobuf", encoding: str | None = None,
         path: str = "/v1/traces", method: str = "POST", headers: dict | None = None):
    conn = http.client.HTTPConnection(*addr, timeout=5)
    h = {"Content-Type": ctype}
    if encoding:
        h["Content-Encoding"] = encoding
    h.update(headers or {})
    conn.request(method, path, body=body, headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("Content-Type"), data


def status_message(ctype: str, data: bytes) -> str:
    if ctype == "application/json":
        return json.loads(data)["message"]
    return Status.FromString(data).message


def _vllm_tracer(endpoint_exporter) -> tuple[TracerProvider, object]:
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(endpoint_exporter))
    return provider, provider.get_tracer("vllm.llm_engine")


VLLM_ATTRS = {
    "gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct",
    "gen_ai.request.id": "cmpl-1",
    "gen_ai.latency.time_to_first_token": 0.5,
    "gen_ai.latency.time_in_queue": 0.1,
    "gen_ai.latency.time_in_model_prefill": 0.3,
    "gen_ai.latency.time_in_model_decode": 1.0,
    "gen_ai.latency.e2e": 1.6,
    "gen_ai.usage.prompt_tokens": 1000,
    "gen_ai.usage.completion_tokens": 50,
}


def test_real_http_exporter(receiver):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    host, port = receiver.address
    assert host == "127.0.0.1"
    provider, tracer = _vllm_tracer(OTLPSpanExporter(endpoint=f"http://{host}:{port}/v1/traces", timeout=5))
    for i in range(3):
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER, attributes={**VLLM_ATTRS, "gen_ai.request.id": f"r{i}"}):
            pass
    provider.shutdown()
    receiver.sink_ref.wait_for(3)
    spans = receiver.sink_ref.spans()
    assert [s.name for s in spans] == ["llm_request"] * 3
    attrs = {kv.key: kv.value for kv in spans[0].attributes}
    assert attrs["gen_ai.latency.time_in_queue"].double_value == 0.1
    assert attrs["gen_ai.usage.prompt_tokens"].int_value == 1000
    assert receiver.stats()["received_spans"] == 3 and receiver.rejected == 0 and receiver.dropped == 0


def test_real_grpc_exporter():
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    sink = Collected()
    with OTLPReceiver(sink, port=0, grpc_port=0) as r:
        host, gport = r.grpc_address
        provider, tracer = _vllm_tracer(OTLPSpanExporter(endpoint=f"{host}:{gport}", insecure=True, timeout=5))
        with tracer.start_as_current_span("llm_request", attributes=VLLM_ATTRS):
            pass
        provider.shutdown()
        sink.wait_for(1)
    assert sink.spans()[0].name == "llm_request" and r.received_spans == 1


def test_json_body_with_hex_ids(receiver):
    status, ctype, data = post(receiver.address, json.dumps(otlp_json_doc(2)).encode(), "application/json; charset=utf-8")
    assert status == 200 and ctype == "application/json" and json.loads(data) == {}
    receiver.sink_ref.wait_for(1)
    span = receiver.sink_ref.spans()[0]
    assert span.trace_id == bytes.fromhex(TRACE_HEX) and span.parent_span_id == bytes.fromhex(SPAN_HEX)
    assert span.start_time_unix_nano == 1_700_000_000_000_000_000


def test_gzip_bodies(receiver):
    from diag.ground.otlp_json import dict_to_request

    proto = dict_to_request(otlp_json_doc(3)).SerializeToString()
    status, ctype, data = post(receiver.address, gzip.compress(proto), encoding="gzip")
    assert status == 200 and ctype == "application/x-protobuf"
    ExportTraceServiceResponse.FromString(data)
    status, _, _ = post(receiver.address, gzip.compress(json.dumps(otlp_json_doc(1)).encode()), "application/json", "gzip")
    assert status == 200
    receiver.sink_ref.wait_for(2)
    assert receiver.received_spans == 4


@pytest.mark.parametrize(
    ("body", "ctype", "encoding", "status", "needle"),
    [
        (b"\x0a\x05abc", "application/x-protobuf", None, 400, "protobuf"),
        (b"{not json", "application/json", None, 400, "invalid JSON"),
        (json.dumps(otlp_json_doc(1, trace_hex="zz" * 16)).encode(), "application/json", None, 400, "not hex"),
        (json.dumps({"resourceSpans": "nope"}).encode(), "application/json", None, 400, "not OTLP JSON"),
        (b"[1, 2]", "application/json", None, 400, "object"),
        (b"\x1f\x8b\x08\x00garbage", "application/x-protobuf", "gzip", 400, "gzip"),
        (gzip.compress(b"x" * 100, mtime=0)[:-8], "application/x-protobuf", "gzip", 400, "truncated"),
        (b"{}", "text/plain", None, 415, "content type"),
        (b"{}", "application/json", "br", 415, "encoding"),
    ],
)
def test_malformed_requests(receiver, body, ctype, encoding, status, needle):
    got_status, got_ctype, data = post(receiver.address, body, ctype, encoding)
    assert got_status == status
    msg = status_message(got_ctype, data) if got_ctype in ("application/json", "application/x-protobuf") else ""
    assert needle in msg and "\n" not in msg
    assert receiver.rejected == 1 and receiver.received_spans == 0


def test_size_limits():
    sink = Collected()
    with OTLPReceiver(sink, port=0, max_body_bytes=4096) as r:
        status, ctype, data = post(r.address, b"\x00" * 5000)
        assert status == 413 and "limit" in status_message(ctype, data)
        bomb = gzip.compress(b"\x00" * 1_000_000)  # small on the wire, 1 MB inside
        assert len(bomb) < 4096
        status, ctype, data = post(r.address, bomb, encoding="gzip")
        assert status == 413 and "decompressed" in status_message(ctype, data)
        assert r.rejected == 2


def test_wrong_path_and_method(receiver):
    assert post(receiver.address, b"", path="/v1/metrics")[0] == 404
    assert post(receiver.address, b"", method="GET")[0] == 405
    assert post(receiver.address, b"")[0] == 200  # an empty protobuf is a valid, empty export


def test_queue_full_answers_503_and_counts():
    from diag.ground.otlp_json import dict_to_request

    sink = Collected(block=True)
    body = dict_to_request(otlp_json_doc(5)).SerializeToString()
    with OTLPReceiver(sink, port=0, max_queue_requests=1) as r:
        assert post(r.address, body)[0] == 200  # taken by the worker, which blocks in the sink
        assert sink.entered.wait(5)
        assert post(r.address, body)[0] == 200  # fills the queue
        status, ctype, data = post(r.address, body)
        assert status == 503 and "queue full" in status_message(ctype, data)
        assert r.dropped == 5 and r.received_spans == 10 and r.rejected == 0
        sink.release.set()
    assert len(sink.messages) == 2  # stop() drained the queue


def test_failing_sink_does_not_stop_the_receiver():
    calls = []

    def sink(msg):
        calls.append(msg)
        if len(calls) == 1:
            raise OSError("disk full")

    from diag.ground.otlp_json import dict_to_request

    body = dict_to_request(otlp_json_doc(1)).SerializeToString()
    with OTLPReceiver(sink, port=0) as r:
        assert post(r.address, body)[0] == 200
        assert post(r.address, body)[0] == 200
        deadline = time.time() + 5
        while len(calls) < 2 and time.time() < deadline:
            time.sleep(0.01)
    assert len(calls) == 2 and r.sink_errors == 1 and "disk full" in r.last_error


def test_count_spans():
    from diag.ground.otlp_json import dict_to_request

    assert count_spans(dict_to_request(otlp_json_doc(7))) == 7
    assert count_spans(ExportTraceServiceRequest()) == 0


def test_receive_command_end_to_end(tmp_path):
    """vLLM-shaped spans from the real exporter -> ``ttft receive`` -> capture -> adapters."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from diag.ground.external_spans import adapt_spans_frame
    from diag.ground.capture import load_capture
    from diag.cli.commands import receive

    parser = argparse.ArgumentParser()
    receive.add_parser(parser.add_subparsers())
    out = tmp_path / "cap"
    args = parser.parse_args(["receive", "--port", "0", "--grpc-port", "0", "-o", str(out)])
    stop = threading.Event()
    ports: dict = {}
    orig_start = OTLPReceiver.start

    def spy_start(self):
        addr = orig_start(self)
        ports["http"] = addr
        return addr

    OTLPReceiver.start = spy_start
    try:
        t = threading.Thread(target=lambda: ports.setdefault("rc", receive.run(args, stop_event=stop)))
        t.start()
        deadline = time.time() + 5
        while "http" not in ports and time.time() < deadline:
            time.sleep(0.01)
    finally:
        OTLPReceiver.start = orig_start
    host, port = ports["http"]
    provider, tracer = _vllm_tracer(OTLPSpanExporter(endpoint=f"http://{host}:{port}/v1/traces", timeout=5))
    for i in range(4):
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER,
                                          attributes={**VLLM_ATTRS, "gen_ai.latency.time_in_queue": 0.1 * (i + 1)}):
            pass
    provider.shutdown()
    stop.set()
    t.join(10)
    assert ports["rc"] == 0
    cap = load_capture(out)
    assert cap.meta["otlp_receiver"]["received_spans"] == 4
    assert len(cap.spans) == 4 and set(cap.spans["name"].astype(str)) == {"llm_request"}
    req = adapt_spans_frame(cap.spans)
    assert len(req) == 4 and set(req["engine"]) == {"vllm"}
    assert sorted(req["queue_s"].round(6)) == [0.1, 0.2, 0.3, 0.4]
    assert req["lumped_s"].min() == 0.0  # 0.5 - 0.4 - 0.3 < 0 -> clipped
    assert req.loc[req["queue_s"].round(6) == 0.1, "lumped_s"].iloc[0] == pytest.approx(0.1)
    assert (req["prefill_s"] == 0.3).all() and (req["server_ttft_s"] == 0.5).all()
    assert stages.LUMPED == "lumped"


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_receive_stops_cleanly_on_sigterm_and_on_an_inherited_ignored_sigint(tmp_path, sig):
    # under a process manager (SIGTERM), or started as a shell's background job (SIGINT ignored on
    # entry, so Python raises no KeyboardInterrupt): either signal ends it as Ctrl-C does, the capture closed
    import signal

    from diag.ground.capture import load_capture

    from support.engine_testutil import background_job

    out = tmp_path / "cap"
    with background_job(["receive", "--port", "0", "--no-grpc", "-o", str(out)]) as (proc, line):
        addr = line.split("http://", 1)[1].split("/v1/traces", 1)[0]
        host, port = addr.rsplit(":", 1)
        assert post((host, int(port)), json.dumps(otlp_json_doc(3)).encode(), "application/json")[0] == 200
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(20) == 0
    assert "3 spans in 1 requests" in proc.stderr.read()
    cap = load_capture(out)
    assert cap.meta["otlp_receiver"]["received_spans"] == 3 and len(cap.spans) == 3
