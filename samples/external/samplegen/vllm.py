"""vLLM V1: PrometheusStatLogger texts and ``llm_request`` spans, with vLLM's TTFT boundary."""

from __future__ import annotations

import random
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from samplegen.common import (MODEL, Events, attr_kv, decode_gaps, export_batches, hex_bits, otlp_request,
                             state_at, strip_created, unix_ns)
from samplegen.sim import SEED, Req, SimConfig, SimResult, Step

VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                     10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0]
VLLM_REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


#: output batch engine core -> API server, before it is detokenized (the end of vLLM's TTFT)
VLLM_OUTPUT_IPC_S = 0.0002
VLLM_ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
VLLM_TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]


def _vllm_arrival(r: Req) -> float:
    """vLLM's ``arrival_time``: set in InputProcessor.process_inputs, after the API server's chat
    template and tokenization (vllm/v1/engine/input_processor.py @a1799180)."""
    return r.arrival + r.tokenize_s


def _vllm_engine_first(r: Req, cfg: SimConfig) -> float:
    """The engine step that made the first token ended here (engine core's first_token_ts)."""
    return r.first_token - cfg.detokenize_s


def _vllm_ttft_end(r: Req, cfg: SimConfig) -> float:
    """``IterationStats.iteration_timestamp``: the output batch at the API server, before the first
    detokenize (vllm/v1/metrics/stats.py @28ed1fb8, output_processor.py @d0782260)."""
    return _vllm_engine_first(r, cfg) + VLLM_OUTPUT_IPC_S


def vllm_texts(sim: SimResult) -> list[str]:
    """vLLM V1 PrometheusStatLogger names (vllm/v1/metrics/loggers.py), labels model_name + engine.

    TTFT is observed at the first token (from arrival_time, after tokenization, to the output
    batch at the API server); queue/prefill/decode/e2e at finish; prompt_tokens adds the whole
    prompt at the first token (stats.py @28ed1fb8); prompt_tokens_by_source splits it.
    """
    cfg = sim.cfg
    reg = CollectorRegistry()
    lab = ("model_name", "engine")
    lv = (MODEL, "0")
    running = Gauge("vllm:num_requests_running", "Requests in the running batch.", lab, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", lab, registry=reg)
    by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Waiting requests by why they wait.", lab + ("reason",),
                      registry=reg)
    kv = Gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", lab, registry=reg)
    pre = Counter("vllm:num_preemptions", "Preemptions so far.", lab, registry=reg)
    prompt = Counter("vllm:prompt_tokens", "Prompt tokens of requests that got a first token.", lab, registry=reg)
    by_source = Counter("vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from.",
                        lab + ("source",), registry=reg)
    cached = Counter("vllm:prompt_tokens_cached", "Prompt tokens served from the prefix cache.", lab, registry=reg)
    pc_q = Counter("vllm:prefix_cache_queries", "Prefix-cache lookups, in tokens.", lab, registry=reg)
    pc_h = Counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.", lab, registry=reg)
    gen = Counter("vllm:generation_tokens", "Tokens generated.", lab, registry=reg)
    succ = Counter("vllm:request_success", "Requests finished.", lab + ("finished_reason",), registry=reg)
    ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token (s).", lab,
                     buckets=VLLM_TTFT_BUCKETS, registry=reg)
    itl = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens (s).", lab,
                    buckets=VLLM_ITL_BUCKETS, registry=reg)
    it_tok = Histogram("vllm:iteration_tokens_total", "Tokens per engine step.", lab, buckets=VLLM_ITERATION_BUCKETS,
                       registry=reg)
    kv_comp = Histogram("vllm:request_prefill_kv_computed_tokens", "Prompt tokens computed per request.", lab,
                        buckets=VLLM_TOKEN_BUCKETS, registry=reg)
    hs = {
        k: Histogram(f"vllm:{k}", d, lab, buckets=VLLM_REQUEST_BUCKETS, registry=reg)
        for k, d in (("e2e_request_latency_seconds", "End-to-end request latency (s)."),
                     ("request_queue_time_seconds", "Time in the WAITING phase (s)."),
                     ("request_prefill_time_seconds", "Time in the PREFILL phase (s)."),
                     ("request_decode_time_seconds", "Time in the DECODE phase (s)."))
    }
    ev = Events()
    for r in sim.reqs:
        def first(r: Req = r) -> None:
            ttft.labels(*lv).observe(_vllm_ttft_end(r, cfg) - _vllm_arrival(r))
            prompt.labels(*lv).inc(r.prompt)
            by_source.labels(*lv, "local_compute").inc(r.prompt)

        ev.add(_vllm_ttft_end(r, cfg), first)
        ev.add(r.scheduled, lambda r=r: pc_q.labels(*lv).inc(r.prompt))
        for t, gap in decode_gaps(r):
            ev.add(t, lambda gap=gap: itl.labels(*lv).observe(gap))

        def fin(r: Req = r) -> None:
            eng_first = _vllm_engine_first(r, cfg)
            hs["e2e_request_latency_seconds"].labels(*lv).observe(r.finish - _vllm_arrival(r))
            hs["request_queue_time_seconds"].labels(*lv).observe(r.scheduled - r.queued)
            hs["request_prefill_time_seconds"].labels(*lv).observe(eng_first - r.scheduled)
            hs["request_decode_time_seconds"].labels(*lv).observe(r.finish - eng_first)
            kv_comp.labels(*lv).observe(r.prompt)
            succ.labels(*lv, "length").inc()

        ev.add(r.finish, fin)
    for s in sim.steps:
        def step(s: Step = s) -> None:
            gen.labels(*lv).inc(s.decode_seqs + s.first_tokens)
            it_tok.labels(*lv).observe(s.prefill_tokens + s.decode_seqs)
            if s.preempted:
                pre.labels(*lv).inc(s.preempted)

        ev.add(s.end, step)
    # children exist from the start, as vLLM creates them at start-up
    for c in (pre, prompt, gen, cached, pc_q, pc_h):
        c.labels(*lv)
    for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        by_source.labels(*lv, src)
    texts = []
    for t in sim.scrape_times:
        ev.until(t)
        st = state_at(sim, t)
        running.labels(*lv).set(st.running)
        waiting.labels(*lv).set(st.waiting)
        by_reason.labels(*lv, "capacity").set(st.waiting)
        by_reason.labels(*lv, "deferred").set(0)
        kv.labels(*lv).set(round(st.kv_used_tokens / cfg.kv_capacity_tokens, 4))
        texts.append(strip_created(generate_latest(reg)))
    return texts


def vllm_spans(sim: SimResult) -> list[dict[str, Any]]:
    """One ``llm_request`` span per finished request (vllm/v1/engine/output_processor.py do_tracing
    @d0782260): it starts at arrival_time (after tokenization); its TTFT ends before detokenize."""
    cfg = sim.cfg
    rng = random.Random(SEED + 1)
    items = []
    for r in sim.reqs:
        start, eng_first = _vllm_arrival(r), _vllm_engine_first(r, cfg)
        attrs = [
            attr_kv("gen_ai.request.id", f"cmpl-{hex_bits(rng, 128)}-0"),
            attr_kv("gen_ai.request.max_tokens", r.output),
            attr_kv("gen_ai.request.temperature", 0.7),
            attr_kv("gen_ai.request.top_p", 0.95),
            attr_kv("gen_ai.usage.prompt_tokens", r.prompt),
            attr_kv("gen_ai.usage.completion_tokens", r.output),
            attr_kv("gen_ai.usage.cached_tokens", 0),
            attr_kv("gen_ai.latency.time_in_queue", round(r.scheduled - r.queued, 6)),
            attr_kv("gen_ai.latency.time_to_first_token", round(_vllm_ttft_end(r, cfg) - start, 6)),
            attr_kv("gen_ai.latency.e2e", round(r.finish - start, 6)),
            attr_kv("gen_ai.latency.time_in_model_prefill", round(eng_first - r.scheduled, 6)),
            attr_kv("gen_ai.latency.time_in_model_decode", round(r.finish - eng_first, 6)),
            attr_kv("gen_ai.latency.time_in_model_inference", round(r.finish - r.scheduled, 6)),
        ]
        items.append((r.finish, {
            "traceId": hex_bits(rng, 128), "spanId": hex_bits(rng, 64), "parentSpanId": "", "name": "llm_request",
            "kind": 2, "startTimeUnixNano": str(unix_ns(start)), "endTimeUnixNano": str(unix_ns(r.finish)),
            "attributes": attrs, "status": {},
        }))
    return [otlp_request("vllm", "vllm.llm_engine", b) for b in export_batches(items, 5.0)]
