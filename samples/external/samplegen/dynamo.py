"""NVIDIA Dynamo: the front end's and one worker's texts at each instant, concatenated."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from samplegen.common import MODEL, Events, decode_gaps, strip_created
from samplegen.sim import Req, SimResult

#: Dynamo: the router's pick after tokenization, and front end -> worker transit (seconds)
DYNAMO_ROUTE_S = 0.0007
DYNAMO_TRANSIT_S = 0.0008
DYNAMO_LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
DYNAMO_MS_BUCKETS = [0.1, 0.5, 1, 5, 10, 50, 100, 250, 500, 1000, 2500]
DYNAMO_TOKEN_BUCKETS = [0, 128, 512, 1024, 2048, 4096, 8192, 16384]


def dynamo_texts(sim: SimResult) -> list[str]:
    """The front end's and one worker's scrapes at each instant, concatenated (as one Prometheus server
    holding both targets shows them). Names: lib/runtime/src/metrics/prometheus_names.rs @04070c75.

    A request: the front end receives it (arrival), tokenizes (tokenize_s), routes (DYNAMO_ROUTE_S) and
    sends it to the worker (DYNAMO_TRANSIT_S); the worker's first response is its engine's first token;
    the front end detokenizes and streams it (detokenize_s). No prefix cache in this story.
    """
    cfg = sim.cfg
    reg = CollectorRegistry()
    F, W = "dynamo_frontend_", "dynamo_component_"
    fl = ("model",)
    fv = (MODEL,)
    wl = ("dynamo_namespace", "dynamo_component", "dynamo_endpoint")
    wv = ("dynamo", "backend", "generate")
    ttft = Histogram(F + "time_to_first_token_seconds", "Front end: time to first token (s).", fl,
                     buckets=DYNAMO_LATENCY_BUCKETS, registry=reg)
    itl = Histogram(F + "inter_token_latency_seconds", "Front end: inter-token latency (s).", fl,
                    buckets=DYNAMO_LATENCY_BUCKETS, registry=reg)
    dur = Histogram(F + "request_duration_seconds", "Front end: request duration (s).", fl,
                    buckets=DYNAMO_LATENCY_BUCKETS, registry=reg)
    tok = Histogram(F + "tokenizer_latency_ms", "Front end: tokenizer latency (ms).", ("operation",),
                    buckets=DYNAMO_MS_BUCKETS, registry=reg)
    isl = Histogram(F + "input_sequence_tokens", "Front end: prompt tokens per request.", fl,
                    buckets=DYNAMO_TOKEN_BUCKETS, registry=reg)
    cached = Histogram(F + "cached_tokens", "Front end: prefix-cache-hit tokens per request.", fl,
                       buckets=DYNAMO_TOKEN_BUCKETS, registry=reg)
    out_tok = Counter(F + "output_tokens", "Front end: output tokens streamed.", fl, registry=reg)
    reqs = Counter(F + "requests", "Front end: requests.", fl + ("status",), registry=reg)
    queued = Gauge(F + "queued_requests", "Front end: requests with no first response yet.", fl, registry=reg)
    inflight = Gauge(F + "inflight_requests", "Front end: requests sent to engines, not finished.", fl, registry=reg)
    pending = Gauge(F + "router_queue_pending_requests", "Router queue: requests waiting for a worker.",
                    ("worker_type",), registry=reg)
    hit = Gauge(F + "kv_hit_rate", "Router: predicted KV hit rate at routing time.", fl, registry=reg)
    transit = Histogram(W + "network_transit_seconds", "Worker: front end send -> worker receive (s).", wl,
                        buckets=DYNAMO_LATENCY_BUCKETS, registry=reg)
    first = Histogram(W + "time_to_first_response_seconds", "Worker: receive -> first response (s).", wl,
                      buckets=DYNAMO_LATENCY_BUCKETS, registry=reg)
    w_dur = Histogram(W + "request_duration_seconds", "Worker: request duration (s).", wl,
                      buckets=DYNAMO_LATENCY_BUCKETS, registry=reg)
    w_inflight = Gauge(W + "inflight_requests", "Worker: requests being processed.", wl, registry=reg)
    ev = Events()
    for r in sim.reqs:
        received = r.queued  # the worker receives it; its engine queues it at once
        sent = received - DYNAMO_TRANSIT_S

        def tokenized(r: Req = r, sent: float = sent) -> None:
            tok.labels("tokenize").observe(r.tokenize_s * 1e3)
            isl.labels(*fv).observe(r.prompt)
            cached.labels(*fv).observe(0)
            transit.labels(*wv).observe(DYNAMO_TRANSIT_S)

        def first_token(r: Req = r, received: float = received) -> None:
            ttft.labels(*fv).observe(r.first_token - r.arrival)
            first.labels(*wv).observe(r.first_token - cfg.detokenize_s - received)
            tok.labels("detokenize").observe(cfg.detokenize_s * 1e3)

        def fin(r: Req = r, received: float = received) -> None:
            dur.labels(*fv).observe(r.finish - r.arrival)
            w_dur.labels(*wv).observe(r.finish - received)
            out_tok.labels(*fv).inc(r.output)
            reqs.labels(*fv, "success").inc()

        ev.add(r.arrival + r.tokenize_s, tokenized)
        ev.add(r.first_token, first_token)
        for t, gap in decode_gaps(r):
            ev.add(t, lambda gap=gap: itl.labels(*fv).observe(gap))
        ev.add(r.finish, fin)
    out_tok.labels(*fv)
    reqs.labels(*fv, "success")
    hit.labels(*fv).set(0.0)
    pending.labels("aggregated").set(0)
    texts = []
    for t in sim.scrape_times:
        ev.until(t)
        queued.labels(*fv).set(sum(1 for r in sim.reqs if r.arrival <= t < r.first_token))
        inflight.labels(*fv).set(sum(1 for r in sim.reqs if r.arrival <= t < r.finish))
        w_inflight.labels(*wv).set(sum(1 for r in sim.reqs if r.queued <= t < r.finish))
        texts.append(strip_created(generate_latest(reg)))
    return texts
