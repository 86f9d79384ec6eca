"""Regenerates the external-engine samples: /metrics scrapes, OTLP span files and captures.

For each of vLLM, SGLang, TGI and llama.cpp, a small continuous-batching simulation (fixed
seed, fixed base timestamp) runs a server into one bottleneck; its requests, engine steps and
gauges are then written the way that engine exposes them:

* ``<engine>/metrics.t<k>.prom`` — Prometheus text exposition, one file per scrape, every
  ``SCRAPE_INTERVAL_S`` seconds from ``BASE_TS_S``. vLLM and SGLang are rendered with
  ``prometheus_client`` (their own exporter; ``*_created`` samples are left out so the texts
  are reproducible); TGI as ``metrics-exporter-prometheus`` 0.15 prints (no ``_total``
  suffix, sorted families); llama.cpp as its hand-written exporter prints (counters, then
  gauges, values through C++ ``ostream`` default formatting).
* ``<engine>/spans.otlp.jsonl`` — OTLP JSON (one ExportTraceServiceRequest per line, hex ids)
  for the engines that trace: vLLM ``llm_request``, SGLang's request span tree, TGI's
  ``generate_stream`` span with Rust ``Debug`` duration strings. llama.cpp does not trace.
* ``<engine>/capture/`` — a ttft-diag capture made from the two: spans through
  ``CaptureWriter.append_span_request``, scrapes through ``collectors.prometheus.adapt_texts``
  into ``series/prometheus.parquet``, and a meta.json saying what the sample is.

Every metric, label and attribute name, and what each one measures (when it is observed, which
clock, which boundary), was read from the engine's source at the file and commit in
``NAME_SOURCES`` (the table is docs/engines.md). Help texts are paraphrased, not copied.

Run: ``python samples/external/make_external_samples.py [--out DIR]`` (default: next to this
file). Deterministic: the same command writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest  # noqa: E402

SEED = 20260101
#: Unix seconds of the first scrape (2026-01-01T00:00:00Z); requests start just after it.
BASE_TS_S = 1_767_225_600
SCRAPE_INTERVAL_S = 5
NS = 1_000_000_000
ENGINES: tuple[str, ...] = ("vllm", "sglang", "tgi", "llamacpp", "dynamo")

# --- the simulation -------------------------------------------------------------------------------


@dataclass
class SimConfig:
    """One server and its load. Times in seconds, sizes in tokens."""

    name: str
    arrivals_s: float  # arrivals happen in [0, arrivals_s)
    rate_start: float  # arrival rate (requests/s) at t=0, ramping linearly to rate_end
    rate_end: float
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    kv_capacity_tokens: int
    kv_block_tokens: int
    max_running: int
    prefill_budget_tokens: int  # prompt tokens per step (chunked prefill)
    step_base_s: float
    step_per_seq_s: float
    prefill_tokens_per_s: float
    tokenize_base_s: float = 0.001
    tokenize_per_token_s: float = 2e-6
    detokenize_s: float = 0.0005
    #: after tokenization, before the engine queues the request: input processing and the API
    #: server -> engine core IPC (vLLM's arrival_time is taken after tokenization, before this)
    ingest_s: float = 0.0
    #: admit into a free slot even when this step's prompt budget is spent (llama.cpp slots)
    admit_without_budget: bool = False
    scrape_interval_s: int = SCRAPE_INTERVAL_S


@dataclass
class Req:
    """One request through the simulated server (all times seconds from the run's start)."""

    rid: int
    arrival: float
    prompt: int
    output: int
    tokenize_s: float
    ingest_s: float = 0.0  # input processing + IPC after tokenization, before the queue
    queued: float = math.nan  # enters the waiting queue (after tokenization and ingest)
    scheduled: float = math.nan  # first admitted into the running batch
    first_token: float = math.nan
    finish: float = math.nan
    generated: int = 0
    prefilled: int = 0
    prefill_target: int = 0
    preemptions: int = 0
    token_times: list[float] = field(default_factory=list)
    admitted_at: float = math.nan  # latest admission (after a preemption too)
    kv_tokens: int = 0  # KV-cache tokens held now


@dataclass
class Step:
    """One engine step (one forward over the batch)."""

    start: float
    end: float
    prefill_tokens: int
    decode_seqs: int
    prefill_s: float  # the prompt part of the step time
    first_tokens: int
    preempted: int
    running: int


@dataclass
class StateSample:
    """The server's gauges at a scrape time."""

    t: float
    running: int
    waiting: int
    kv_used_tokens: int


@dataclass
class SimResult:
    cfg: SimConfig
    reqs: list[Req]
    steps: list[Step]
    states: list[StateSample]
    scrape_times: list[float]


def _arrivals(cfg: SimConfig, rng: random.Random) -> list[float]:
    """Poisson arrivals with a linearly ramping rate (thinning)."""
    out: list[float] = []
    peak = max(cfg.rate_start, cfg.rate_end)
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= cfg.arrivals_s:
            return out
        rate = cfg.rate_start + (cfg.rate_end - cfg.rate_start) * t / cfg.arrivals_s
        if rng.random() <= rate / peak:
            out.append(t)


def simulate(cfg: SimConfig, seed: int) -> SimResult:
    """Run a continuous-batching engine with a paged KV cache, chunked prefill and preemption.

    Each step: admit waiting requests (FIFO) while a slot, the prefill budget and KV blocks
    for their prompt allow; grow every decoding request by one token, preempting the most
    recently admitted request (recompute) when the KV cache cannot hold the growth.
    """
    rng = random.Random(seed)
    reqs = []
    for i, a in enumerate(_arrivals(cfg, rng)):
        p = rng.randint(*cfg.prompt_tokens)
        reqs.append(Req(i, a, p, rng.randint(*cfg.output_tokens), cfg.tokenize_base_s + cfg.tokenize_per_token_s * p,
                        cfg.ingest_s))
    blk = cfg.kv_block_tokens

    def blocks(tokens: int) -> int:
        return -(-tokens // blk) * blk

    pending = sorted(reqs, key=lambda r: r.arrival + r.tokenize_s + r.ingest_s)
    waiting: list[Req] = []
    running: list[Req] = []
    steps: list[Step] = []
    states: list[StateSample] = []
    horizon = cfg.arrivals_s * 4 + 120
    scrape_times = [float(k * cfg.scrape_interval_s) for k in range(int(horizon / cfg.scrape_interval_s) + 1)]
    next_scrape = 0
    t = 0.0
    done = 0

    def held(x: Req) -> int:  # KV tokens a running request holds or has reserved for its prompt
        return blocks(max(x.kv_tokens, x.prefill_target))

    while done < len(reqs) and t < horizon:
        while pending and pending[0].arrival + pending[0].tokenize_s + pending[0].ingest_s <= t:
            r = pending.pop(0)
            r.queued = r.arrival + r.tokenize_s + r.ingest_s
            waiting.append(r)
        while next_scrape < len(scrape_times) and scrape_times[next_scrape] <= t:
            used = sum(blocks(x.kv_tokens) for x in running)
            states.append(StateSample(scrape_times[next_scrape], len(running), len(waiting), used))
            next_scrape += 1
        if not running and not waiting:  # idle until the next arrival
            t_next = max(t, pending[0].arrival + pending[0].tokenize_s + pending[0].ingest_s) if pending else t + 0.01
            while next_scrape < len(scrape_times) and scrape_times[next_scrape] <= t_next:
                states.append(StateSample(scrape_times[next_scrape], 0, 0, 0))
                next_scrape += 1
            t = t_next
            continue
        budget = cfg.prefill_budget_tokens
        chunks: dict[int, int] = {}
        for r in running:  # continue partial prefills first
            if r.prefilled < r.prefill_target and budget > 0:
                c = min(r.prefill_target - r.prefilled, budget)
                chunks[r.rid] = c
                budget -= c
        reserved = sum(held(x) for x in running)
        while waiting and len(running) < cfg.max_running and (budget > 0 or cfg.admit_without_budget):
            r = waiting[0]
            target = r.prompt + r.generated
            if reserved + blocks(target + 1) > cfg.kv_capacity_tokens:
                break
            waiting.pop(0)
            r.prefill_target, r.prefilled, r.kv_tokens, r.admitted_at = target, 0, 0, t
            if math.isnan(r.scheduled):
                r.scheduled = t
            running.append(r)
            reserved += blocks(target + 1)
            c = min(target, budget)
            if c > 0:
                chunks[r.rid] = c
                budget -= c
        # decode growth; preempt the newest admission (recompute) while the cache cannot hold it
        decoding = [r for r in running if r.prefilled >= r.prefill_target > 0 and r.rid not in chunks]
        preempted = 0

        def need() -> int:
            return sum(blocks(max(x.kv_tokens + (1 if x in decoding else 0), x.prefill_target)) for x in running)

        while need() > cfg.kv_capacity_tokens and len(running) > 1:
            victim = max(running, key=lambda x: x.admitted_at)
            running.remove(victim)
            chunks.pop(victim.rid, None)
            if victim in decoding:
                decoding.remove(victim)
            victim.preemptions += 1
            victim.prefilled = victim.kv_tokens = 0
            waiting.insert(0, victim)
            preempted += 1
        n_prefill = sum(chunks.values())
        prefill_s = n_prefill / cfg.prefill_tokens_per_s
        end = t + cfg.step_base_s + cfg.step_per_seq_s * len(decoding) + prefill_s
        first = 0
        for r in list(running):
            if r.rid in chunks:
                r.prefilled += chunks[r.rid]
                r.kv_tokens += chunks[r.rid]
                if r.prefilled >= r.prefill_target and math.isnan(r.first_token):
                    r.first_token = end + cfg.detokenize_s
                    r.generated = 1
                    r.token_times.append(r.first_token)
                    first += 1
            elif r in decoding:
                r.generated += 1
                r.kv_tokens += 1
                r.token_times.append(end)
            if r.generated >= r.output and r.prefilled >= r.prefill_target:
                r.finish = max(end, r.first_token)
                running.remove(r)
                done += 1
        steps.append(Step(t, end, n_prefill, len(decoding), prefill_s, first, preempted, len(running)))
        t = end
    while next_scrape < len(scrape_times) and scrape_times[next_scrape] <= t + cfg.scrape_interval_s:
        states.append(StateSample(scrape_times[next_scrape], len(running), len(waiting), 0))
        next_scrape += 1
    finished = [r for r in reqs if not math.isnan(r.finish)]
    return SimResult(cfg, finished, steps, states, [s.t for s in states])


# --- scenarios ------------------------------------------------------------------------------------

#: Dynamo: the router's pick after tokenization, and front end -> worker transit (seconds)
DYNAMO_ROUTE_S = 0.0007
DYNAMO_TRANSIT_S = 0.0008

#: engine -> (simulation, expected category, what the story is)
SCENARIOS: dict[str, tuple[SimConfig, str, str]] = {
    "vllm": (
        SimConfig("vllm", arrivals_s=30, rate_start=1.0, rate_end=6.0, prompt_tokens=(800, 3000),
                  output_tokens=(120, 400), kv_capacity_tokens=32768, kv_block_tokens=16, max_running=64,
                  prefill_budget_tokens=8192, step_base_s=0.012, step_per_seq_s=0.0004, prefill_tokens_per_s=24000,
                  ingest_s=0.0008),
        "kv_cache",
        "arrivals ramp from 1 to 6 req/s into a 32k-token KV cache: KV usage climbs to ~1.0, the engine "
        "preempts running requests, the waiting queue grows and TTFT shifts right",
    ),
    "sglang": (
        SimConfig("sglang", arrivals_s=30, rate_start=0.8, rate_end=2.2, prompt_tokens=(300, 1200),
                  output_tokens=(150, 350), kv_capacity_tokens=12000, kv_block_tokens=1, max_running=6,
                  prefill_budget_tokens=8192, step_base_s=0.015, step_per_seq_s=0.0005, prefill_tokens_per_s=30000,
                  scrape_interval_s=10),
        "queue",
        "arrivals above what --max-running-requests 6 admits: the KV pool stays half empty, no retractions, "
        "the waiting queue deepens and queue time dominates TTFT",
    ),
    "tgi": (
        SimConfig("tgi", arrivals_s=60, rate_start=0.35, rate_end=0.35, prompt_tokens=(5000, 7800),
                  output_tokens=(16, 48), kv_capacity_tokens=200000, kv_block_tokens=16, max_running=32,
                  prefill_budget_tokens=16384, step_base_s=0.02, step_per_seq_s=0.0005, prefill_tokens_per_s=6000,
                  tokenize_base_s=0.002, tokenize_per_token_s=1e-6, scrape_interval_s=10),
        "prefill_compute",
        "long prompts (5-7.8k tokens) at a modest rate on a slow prefill (6k tokens/s): the prefill batch step "
        "(tgi_batch_inference_duration{method=\"prefill\"}) makes up most of TTFT; queue and validation are small",
    ),
    "llamacpp": (
        SimConfig("llamacpp", arrivals_s=50, rate_start=0.22, rate_end=0.22, prompt_tokens=(2000, 4000),
                  output_tokens=(24, 64), kv_capacity_tokens=4 * 8192, kv_block_tokens=1, max_running=4,
                  prefill_budget_tokens=512, step_base_s=0.045, step_per_seq_s=0.004, prefill_tokens_per_s=900,
                  tokenize_base_s=0.001, tokenize_per_token_s=1e-6, admit_without_budget=True),
        "prefill_compute",
        "a small GPU (or CPU) processes 2-4k-token prompts at ~900 tokens/s: prompt_seconds_total climbs ~0.9 s "
        "per second, prompt_tokens_seconds stays low, TTFT is seconds of prompt processing, slots fill and "
        "requests are deferred",
    ),
    "dynamo": (
        SimConfig("dynamo", arrivals_s=40, rate_start=1.5, rate_end=1.5, prompt_tokens=(4000, 7000),
                  output_tokens=(24, 64), kv_capacity_tokens=400000, kv_block_tokens=16, max_running=64,
                  prefill_budget_tokens=16384, step_base_s=0.012, step_per_seq_s=0.0003, prefill_tokens_per_s=40000,
                  tokenize_base_s=0.002, tokenize_per_token_s=9e-5, ingest_s=DYNAMO_ROUTE_S + DYNAMO_TRANSIT_S),
        "tokenize",
        "a Dynamo front end tokenizes 4-7k-token prompts on its CPU (0.36-0.63 s each) before routing them to a "
        "lightly loaded worker: tokenizer_latency_ms{operation=\"tokenize\"} and frontend_time_s make up most of the "
        "front end's TTFT, the worker's own first response is ~0.15 s",
    ),
}

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
VERSIONS: dict[str, str] = {
    "vllm": "vLLM V1 engine, current metric names (kv_cache_usage_perc, inter_token_latency_seconds, "
            "prompt_tokens_by_source, num_requests_waiting_by_reason); TTFT from arrival_time (after tokenization)",
    "sglang": "SGLang with --enable-metrics --enable-trace (observability/metrics_collector.py @44cedc2b, "
              "observability/trace.py @b8e5a7c3)",
    "tgi": "TGI 3.x router (@db931fcf), metrics-exporter-prometheus 0.15, --otlp-endpoint",
    "llamacpp": "llama.cpp server with --metrics (tools/server)",
    "dynamo": "NVIDIA Dynamo front end (dynamo_frontend_*) and one worker's work-handler metrics "
              "(dynamo_component_*), names of lib/runtime/src/metrics/prometheus_names.rs @04070c75",
}

# --- exposition helpers ---------------------------------------------------------------------------


def _strip_created(text: bytes) -> str:
    """prometheus_client text without ``*_created`` samples (their values are wall-clock times)."""
    lines = [ln for ln in text.decode().splitlines() if not _is_created(ln)]
    return "\n".join(lines) + "\n"


def _is_created(line: str) -> bool:
    if line.startswith("#"):
        parts = line.split(" ")
        return len(parts) > 2 and parts[2].endswith("_created")
    name = line.split("{", 1)[0].split(" ", 1)[0]
    return name.endswith("_created")


@dataclass
class _Events:
    """Time-ordered callbacks that update metric objects; ``until(t)`` applies those <= t."""

    items: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    pos: int = 0

    def add(self, t: float, fn: Callable[[], None]) -> None:
        self.items.append((t, len(self.items), fn))

    def until(self, t: float) -> None:
        if self.pos == 0:
            self.items.sort(key=lambda x: (x[0], x[1]))
        while self.pos < len(self.items) and self.items[self.pos][0] <= t:
            self.items[self.pos][2]()
            self.pos += 1


def _state_at(sim: SimResult, t: float) -> StateSample:
    for s in sim.states:
        if s.t == t:
            return s
    return StateSample(t, 0, 0, 0)


def _decode_gaps(r: Req) -> list[tuple[float, float]]:
    """(time of the token, gap to the previous token) for tokens after the first."""
    tt = r.token_times
    return [(tt[i], tt[i] - tt[i - 1]) for i in range(1, len(tt))]


# --- vLLM -----------------------------------------------------------------------------------------

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
    ev = _Events()
    for r in sim.reqs:
        def first(r: Req = r) -> None:
            ttft.labels(*lv).observe(_vllm_ttft_end(r, cfg) - _vllm_arrival(r))
            prompt.labels(*lv).inc(r.prompt)
            by_source.labels(*lv, "local_compute").inc(r.prompt)

        ev.add(_vllm_ttft_end(r, cfg), first)
        ev.add(r.scheduled, lambda r=r: pc_q.labels(*lv).inc(r.prompt))
        for t, gap in _decode_gaps(r):
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
        st = _state_at(sim, t)
        running.labels(*lv).set(st.running)
        waiting.labels(*lv).set(st.waiting)
        by_reason.labels(*lv, "capacity").set(st.waiting)
        by_reason.labels(*lv, "deferred").set(0)
        kv.labels(*lv).set(round(st.kv_used_tokens / cfg.kv_capacity_tokens, 4))
        texts.append(_strip_created(generate_latest(reg)))
    return texts


def _otlp_request(service: str, scope: str, spans: list[dict[str, Any]], scope_version: str = "") -> dict[str, Any]:
    scope_doc: dict[str, Any] = {"name": scope}
    if scope_version:
        scope_doc["version"] = scope_version
    return {"resourceSpans": [{
        "resource": {"attributes": [_kv("service.name", service)]},
        "scopeSpans": [{"scope": scope_doc, "spans": spans}],
    }]}


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    else:
        v = {"stringValue": str(value)}
    return {"key": key, "value": v}


def _ns(t: float) -> int:
    """Seconds from the run's start -> Unix ns."""
    return BASE_TS_S * NS + int(round(t * 1e9))


def _batches(items: list[tuple[float, dict[str, Any]]], every_s: float) -> list[list[dict[str, Any]]]:
    """Group spans by export time (BatchSpanProcessor flushes every ``every_s``)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for t, span in sorted(items, key=lambda x: x[0]):
        out.setdefault(int(t // every_s), []).append(span)
    return [out[k] for k in sorted(out)]


def _hex(rng: random.Random, bits: int) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"


def vllm_spans(sim: SimResult) -> list[dict[str, Any]]:
    """One ``llm_request`` span per finished request (vllm/v1/engine/output_processor.py do_tracing
    @d0782260): it starts at arrival_time (after tokenization); its TTFT ends before detokenize."""
    cfg = sim.cfg
    rng = random.Random(SEED + 1)
    items = []
    for r in sim.reqs:
        start, eng_first = _vllm_arrival(r), _vllm_engine_first(r, cfg)
        attrs = [
            _kv("gen_ai.request.id", f"cmpl-{_hex(rng, 128)}-0"),
            _kv("gen_ai.request.max_tokens", r.output),
            _kv("gen_ai.request.temperature", 0.7),
            _kv("gen_ai.request.top_p", 0.95),
            _kv("gen_ai.usage.prompt_tokens", r.prompt),
            _kv("gen_ai.usage.completion_tokens", r.output),
            _kv("gen_ai.usage.cached_tokens", 0),
            _kv("gen_ai.latency.time_in_queue", round(r.scheduled - r.queued, 6)),
            _kv("gen_ai.latency.time_to_first_token", round(_vllm_ttft_end(r, cfg) - start, 6)),
            _kv("gen_ai.latency.e2e", round(r.finish - start, 6)),
            _kv("gen_ai.latency.time_in_model_prefill", round(eng_first - r.scheduled, 6)),
            _kv("gen_ai.latency.time_in_model_decode", round(r.finish - eng_first, 6)),
            _kv("gen_ai.latency.time_in_model_inference", round(r.finish - r.scheduled, 6)),
        ]
        items.append((r.finish, {
            "traceId": _hex(rng, 128), "spanId": _hex(rng, 64), "parentSpanId": "", "name": "llm_request",
            "kind": 2, "startTimeUnixNano": str(_ns(start)), "endTimeUnixNano": str(_ns(r.finish)),
            "attributes": attrs, "status": {},
        }))
    return [_otlp_request("vllm", "vllm.llm_engine", b) for b in _batches(items, 5.0)]


# --- SGLang ---------------------------------------------------------------------------------------

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
    ev = _Events()
    for r in sim.reqs:
        ev.add(r.first_token, lambda r=r: ttft.labels(*tv).observe(r.first_token - r.arrival))
        for t, gap in _decode_gaps(r):
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
        st = _state_at(sim, t)
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
        texts.append(_strip_created(generate_latest(reg)))
    return texts


def sglang_spans(sim: SimResult) -> list[dict[str, Any]]:
    """SGLang's request span tree (python/sglang/srt/observability/trace.py @b8e5a7c3): Req root -> thread ->
    slices. The root carries gen_ai.latency.* on the tokenizer manager's clock; the "Bootstrap Room" span
    that older builds put above it is gone (now a root attribute, PD mode only), so it is not emitted."""
    rng = random.Random(SEED + 2)
    host = _hex(rng, 128)
    pids = {"Tokenizer": 41877, "Scheduler": 42011}
    items = []
    for r in sim.reqs:
        trace = f"{rng.getrandbits(64):032x}"  # SGLang's id generator draws 64-bit trace ids
        root = _hex(rng, 64)
        rid = _hex(rng, 128)
        disp_end = r.queued + 0.0015
        root_attrs = [
            _kv("rid", rid),
            _kv("gen_ai.latency.time_to_first_token", round(r.first_token - r.arrival, 6)),
            _kv("gen_ai.latency.e2e", round(r.finish - r.arrival, 6)),
            # SGLang's time_in_model_prefill is first token - dispatch finish: it includes the queue
            _kv("gen_ai.latency.time_in_model_prefill", round(r.first_token - disp_end, 6)),
            _kv("gen_ai.latency.time_in_model_decode", round(r.finish - r.first_token, 6)),
            _kv("gen_ai.latency.time_in_model_inference", round(r.finish - disp_end, 6)),
        ]
        spans = [
            {"name": f" Req {rid[:8]}", "spanId": root, "parentSpanId": "", "start": r.arrival, "end": r.finish,
             "attributes": root_attrs},
        ]
        threads: dict[str, str] = {}
        for thread, name, a, b in _sglang_slices(r):
            if thread not in threads:
                threads[thread] = _hex(rng, 64)
                tspan_end = r.queued + 0.0015 if thread == "Tokenizer" else r.finish
                tattrs = [_kv("host_id", host), _kv("pid", pids[thread]), _kv("thread_label", thread)]
                tname = f"{thread} (host:{host[:8]} | pid:{pids[thread]})"
                if thread == "Scheduler":
                    tattrs.insert(0, _kv("tp_rank", 0))
                    tname = f"{thread} [TP 0] (host:{host[:8]} | pid:{pids[thread]})"
                spans.append({"name": tname, "spanId": threads[thread], "parentSpanId": root,
                              "start": a, "end": tspan_end, "attributes": tattrs})
            spans.append({"name": name, "spanId": _hex(rng, 64), "parentSpanId": threads[thread], "start": a,
                          "end": b, "attributes": []})
        for s in spans:
            items.append((r.finish, {
                "traceId": trace, "spanId": s["spanId"], "parentSpanId": s["parentSpanId"], "name": s["name"],
                "kind": 1, "startTimeUnixNano": str(_ns(s["start"])), "endTimeUnixNano": str(_ns(s["end"])),
                "attributes": s["attributes"], "status": {},
            }))
    return [_otlp_request("sglang", "sglang server", b) for b in _batches(items, 5.0)]


# --- TGI ------------------------------------------------------------------------------------------

TGI_DURATION_BUCKETS: list[float] = []
_v = 0.0001
for _ in range(35):  # router/src/server.rs: geometric from 0.0001 x 1.5, 35 buckets
    _v *= 1.5
    TGI_DURATION_BUCKETS.append(_v)
TGI_MAX_INPUT_TOKENS = 8000
TGI_MAX_TOTAL_TOKENS = 8192
TGI_INPUT_BUCKETS = [TGI_MAX_INPUT_TOKENS / 100.0 * (x + 1) for x in range(100)]
TGI_GENERATED_BUCKETS = [TGI_MAX_TOTAL_TOKENS / 100.0 * (x + 1) for x in range(100)]
TGI_BATCH_MAX_TOTAL_TOKENS = 200000


def _rust_f64(v: float) -> str:
    """f64 as Rust's Display prints it: shortest round-trip digits, no exponent, no '.0'."""
    if v == int(v) and abs(v) < 1e16:
        return str(int(v))
    r = repr(float(v))
    if "e" in r:
        return f"{v:.20f}".rstrip("0")
    return r


class _Hist:
    """A cumulative histogram as an exporter keeps it."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = list(buckets)
        self.counts = [0] * len(self.bounds)
        self.total = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1
        self.total += 1
        self.sum += v


def _rust_histogram(name: str, labels: str, h: _Hist) -> list[str]:
    sep = "," if labels else ""
    out = [f'{name}_bucket{{{labels}{sep}le="{_rust_f64(b)}"}} {c}' for b, c in zip(h.bounds, h.counts)]
    out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {h.total}')
    lab = f"{{{labels}}}" if labels else ""
    out += [f"{name}_sum{lab} {_rust_f64(h.sum)}", f"{name}_count{lab} {h.total}"]
    return out


def _rust_duration(seconds: float) -> str:
    """A std::time::Duration as its Debug impl prints it ("1.5ms", "2.034s", "850µs")."""
    ns = max(int(round(seconds * 1e9)), 0)
    for unit, scale in (("s", NS), ("ms", 1_000_000), ("µs", 1_000)):
        if ns >= scale:
            whole, frac = divmod(ns, scale)
            digits = len(str(scale)) - 1
            frac_s = f"{frac:0{digits}d}".rstrip("0")
            return f"{whole}.{frac_s}{unit}" if frac_s else f"{whole}{unit}"
    return f"{ns}ns"


@dataclass
class _TgiBatch:
    """One TGI router batch call (prefill of new requests, or one decode step)."""

    t: float
    method: str
    inference_s: float
    forward_s: float


def _tgi_batches(sim: SimResult) -> list[_TgiBatch]:
    out = []
    for s in sim.steps:
        if s.prefill_tokens:
            pf = s.prefill_s + sim.cfg.step_base_s
            out.append(_TgiBatch(s.start + pf, "prefill", pf, pf * 0.93))
        if s.decode_seqs:
            dec = (s.end - s.start) - (s.prefill_s + sim.cfg.step_base_s if s.prefill_tokens else 0.0)
            out.append(_TgiBatch(s.end, "decode", dec, dec * 0.9))
    return out


#: TGI's own descriptions exist for these (router/src/server.rs); the wording here is ours.
TGI_HELP: dict[str, str] = {
    "tgi_request_success": "Requests that succeeded",
    "tgi_request_count": "Requests received",
    "tgi_request_duration": "Time to process a request, end to end",
    "tgi_request_validation_duration": "Time to validate (and tokenize) a request",
    "tgi_request_queue_duration": "Time a request spent queued",
    "tgi_request_inference_duration": "Time a request spent in inference",
    "tgi_request_mean_time_per_token_duration": "Mean time per generated token of a request",
    "tgi_request_generated_tokens": "Tokens generated per request",
    "tgi_request_input_length": "Prompt tokens per request",
    "tgi_batch_inference_count": "Batch inference calls by method",
    "tgi_batch_inference_success": "Successful batch inference calls by method",
    "tgi_batch_current_size": "Requests in the current batch",
    "tgi_queue_size": "Requests in the queue",
    "tgi_batch_current_max_tokens": "Most tokens the current batch may reach",
    "tgi_batch_inference_duration": "Batch inference time by method",
    "tgi_batch_forward_duration": "Shard forward time by method",
}


def tgi_texts(sim: SimResult) -> list[str]:
    """metrics-exporter-prometheus 0.15 rendering of the TGI router's metrics (no ``_total``)."""
    req_h = {k: _Hist(TGI_DURATION_BUCKETS) for k in ("tgi_request_duration", "tgi_request_validation_duration",
                                                       "tgi_request_queue_duration", "tgi_request_inference_duration",
                                                       "tgi_request_mean_time_per_token_duration")}
    inp = _Hist(TGI_INPUT_BUCKETS)
    gen = _Hist(TGI_GENERATED_BUCKETS)
    batch_h = {(n, m): _Hist(TGI_DURATION_BUCKETS) for n in ("tgi_batch_inference_duration",
                                                             "tgi_batch_forward_duration")
               for m in ("prefill", "decode")}
    counts: dict[str, int] = {"count": 0, "success": 0, "prefill": 0, "decode": 0}
    ev = _Events()
    for r in sim.reqs:
        ev.add(r.queued, lambda r=r: (inp.observe(r.prompt), counts.__setitem__("count", counts["count"] + 1),
                                      req_h["tgi_request_validation_duration"].observe(r.tokenize_s)))

        def fin(r: Req = r) -> None:
            inference = r.finish - r.scheduled
            req_h["tgi_request_duration"].observe(r.finish - r.arrival)
            req_h["tgi_request_queue_duration"].observe(r.scheduled - r.queued)
            req_h["tgi_request_inference_duration"].observe(inference)
            req_h["tgi_request_mean_time_per_token_duration"].observe(inference / r.output)
            gen.observe(r.output)
            counts["success"] += 1

        ev.add(r.finish, fin)
    for b in _tgi_batches(sim):
        def batch(b: _TgiBatch = b) -> None:
            batch_h[("tgi_batch_inference_duration", b.method)].observe(b.inference_s)
            batch_h[("tgi_batch_forward_duration", b.method)].observe(b.forward_s)
            counts[b.method] += 1

        ev.add(b.t, batch)
    texts = []
    for t in sim.scrape_times:
        ev.until(t)
        st = _state_at(sim, t)
        cur_max = sum(min(r.prompt + r.output, TGI_MAX_TOTAL_TOKENS) for r in sim.reqs
                      if r.scheduled <= t < r.finish)
        fams: dict[str, tuple[str, list[str]]] = {
            "tgi_request_count": ("counter", [f"tgi_request_count {counts['count']}"]),
            "tgi_request_success": ("counter", [f"tgi_request_success {counts['success']}"]),
            "tgi_batch_inference_count": ("counter", [
                f'tgi_batch_inference_count{{method="{m}"}} {counts[m]}' for m in ("decode", "prefill")]),
            "tgi_batch_inference_success": ("counter", [
                f'tgi_batch_inference_success{{method="{m}"}} {counts[m]}' for m in ("decode", "prefill")]),
            "tgi_queue_size": ("gauge", [f"tgi_queue_size {st.waiting}"]),
            "tgi_batch_current_size": ("gauge", [f"tgi_batch_current_size {st.running}"]),
            "tgi_batch_current_max_tokens": ("gauge", [f"tgi_batch_current_max_tokens {cur_max}"]),
            "tgi_batch_max_total_tokens": ("gauge", [f"tgi_batch_max_total_tokens {TGI_BATCH_MAX_TOTAL_TOKENS}"]),
            "tgi_request_input_length": ("histogram", _rust_histogram("tgi_request_input_length", "", inp)),
            "tgi_request_generated_tokens": ("histogram", _rust_histogram("tgi_request_generated_tokens", "", gen)),
        }
        for name, h in req_h.items():
            fams[name] = ("histogram", _rust_histogram(name, "", h))
        for name in ("tgi_batch_inference_duration", "tgi_batch_forward_duration"):
            lines: list[str] = []
            for m in ("decode", "prefill"):
                lines += _rust_histogram(name, f'method="{m}"', batch_h[(name, m)])
            fams[name] = ("histogram", lines)
        out: list[str] = []
        for name in sorted(fams):
            typ, lines = fams[name]
            if name in TGI_HELP:
                out.append(f"# HELP {name} {TGI_HELP[name]}")
            out.append(f"# TYPE {name} {typ}")
            out += lines
            out.append("")
        texts.append("\n".join(out))
    return texts


def tgi_spans(sim: SimResult) -> list[dict[str, Any]]:
    """The router's ``generate_stream`` span with its timing fields as Rust Debug durations."""
    rng = random.Random(SEED + 3)
    items = []
    for r in sim.reqs:
        inference = r.finish - r.scheduled
        attrs = [
            _kv("total_time", _rust_duration(r.finish - r.arrival)),
            _kv("validation_time", _rust_duration(r.tokenize_s)),
            _kv("queue_time", _rust_duration(r.scheduled - r.queued)),
            _kv("inference_time", _rust_duration(inference)),
            _kv("time_per_token", _rust_duration(inference / r.output)),
        ]
        items.append((r.finish, {
            "traceId": _hex(rng, 128), "spanId": _hex(rng, 64), "parentSpanId": "", "name": "generate_stream",
            "kind": 1, "startTimeUnixNano": str(_ns(r.arrival)), "endTimeUnixNano": str(_ns(r.finish)),
            "attributes": attrs, "status": {},
        }))
    return [_otlp_request("text-generation-inference.router", "text_generation_router", b)
            for b in _batches(items, 5.0)]


# --- llama.cpp ------------------------------------------------------------------------------------


def _cpp_double(v: float) -> str:
    """A double through C++ ``ostream <<`` with default flags: ``%g``, 6 significant digits."""
    return format(float(v), ".6g")


LLAMACPP_COUNTERS = (
    ("prompt_tokens_total", "Prompt tokens processed."),
    ("prompt_seconds_total", "Time spent processing prompts (s)."),
    ("tokens_predicted_total", "Tokens generated."),
    ("tokens_predicted_seconds_total", "Time spent generating (s)."),
    ("n_decode_total", "llama_decode() calls."),
    ("n_tokens_max", "Largest n_tokens seen."),
    ("n_busy_slots_per_decode", "Mean busy slots per llama_decode() call."),
)
LLAMACPP_GAUGES = (
    ("prompt_tokens_seconds", "Recent prompt throughput (tokens/s)."),
    ("predicted_tokens_seconds", "Recent generation throughput (tokens/s)."),
    ("requests_processing", "Requests being processed."),
    ("requests_deferred", "Requests deferred."),
)


def llamacpp_texts(sim: SimResult) -> list[str]:
    """The llama.cpp server's hand-written exposition (tools/server): counters, then gauges."""
    acc = {"prompt_tokens": 0, "prompt_ms": 0.0, "pred_tokens": 0, "pred_ms": 0.0, "n_decode": 0, "busy": 0,
           "n_tokens_max": 0}
    bucket = {"prompt_tokens": 0, "prompt_ms": 0.0, "pred_tokens": 0, "pred_ms": 0.0}
    ev = _Events()
    for r in sim.reqs:
        def prompt_done(r: Req = r) -> None:  # on_prompt_eval: after the slot's prompt is processed
            ms = (r.first_token - r.scheduled) * 1e3
            for d in (acc, bucket):
                d["prompt_tokens"] += r.prompt
                d["prompt_ms"] += ms
            acc["n_tokens_max"] = max(acc["n_tokens_max"], r.prompt)

        def released(r: Req = r) -> None:  # on_prediction: when the slot is released
            ms = (r.finish - r.first_token) * 1e3
            for d in (acc, bucket):
                d["pred_tokens"] += r.output
                d["pred_ms"] += ms
            acc["n_tokens_max"] = max(acc["n_tokens_max"], r.prompt + r.output)

        ev.add(r.first_token, prompt_done)
        ev.add(r.finish, released)
    for s in sim.steps:
        def decode_call(s: Step = s) -> None:
            acc["n_decode"] += 1
            acc["busy"] += s.running + (1 if s.first_tokens else 0)

        ev.add(s.end, decode_call)
    texts = []
    for t in sim.scrape_times:
        ev.until(t)
        st = _state_at(sim, t)
        values = {
            "prompt_tokens_total": acc["prompt_tokens"],
            "prompt_seconds_total": acc["prompt_ms"] / 1e3,
            "tokens_predicted_total": acc["pred_tokens"],
            "tokens_predicted_seconds_total": acc["pred_ms"] / 1e3,
            "n_decode_total": acc["n_decode"],
            "n_tokens_max": acc["n_tokens_max"],
            "n_busy_slots_per_decode": acc["busy"] / max(acc["n_decode"], 1),
            "prompt_tokens_seconds": 1e3 / bucket["prompt_ms"] * bucket["prompt_tokens"] if bucket["prompt_ms"] else 0.0,
            "predicted_tokens_seconds": 1e3 / bucket["pred_ms"] * bucket["pred_tokens"] if bucket["pred_ms"] else 0.0,
            "requests_processing": st.running,
            "requests_deferred": st.waiting,
        }
        out = []
        for typ, table in (("counter", LLAMACPP_COUNTERS), ("gauge", LLAMACPP_GAUGES)):
            for name, help_ in table:
                out += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {typ}",
                        f"llamacpp:{name} {_cpp_double(values[name])}"]
        texts.append("\n".join(out) + "\n")
        for k in bucket:  # the server resets its recent bucket on every /metrics call
            bucket[k] = 0 if isinstance(bucket[k], int) else 0.0
    return texts


# --- NVIDIA Dynamo ---------------------------------------------------------------------------------

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
    ev = _Events()
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
        for t, gap in _decode_gaps(r):
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
        texts.append(_strip_created(generate_latest(reg)))
    return texts


# --- writing --------------------------------------------------------------------------------------

RENDER: dict[str, tuple[Callable[[SimResult], list[str]], Callable[[SimResult], list[dict[str, Any]]] | None]] = {
    "vllm": (vllm_texts, vllm_spans),
    "sglang": (sglang_texts, sglang_spans),
    "tgi": (tgi_texts, tgi_spans),
    "llamacpp": (llamacpp_texts, None),
    "dynamo": (dynamo_texts, None),
}

#: What each sample's names are, and where they are defined (see samples/README.md).
NAME_SOURCES: dict[str, dict[str, str]] = {
    "vllm": {"metrics": "vllm-project/vllm vllm/v1/metrics/loggers.py (PrometheusStatLogger); meanings: "
                        "vllm/v1/metrics/stats.py @28ed1fb8, tests/entrypoints/instrumentator/test_metrics.py "
                        "@20ef9d82",
             "spans": "vllm-project/vllm vllm/v1/engine/output_processor.py do_tracing @d0782260 (start = "
                      "arrival_time, set after tokenization: vllm/v1/engine/input_processor.py @a1799180)"},
    "sglang": {"metrics": "sgl-project/sglang python/sglang/srt/observability/metrics_collector.py @44cedc2b "
                          "(was srt/metrics/collector.py); gauges set in scheduler_metrics_mixin.py @44cedc2b",
               "spans": "sgl-project/sglang python/sglang/srt/observability/trace.py @b8e5a7c3; stage names and "
                        "which are observed: RequestStage in python/sglang/srt/observability/req_time_stats.py "
                        "@602413bc"},
    "tgi": {"metrics": "huggingface/text-generation-inference router/src/server.rs, "
                       "backends/v3/src/{backend.rs,queue.rs} @db931fcf",
            "spans": "huggingface/text-generation-inference router/src/server.rs (generate_stream span fields)"},
    "llamacpp": {"metrics": "ggml-org/llama.cpp tools/server/server-context.cpp (earlier tools/server/server.cpp)",
                 "spans": "none: llama.cpp does not export traces"},
    "dynamo": {"metrics": "ai-dynamo/dynamo lib/runtime/src/metrics/prometheus_names.rs @04070c75 (frontend_service, "
                          "work_handler under dynamo_component_)",
               "spans": "none in this sample (the front end and the worker are read from their /metrics)"},
}


def build(engine: str) -> tuple[SimResult, list[str], list[dict[str, Any]] | None]:
    """Simulate one engine's scenario and render its scrapes and span lines."""
    cfg, _, _ = SCENARIOS[engine]
    sim = simulate(cfg, SEED)
    texts_fn, spans_fn = RENDER[engine]
    return sim, texts_fn(sim), spans_fn(sim) if spans_fn else None


def write_engine(engine: str, out: Path) -> Path:
    """Write ``out/<engine>/``: metrics.t<k>.prom, spans.otlp.jsonl (if any), capture/."""
    from collectors.prometheus import adapt_texts
    from diag.capture import CaptureWriter

    sim, texts, span_lines = build(engine)
    d = out / engine
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for k, text in enumerate(texts):
        (d / f"metrics.t{k}.prom").write_text(text, encoding="utf-8")
    if span_lines is not None:
        with open(d / "spans.otlp.jsonl", "w", encoding="utf-8") as fh:
            for doc in span_lines:
                fh.write(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n")
    cfg, category, story = SCENARIOS[engine]
    meta = {
        "created_unix_s": float(BASE_TS_S),
        "host": "synthetic",
        "sample": {
            "synthetic": True,
            "engine": engine,
            "shaped_like": VERSIONS[engine],
            "expected_category": category,
            "story": story,
            "names_from": NAME_SOURCES[engine],
            "generator": "samples/external/make_external_samples.py",
            "seed": SEED,
            "base_ts_s": BASE_TS_S,
            "scrape_interval_s": cfg.scrape_interval_s,
            "scrapes": len(texts),
            "requests": len(sim.reqs),
            "note": "made by a simulation from documented names, not recorded from a real server",
        },
        "what_ran": f"synthetic {engine} sample ({category})",
    }
    cap = d / "capture"
    with CaptureWriter(cap, meta=meta) as w:
        for doc in span_lines or ():
            w.append_span_request(doc)
        frame = adapt_texts([(float(BASE_TS_S + t), text) for t, text in zip(sim.scrape_times, texts)],
                            engine=None, entity="")
        w.write_series("prometheus", frame)
    return d


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="directory to write <engine>/ into (default: here)")
    ap.add_argument("engines", nargs="*", metavar="ENGINE",
                    help=f"engines to write (default: all of {', '.join(ENGINES)})")
    args = ap.parse_args(argv)
    engines: Iterable[str] = args.engines or ENGINES
    for e in engines:
        if e not in SCENARIOS:
            ap.error(f"unknown engine {e!r}")
        d = write_engine(e, args.out)
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        print(f"{d}: {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
