"""SGLang: scheduler + tokenizer-manager texts (frozen gauges when idle) and the request span tree."""

from __future__ import annotations

import random
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from samplegen.common import (MODEL, Events, attr_kv, decode_gaps, export_batches, hex_bits, otlp_request,
                             state_at, strip_created, unix_ns)
from samplegen.sim import SEED, Req, SimResult, Step

SGLANG_TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGLANG_ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
                      0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]
SGLANG_E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
                      1800, 2400]
SGLANG_QUEUE_BUCKETS = [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200,
                        300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000]
#: exponential from 1 ms, x1.62, 30 buckets (up to ~1191 s)
SGLANG_STAGE_BUCKETS = [0.001 * (1.62 ** i) for i in range(30)]
#: SGLang request stages (RequestStage, python/sglang/srt/observability/req_time_stats.py @602413bc) traced here
SGLANG_STAGES = ("tokenize", "request_process", "prefill_waiting", "prefill_forward", "decode_loop")
#: the stages whose latency per_stage_req_latency_seconds observes (metrics_is_observed=True);
#: prefill_waiting is traced but not observed
SGLANG_OBSERVED_STAGES = ("request_process", "prefill_forward")


def _sglang_slices(r: Req) -> list[tuple[str, str, float, float]]:
    """(thread, stage, start, end) of one request's slices (seconds from the run's start)."""
    disp_end = r.queued + 0.0015
    proc_end = disp_end + 0.0006
    sched = max(r.scheduled, proc_end)
    return [
        ("Tokenizer", "tokenize", r.arrival, r.arrival + r.tokenize_s),
        ("Scheduler", "request_process", disp_end, proc_end),
        ("Scheduler", "prefill_waiting", proc_end, sched),
        ("Scheduler", "prefill_forward", sched, r.first_token - 0.0005),
        ("Scheduler", "decode_loop", r.first_token - 0.0005, r.finish),
    ]


def sglang_texts(sim: SimResult) -> list[str]:
    """SGLang scheduler + tokenizer metrics (python/sglang/srt/observability/metrics_collector.py @44cedc2b).

    The scheduler sets its gauges only when it logs stats (scheduler_metrics_mixin.py @44cedc2b):
    a scrape with no engine step since the previous one shows the previous values (frozen).
    """
    reg = CollectorRegistry()
    sched = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
    sv = (MODEL, "unified", "0", "0", "0")
    tok = ("model_name",)
    tv = (MODEL,)
    running = Gauge("sglang:num_running_reqs", "Running requests.", sched, registry=reg)
    queue = Gauge("sglang:num_queue_reqs", "Requests in the waiting queue.", sched, registry=reg)
    usage = Gauge("sglang:token_usage", "Fraction of the KV token pool in use.", sched, registry=reg)
    used = Gauge("sglang:num_used_tokens", "KV tokens in use.", sched, registry=reg)
    maxtok = Gauge("sglang:max_total_num_tokens", "KV token pool size.", sched, registry=reg)
    thr = Gauge("sglang:gen_throughput", "Generation throughput (tokens/s) over the log interval.", sched,
                registry=reg)
    hit = Gauge("sglang:cache_hit_rate", "Prefix-cache hit rate.", sched, registry=reg)
    retracted = Counter("sglang:num_retracted_requests", "Requests retracted (preempted).", sched, registry=reg)
    qtime = Histogram("sglang:queue_time_seconds", "Queueing time (s).", sched, buckets=SGLANG_QUEUE_BUCKETS,
                      registry=reg)
    stage = Histogram("sglang:per_stage_req_latency_seconds", "Latency of each request stage (s).",
                      sched + ("stage",), buckets=SGLANG_STAGE_BUCKETS, registry=reg)
    prompt = Counter("sglang:prompt_tokens", "Prompt tokens processed.", tok, registry=reg)
    gen = Counter("sglang:generation_tokens", "Generation tokens processed.", tok, registry=reg)
    nreq = Counter("sglang:num_requests", "Requests processed.", tok, registry=reg)
    ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token (s).", tok,
                     buckets=SGLANG_TTFT_BUCKETS, registry=reg)
    itl = Histogram("sglang:inter_token_latency_seconds", "Inter-token latency (s).", tok,
                    buckets=SGLANG_ITL_BUCKETS, registry=reg)
    e2e = Histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency (s).", tok,
                    buckets=SGLANG_E2E_BUCKETS, registry=reg)
    ev = Events()
    for r in sim.reqs:
        ev.add(r.first_token, lambda r=r: ttft.labels(*tv).observe(r.first_token - r.arrival))
        for t, gap in decode_gaps(r):
            ev.add(t, lambda gap=gap: itl.labels(*tv).observe(gap))
        for _, name, a, b in _sglang_slices(r):
            if name in SGLANG_OBSERVED_STAGES:
                ev.add(b, lambda name=name, a=a, b=b: stage.labels(*sv, name).observe(b - a))
        ev.add(r.scheduled, lambda r=r: qtime.labels(*sv).observe(r.scheduled - r.queued))

        def fin(r: Req = r) -> None:
            e2e.labels(*tv).observe(r.finish - r.arrival)
            prompt.labels(*tv).inc(r.prompt)
            gen.labels(*tv).inc(r.output)
            nreq.labels(*tv).inc()

        ev.add(r.finish, fin)
    retracted.labels(*sv)
    realtime = Counter("sglang:realtime_tokens", "Tokens processed, by mode, updated each log interval.",
                       sched + ("mode",), registry=reg)
    for mode in ("prefill_compute", "prefill_cache", "decode"):
        realtime.labels(*sv, mode)
    for s in sim.steps:
        if s.preempted:
            ev.add(s.end, lambda s=s: retracted.labels(*sv).inc(s.preempted))

        def step_tokens(s: Step = s) -> None:  # no prefix cache hits in this story
            if s.prefill_tokens:
                realtime.labels(*sv, "prefill_compute").inc(s.prefill_tokens)
            if s.decode_seqs:
                realtime.labels(*sv, "decode").inc(s.decode_seqs)

        ev.add(s.end, step_tokens)
    cap = sim.cfg.kv_capacity_tokens
    maxtok.labels(*sv).set(cap)
    hit.labels(*sv).set(0.0)
    for g_ in (running, queue, usage, used, thr):  # the scheduler creates them at start-up, at 0
        g_.labels(*sv).set(0)
    texts = []
    prev_t, prev_gen = 0.0, 0
    for t in sim.scrape_times:
        ev.until(t)
        st = state_at(sim, t)
        logged = any(prev_t < s.end <= t for s in sim.steps)
        if logged:  # no step since the last scrape: no log_*_stats call, the gauges keep their values
            running.labels(*sv).set(st.running)
            queue.labels(*sv).set(st.waiting)
            usage.labels(*sv).set(round(st.kv_used_tokens / cap, 4))
            used.labels(*sv).set(st.kv_used_tokens)
            g = sum(s.decode_seqs + s.first_tokens for s in sim.steps if s.end <= t)
            thr.labels(*sv).set(round((g - prev_gen) / (t - prev_t), 2) if t > prev_t else 0.0)
            prev_gen = g
        prev_t = t
        texts.append(strip_created(generate_latest(reg)))
    return texts


def sglang_spans(sim: SimResult) -> list[dict[str, Any]]:
    """SGLang's request span tree (python/sglang/srt/observability/trace.py @b8e5a7c3): Req root -> thread ->
    slices. The root carries gen_ai.latency.* on the tokenizer manager's clock; the "Bootstrap Room" span
    that older builds put above it is gone (now a root attribute, PD mode only), so it is not emitted."""
    rng = random.Random(SEED + 2)
    host = hex_bits(rng, 128)
    pids = {"Tokenizer": 41877, "Scheduler": 42011}
    items = []
    for r in sim.reqs:
        trace = f"{rng.getrandbits(64):032x}"  # SGLang's id generator draws 64-bit trace ids
        root = hex_bits(rng, 64)
        rid = hex_bits(rng, 128)
        disp_end = r.queued + 0.0015
        root_attrs = [
            attr_kv("rid", rid),
            attr_kv("gen_ai.latency.time_to_first_token", round(r.first_token - r.arrival, 6)),
            attr_kv("gen_ai.latency.e2e", round(r.finish - r.arrival, 6)),
            # SGLang's time_in_model_prefill is first token - dispatch finish: it includes the queue
            attr_kv("gen_ai.latency.time_in_model_prefill", round(r.first_token - disp_end, 6)),
            attr_kv("gen_ai.latency.time_in_model_decode", round(r.finish - r.first_token, 6)),
            attr_kv("gen_ai.latency.time_in_model_inference", round(r.finish - disp_end, 6)),
        ]
        spans = [
            {"name": f" Req {rid[:8]}", "spanId": root, "parentSpanId": "", "start": r.arrival, "end": r.finish,
             "attributes": root_attrs},
        ]
        threads: dict[str, str] = {}
        for thread, name, a, b in _sglang_slices(r):
            if thread not in threads:
                threads[thread] = hex_bits(rng, 64)
                tspan_end = r.queued + 0.0015 if thread == "Tokenizer" else r.finish
                tattrs = [attr_kv("host_id", host), attr_kv("pid", pids[thread]), attr_kv("thread_label", thread)]
                tname = f"{thread} (host:{host[:8]} | pid:{pids[thread]})"
                if thread == "Scheduler":
                    tattrs.insert(0, attr_kv("tp_rank", 0))
                    tname = f"{thread} [TP 0] (host:{host[:8]} | pid:{pids[thread]})"
                spans.append({"name": tname, "spanId": threads[thread], "parentSpanId": root,
                              "start": a, "end": tspan_end, "attributes": tattrs})
            spans.append({"name": name, "spanId": hex_bits(rng, 64), "parentSpanId": threads[thread], "start": a,
                          "end": b, "attributes": []})
        for s in spans:
            items.append((r.finish, {
                "traceId": trace, "spanId": s["spanId"], "parentSpanId": s["parentSpanId"], "name": s["name"],
                "kind": 1, "startTimeUnixNano": str(unix_ns(s["start"])), "endTimeUnixNano": str(unix_ns(s["end"])),
                "attributes": s["attributes"], "status": {},
            }))
    return [otlp_request("sglang", "sglang server", b) for b in export_batches(items, 5.0)]
