"""A tiny continuous-batching engine *simulator* that writes real captures through the span
helpers (``collectors.spans``), so rule tests see the same spans, attributes and tables as
real runs. Times are simulated (no sleeping); every number is derived from a cost model:

* tokenize: ``tok_base_s + tok_s_per_token * prompt`` in the HTTP handler (parallel);
* the step loop: ``stall_s`` before each step (a CPU-bound scheduler), then either one
  prefill step for the admitted requests (prefill-first) or one decode step for the batch;
* prefill step: ``prefill_base_s + prefill_s_per_token * tokens``; ``comm_frac`` of it is
  tensor-parallel comm (nested in prefill); ``sample_s`` then ``detok_s_per_token``;
* decode step: ``decode_base_s + decode_s_per_seq * running`` (+ detok per sequence);
* KV: each admitted request reserves prompt + output tokens of ``kv_tokens`` capacity;
* client: ``net_s`` each way (+ ``frontend_s_per_conc`` x (conc - 1) before the server's clock
  starts: a queueing front end); ``client_lag_s`` (a saturated load generator) delays sends
  and the client's view of the first token.

Workload: a list of phases run one after another, each either closed-loop (``conc``
clients sending back to back) or open (explicit arrival offsets), labelled with a segment.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from collectors.spans import setup_tracing
from diag.ground import stages
from diag.ground.capture import load_capture
from diag.ground.tables import Tables, build_tables

MS = 1e-3


@dataclass
class Engine:
    tok_base_s: float = 0.3 * MS
    tok_s_per_token: float = 0.002 * MS
    stall_s: float = 0.0
    prefill_base_s: float = 2 * MS
    prefill_s_per_token: float = 0.02 * MS
    decode_base_s: float = 3 * MS
    decode_s_per_seq: float = 0.2 * MS
    sample_s: float = 0.1 * MS
    detok_s_per_token: float = 0.05 * MS
    comm_frac: float = 0.0
    tp_size: int = 1
    kv_tokens: int = 1_000_000
    max_running: int = 256
    max_batch_tokens: int = 2048  # prefill tokens per step (max_num_batched_tokens); one prompt always fits
    warmup_first_s: float = 0.0  # the first prefill pays this once (first compile)
    cold_start_s: float = 0.0  # a model-load span before the first request
    jitter: float = 0.05  # relative noise on every cost


@dataclass
class Phase:
    segment: str
    n: int
    prompt: int | list[int]
    output: int | list[int]  # a list cycles, as ``prompt`` does (one index for both)
    conc: int | None = 1  # closed loop with this many clients; None -> open arrivals
    arrivals_s: list[float] | None = None  # open loop: offsets from the phase start
    engine: Engine | None = None  # this phase's engine (e.g. another TP degree); default: the run's


@dataclass
class Client:
    net_s: float = 0.2 * MS
    lag_s: float = 0.0
    health: dict[str, Any] | None = None
    #: a front end before the engine's clock (an API server that queues): each request of a
    #: closed-loop phase waits this x (conc - 1) before the server span starts
    frontend_s_per_conc: float = 0.0


@dataclass
class _Req:
    rid: str
    seg: str
    prompt: int
    output: int
    client_start: float
    arrival: float  # at the server
    ready: float = 0.0  # tokenized, enters the queue
    admitted: float = 0.0
    tokens: list[float] = field(default_factory=list)
    phase_i: int = 0
    client_i: int = 0
    error: str | None = None
    tp_size: int = 1


def simulate(path: Path, engine: Engine, phases: list[Phase], client: Client | None = None, *, server: bool = True,
             client_side: bool = True, seed: int = 0, error_every: int = 0) -> dict[str, Path]:
    """Run the workload through the cost model and write captures under ``path``.

    Returns {"server": dir, "client": dir} for the sides written.
    """
    rng = random.Random(seed)
    client = client or Client()
    t0 = (time.time_ns() // 1_000_000_000 - 3600) * 1.0  # an hour ago, whole seconds

    def j(x: float) -> float:
        return x * (1.0 + engine.jitter * (2 * rng.random() - 1)) if x > 0 else 0.0

    done: list[_Req] = []
    t = t0 + engine.cold_start_s + 0.5
    steps: list[tuple[float, float, dict[str, Any]]] = []
    stage_rec: dict[str, list[tuple[str, float, float, dict[str, Any]]]] = {}
    warm_paid = False
    counter = 0
    base_engine = engine
    for pi, ph in enumerate(phases):
        engine = ph.engine or base_engine
        prompts = ph.prompt if isinstance(ph.prompt, list) else [ph.prompt]
        pending: list[tuple[float, int, _Req]] = []  # (arrival, seq, req)
        issued = 0

        def make(at: float, ci: int) -> _Req:
            nonlocal issued, counter
            p = prompts[issued % len(prompts)]
            out = ph.output[issued % len(ph.output)] if isinstance(ph.output, list) else ph.output
            issued += 1
            counter += 1
            lag = j(client.lag_s) if client.lag_s else 0.0
            cs = at + lag
            fe = j(client.frontend_s_per_conc * ((ph.conc or 1) - 1)) if client.frontend_s_per_conc else 0.0
            r = _Req(f"r{counter}", ph.segment, p, out, client_start=cs, arrival=cs + j(client.net_s) + fe, phase_i=pi,
                     client_i=ci, tp_size=engine.tp_size)
            if error_every and counter % error_every == 0:
                r.error = "http_503"
            return r

        start = t
        if ph.conc is None:
            for off in (ph.arrivals_s or [])[: ph.n]:
                r = make(start + off, -1)
                heapq.heappush(pending, (r.arrival, counter, r))
        else:
            for ci in range(min(ph.conc, ph.n)):
                r = make(start + ci * 1e-4, ci)
                heapq.heappush(pending, (r.arrival, counter, r))
        waiting: list[_Req] = []
        running: list[_Req] = []
        kv_used = 0
        finished_phase = 0
        while finished_phase < ph.n:
            # requests that arrived: tokenize in the handler, then queue
            while pending and pending[0][0] <= t:
                _, _, r = heapq.heappop(pending)
                if r.error:
                    r.ready = r.arrival
                    r.tokens = []
                    done.append(r)
                    finished_phase += 1
                    if ph.conc is not None and issued < ph.n:
                        nr = make(r.arrival + 2 * client.net_s, r.client_i)
                        heapq.heappush(pending, (nr.arrival, counter, nr))
                    continue
                r.ready = r.arrival + j(engine.tok_base_s + engine.tok_s_per_token * r.prompt)
                waiting.append(r)
            ready = [r for r in waiting if r.ready <= t]
            if not ready and not running:
                nxt = min([r.ready for r in waiting] + ([pending[0][0]] if pending else []), default=None)
                if nxt is None:
                    break
                t = max(t, nxt)
                continue
            t += j(engine.stall_s)
            admit: list[_Req] = []
            for r in sorted(ready, key=lambda r: r.ready):
                need = r.prompt + r.output
                batch_tokens = sum(a.prompt for a in admit)
                if admit and batch_tokens + r.prompt > engine.max_batch_tokens:
                    break
                if len(running) + len(admit) < engine.max_running and kv_used + need <= engine.kv_tokens:
                    admit.append(r)
                    kv_used += need
                else:
                    break
            if admit:
                for r in admit:
                    waiting.remove(r)
                    r.admitted = t
                ntok = sum(r.prompt for r in admit)
                dur = j(engine.prefill_base_s + engine.prefill_s_per_token * ntok)
                if not warm_paid and engine.warmup_first_s:
                    dur += engine.warmup_first_s
                    warm_paid = True
                comm = dur * engine.comm_frac
                end = t + dur + engine.sample_s
                first = end + j(engine.detok_s_per_token)
                for r in admit:
                    stage_rec.setdefault(r.rid, []).extend([
                        (stages.QUEUE, r.ready, t, {}),
                        (stages.PREFILL, t, t + dur, {}),
                        *([(stages.COMM, t + dur - comm, t + dur, {})] if comm > 0 else []),
                        (stages.SAMPLE, t + dur, end, {}),
                        (stages.DETOKENIZE, end, first, {}),
                    ])
                    r.tokens.append(first)
                    running.append(r)
                steps.append((t, first, {stages.ATTR_STEP_PREFILL_TOKENS: ntok, stages.ATTR_STEP_PREFILL_SEQS: len(admit),
                                         stages.ATTR_STEP_DECODE_SEQS: 0, stages.ATTR_STEP_KV_USAGE: kv_used / engine.kv_tokens,
                                         stages.ATTR_STEP_COMM_S: comm, stages.ATTR_STEP_WAITING: len(waiting),
                                         stages.ATTR_STEP_RUNNING: len(running)}))
                t = first
            else:
                n = len(running)
                dur = j(engine.decode_base_s + engine.decode_s_per_seq * n) + engine.detok_s_per_token * n
                end = t + dur
                steps.append((t, end, {stages.ATTR_STEP_PREFILL_TOKENS: 0, stages.ATTR_STEP_DECODE_SEQS: n,
                                       stages.ATTR_STEP_KV_USAGE: kv_used / engine.kv_tokens, stages.ATTR_STEP_COMM_S: 0.0,
                                       stages.ATTR_STEP_WAITING: len(waiting), stages.ATTR_STEP_RUNNING: n}))
                t = end
                for r in running:
                    r.tokens.append(end)
            still = []
            for r in running:
                if len(r.tokens) >= r.output:
                    kv_used -= r.prompt + r.output
                    done.append(r)
                    finished_phase += 1
                    if ph.conc is not None and issued < ph.n:
                        nr = make(r.tokens[-1] + 2 * client.net_s, r.client_i)
                        heapq.heappush(pending, (nr.arrival, counter, nr))
                else:
                    still.append(r)
            running = still
        t += 0.01

    out: dict[str, Path] = {}
    ns = lambda x: int(round(x * 1e9))  # noqa: E731
    csink = setup_tracing("probe", capture_dir=path / "client", export_interval_s=60) if client_side else None
    ssink = setup_tracing("engine", capture_dir=path / "server", export_interval_s=60) if server else None
    if ssink is not None and base_engine.cold_start_s:
        ssink.record_cold_start(ns(t0), ns(t0 + base_engine.cold_start_s), "load")
    for r in done:
        tp = None
        attrs_common = {stages.GEN_AI_USAGE_INPUT_TOKENS: r.prompt, stages.ATTR_SEGMENT: r.seg}
        if csink is not None:
            ct = csink.start_request(r.rid, side="client", start_ns=ns(r.client_start), attributes={
                **attrs_common, stages.ATTR_CLIENT_START_NS: ns(r.client_start), stages.ATTR_CLIENT_SENT_NS: ns(r.client_start),
            })
            tp = ct.traceparent()
            if not r.error:
                lag = j(client.lag_s) if client.lag_s else 0.0
                ctimes = [ns(x + client.net_s + lag) for x in r.tokens]
                for x in ctimes:
                    ct.add_token_time(x)
                ct.set_attributes({stages.ATTR_CLIENT_FIRST_CONTENT_NS: ctimes[0], stages.ATTR_CLIENT_LAST_NS: ctimes[-1],
                                   stages.GEN_AI_USAGE_OUTPUT_TOKENS: len(ctimes)})
                ct.end(end_ns=ctimes[-1])
            else:
                ct.end(end_ns=ns(r.client_start + 2 * client.net_s), error=r.error)
        if ssink is not None:
            st = ssink.start_request(r.rid, traceparent=tp, start_ns=ns(r.arrival), attributes={
                **attrs_common, stages.ATTR_TP_SIZE: r.tp_size})
            if r.error:
                st.end(end_ns=ns(r.arrival + 1e-4), error=r.error)
                continue
            st.record_stage(stages.TOKENIZE, ns(r.arrival), ns(r.ready))
            for name, a, b, attrs in stage_rec.get(r.rid, []):
                st.record_stage(name, ns(a), ns(b), attrs or None)
            for x in r.tokens:
                st.add_token_time(ns(x))
            st.set_attributes({stages.GEN_AI_USAGE_OUTPUT_TOKENS: len(r.tokens)})
            st.end(end_ns=ns(r.tokens[-1]))
    if ssink is not None:
        for a, b, attrs in steps:
            ssink.record_step(ns(a), ns(b), attrs)
        ssink.shutdown()
        out["server"] = path / "server"
    if csink is not None:
        if client.health is not None:
            csink.set_meta(client_health=client.health)
        if client.lag_s:
            ts = [t0 + 0.5 + k * 0.1 for k in range(int((t - t0) / 0.1))]
            frame = pd.DataFrame({"ts_s": ts, "source": "client", "series": stages.SERIES_LOOP_LAG_S, "entity": "",
                                  "value": [j(client.lag_s) for _ in ts]})
            csink.writer.write_series("client", frame)
        csink.shutdown()
        out["client"] = path / "client"
    return out


def tables_of(dirs: dict[str, Path], sides: tuple[str, ...] = ("client", "server")) -> Tables:
    """Load the chosen sides and build the joined tables."""
    caps = [load_capture(dirs[s]) for s in sides if s in dirs]
    return build_tables(caps)


def poisson(n: int, rate_per_s: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate_per_s)
        out.append(t)
    return out
