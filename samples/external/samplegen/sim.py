"""A small continuous-batching simulation (fixed seed): paged KV cache, chunked prefill, preemption by
recompute, a running-request limit. Times in seconds from the run's start, sizes in tokens."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

SEED = 20260101
#: Unix seconds of the first scrape (2026-01-01T00:00:00Z); requests start just after it.
BASE_TS_S = 1_767_225_600
SCRAPE_INTERVAL_S = 5
NS = 1_000_000_000

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
