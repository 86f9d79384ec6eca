"""Spans per second the OTLP receiver accepts on one core.

The receiver runs in a child process pinned to one CPU with a sink that only counts; the
client (this process, pinned to another CPU when there is one) posts protobuf bodies of 512
vLLM-shaped spans over keep-alive connections. The baseline, in the same run, is
``ExportTraceServiceRequest.FromString`` (+ counting the spans) on the same bodies in one
thread: the parse cost no receiver can avoid. Prints one line per figure and the ratio.

    python benchmarks/otlp_receiver_throughput.py [--seconds 5] [--bodies 64] [--clients 2] [--gzip]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import random
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span  # noqa: E402

SPANS_PER_BODY = 512


def make_body(rng: random.Random, n: int = SPANS_PER_BODY) -> bytes:
    """One ExportTraceServiceRequest of n vLLM ``llm_request`` spans, serialized."""
    spans = []
    t0 = 1_700_000_000_000_000_000
    for i in range(n):
        ttft = rng.uniform(0.05, 2.0)
        attrs = [
            KeyValue(key="gen_ai.request.id", value=AnyValue(string_value=f"cmpl-{rng.getrandbits(64):016x}")),
            KeyValue(key="gen_ai.response.model", value=AnyValue(string_value="meta-llama/Llama-3.1-8B-Instruct")),
            KeyValue(key="gen_ai.request.max_tokens", value=AnyValue(int_value=256)),
            KeyValue(key="gen_ai.request.temperature", value=AnyValue(double_value=0.7)),
            KeyValue(key="gen_ai.usage.prompt_tokens", value=AnyValue(int_value=rng.randint(10, 4000))),
            KeyValue(key="gen_ai.usage.completion_tokens", value=AnyValue(int_value=rng.randint(1, 256))),
            KeyValue(key="gen_ai.latency.time_to_first_token", value=AnyValue(double_value=ttft)),
            KeyValue(key="gen_ai.latency.time_in_queue", value=AnyValue(double_value=ttft * 0.3)),
            KeyValue(key="gen_ai.latency.time_in_model_prefill", value=AnyValue(double_value=ttft * 0.6)),
            KeyValue(key="gen_ai.latency.time_in_model_decode", value=AnyValue(double_value=rng.uniform(0.5, 9))),
            KeyValue(key="gen_ai.latency.time_in_model_inference", value=AnyValue(double_value=rng.uniform(0.5, 9))),
            KeyValue(key="gen_ai.latency.e2e", value=AnyValue(double_value=rng.uniform(1, 10))),
        ]
        spans.append(Span(
            trace_id=rng.getrandbits(128).to_bytes(16, "big"),
            span_id=rng.getrandbits(64).to_bytes(8, "big"),
            parent_span_id=rng.getrandbits(64).to_bytes(8, "big"),
            name="llm_request", kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=t0 + i * 1_000_000, end_time_unix_nano=t0 + i * 1_000_000 + 3_000_000_000,
            attributes=attrs,
        ))
    res = ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])
    res.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="vllm")))
    return ExportTraceServiceRequest(resource_spans=[res]).SerializeToString()


def pin(cpu: int) -> None:
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})
    except (AttributeError, OSError):
        pass


def serve() -> None:
    """Child: a receiver with a counting sink; prints its port, stops when stdin closes."""
    from collectors.otlp_receiver import OTLPReceiver, count_spans

    pin(0)
    sunk = [0]
    r = OTLPReceiver(lambda m: sunk.__setitem__(0, sunk[0] + count_spans(m)), port=0, max_queue_requests=64)
    _, port = r.start()
    print(port, flush=True)
    sys.stdin.read()
    r.stop()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{r.received_spans} {r.dropped} {sunk[0]} {ru.ru_utime + ru.ru_stime:.6f}", flush=True)


def baseline(bodies: list[bytes], seconds: float) -> float:
    """Spans/s of FromString + count on one thread."""
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for b in bodies:
            m = ExportTraceServiceRequest.FromString(b)
            n += sum(len(ss.spans) for rs in m.resource_spans for ss in rs.scope_spans)
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--bodies", type=int, default=64, help="distinct bodies to cycle through")
    ap.add_argument("--clients", type=int, default=2, help="concurrent keep-alive client connections")
    ap.add_argument("--gzip", action="store_true", help="gzip the bodies (Content-Encoding: gzip)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return 0
    rng = random.Random(7)
    bodies = [make_body(rng) for _ in range(args.bodies)]
    wire = [gzip.compress(b, 1) for b in bodies] if args.gzip else bodies
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    assert child.stdout is not None and child.stdin is not None
    port = int(child.stdout.readline())
    pin(1)
    sent = [0] * args.clients
    statuses: dict[int, int] = {}
    stop_at = [0.0]

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Content-Type": "application/x-protobuf"}
        if args.gzip:
            headers["Content-Encoding"] = "gzip"
        i = k
        while time.perf_counter() < stop_at[0]:
            conn.request("POST", "/v1/traces", body=wire[i % len(wire)], headers=headers)
            resp = conn.getresponse()
            resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            if resp.status == 200:
                sent[k] += SPANS_PER_BODY
            i += args.clients
        conn.close()

    # warm-up, then the measured run
    stop_at[0] = time.perf_counter() + 0.5
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    sent = [0] * args.clients
    statuses.clear()
    t0 = time.perf_counter()
    stop_at[0] = t0 + args.seconds
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    elapsed = time.perf_counter() - t0
    out, _ = child.communicate("", timeout=60)
    received, dropped, sunk, cpu_s = out.split()
    rate = sum(sent) / elapsed
    pin(0)
    base = baseline(bodies, min(args.seconds, 3.0))
    print(f"receiver: {rate:,.0f} spans/s accepted on one core ({SPANS_PER_BODY}-span protobuf bodies"
          f"{', gzip' if args.gzip else ''}, {args.clients} keep-alive clients, {elapsed:.1f} s; "
          f"statuses {dict(sorted(statuses.items()))}; child: {int(received):,} accepted, {int(dropped):,} dropped, "
          f"{int(sunk):,} reached the sink, {float(cpu_s):.2f} CPU-s)")
    print(f"baseline: {base:,.0f} spans/s for ExportTraceServiceRequest.FromString + count on the same bodies")
    print(f"ratio receiver/baseline: {rate / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
