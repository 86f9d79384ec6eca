"""Load shapes for the probe: closed-loop fixed concurrency, or open-loop Poisson/gamma
arrivals at a rate under a concurrency cap; bounded by a request count or a duration; with a
warm-up excluded from the results; optionally spread over several worker processes.

No coordinated omission: in rate mode every request has a *scheduled* send time from the
arrival process. When all client slots are busy (or the loop is late), it waits, and
``slot_wait_s = start - scheduled`` is recorded on the request (ATTR_CLIENT_SLOT_WAIT_S,
ATTR_CLIENT_SCHEDULED_NS) — TTFT itself starts at the real send, and the metrics also report
TTFT + slot wait (what a user arriving on schedule would have seen). In closed-loop mode a
request is scheduled the moment its slot frees, so slot wait measures only client lag.

Threading: :func:`run_phase` runs on one event loop. :func:`run_phase_in_workers` blocks the
calling thread while ``workers`` spawned processes each run their share (:func:`run_worker`:
:func:`run_phase` on a loop of their own); results, health samples and spans (OTLP JSON lines)
come back through files. Ray actors run the same :func:`run_worker` (:mod:`.ray_workers`).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import os
import pickle
import random
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collectors.probe import eventloop
from collectors.probe.affinity import worker_cpus
from collectors.probe.client import StreamingClient
from collectors.probe.results import RequestResult
from collectors.probe.health import HealthMonitor, HealthSamples
from collectors.probe.workload import Workload


@dataclass
class LoadSpec:
    """How to send. ``rate_rps`` None = closed loop at ``concurrency``; else open loop with
    ``concurrency`` as the cap. ``burstiness`` is the gamma shape (1 = Poisson; < 1 burstier).
    Bounds: ``requests`` and/or ``duration_s`` (whichever ends first); neither = 100 requests.
    """

    concurrency: int = 1
    rate_rps: float | None = None
    burstiness: float = 1.0
    requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.rate_rps is not None and not (self.rate_rps > 0):
            raise ValueError("rate must be > 0 requests/s")
        if self.burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration must be > 0 s")
        if self.warmup_requests < 0:
            raise ValueError("warmup must be >= 0")

    @property
    def mode(self) -> str:
        return "rate" if self.rate_rps is not None else "concurrency"

    @property
    def bounded_requests(self) -> int | None:
        if self.requests is None and self.duration_s is None:
            return 100
        return self.requests

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "concurrency": self.concurrency,
            "rate_rps": self.rate_rps,
            "arrivals": None if self.rate_rps is None else ("poisson" if self.burstiness == 1 else f"gamma(shape={self.burstiness:g})"),
            "burstiness": self.burstiness,
            "requests": self.bounded_requests,
            "duration_s": self.duration_s,
            "warmup_requests": self.warmup_requests,
        }

    def split(self, n: int) -> list[LoadSpec]:
        """This load shared by ``n`` processes: concurrency, rate and counts divided. No more
        shares than the concurrency: each share holds at least one request in flight, so more
        shares would put more requests in flight than asked.

        Superposed Poisson processes are Poisson; gamma arrivals split this way keep their
        shape per worker but the merged stream is somewhat smoother than one gamma stream.
        """
        n = max(1, min(n, self.concurrency))
        out = []
        for k in range(n):
            def share(total: int) -> int:
                return total // n + (1 if k < total % n else 0)

            out.append(replace(
                self,
                concurrency=max(1, share(self.concurrency)),
                rate_rps=None if self.rate_rps is None else self.rate_rps / n,
                requests=None if self.bounded_requests is None else share(self.bounded_requests),
                warmup_requests=share(self.warmup_requests),
                seed=self.seed * 1000 + k + 1,
            ))
        return [s for s in out if s.requests is None or s.requests > 0]


@dataclass
class PhaseOutcome:
    """What one load phase produced. Times are Unix ns; ``duration_s`` is the measured phase
    (warm-up excluded): first scheduled send to the last request's end."""

    results: list[RequestResult] = field(default_factory=list)
    health: list[HealthSamples] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    span_lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.end_ns - self.start_ns) / 1e9)

    @property
    def measured(self) -> list[RequestResult]:
        return [r for r in self.results if not r.warmup]


OnResult = Callable[[RequestResult], None]


async def _closed_loop(client: StreamingClient, workload: Workload, concurrency: int, n: int | None,
                       deadline_perf_ns: int | None, segment: str | None, warmup: bool, ids: Any,
                       out: list[RequestResult], on_result: OnResult | None) -> None:
    counter = itertools.count()

    async def slot() -> None:
        while True:
            if n is not None and next(counter) >= n:
                return
            if deadline_perf_ns is not None and time.perf_counter_ns() >= deadline_perf_ns:
                return
            item = workload.next_item()
            sched = time.perf_counter_ns()
            res = await client.request(item, next(ids), segment, warmup, scheduled_perf_ns=sched)
            out.append(res)
            if on_result is not None:
                on_result(res)

    await asyncio.gather(*(slot() for _ in range(concurrency)))


async def sleep_until_perf_ns(t_ns: int) -> None:
    """Sleep until ``time.perf_counter_ns() >= t_ns``, never earlier.

    Event-loop timers may fire early by up to the loop's clock resolution: uvloop's libuv
    timers count whole milliseconds from a time cached at the start of each loop iteration,
    so a 30.4 ms sleep can end 0.2-1 ms short. An open loop that sent on such a wake-up would
    send before its scheduled time and offer more than the asked rate, so this sleeps again
    for whatever is left (a sub-millisecond remainder becomes a zero-length sleep, i.e. a yield
    to the loop, until the time has come).
    """
    while True:
        delay_s = (t_ns - time.perf_counter_ns()) / 1e9
        if delay_s <= 0:
            return
        await asyncio.sleep(delay_s)


async def _open_loop(client: StreamingClient, workload: Workload, load: LoadSpec, n: int | None,
                     start_perf_ns: int, segment: str | None, ids: Any, out: list[RequestResult],
                     on_result: OnResult | None) -> None:
    rng = random.Random(load.seed)
    assert load.rate_rps is not None
    shape = load.burstiness
    scale_s = 1.0 / (load.rate_rps * shape)
    sem = asyncio.Semaphore(load.concurrency)
    tasks: set[asyncio.Task[None]] = set()
    horizon_ns = None if load.duration_s is None else start_perf_ns + int(load.duration_s * 1e9)

    async def one(item: Any, rid: str, sched_ns: int) -> None:
        try:
            res = await client.request(item, rid, segment, False, scheduled_perf_ns=sched_ns)
        finally:
            sem.release()
        out.append(res)
        if on_result is not None:
            on_result(res)

    t_ns = start_perf_ns
    for i in itertools.count():
        if n is not None and i >= n:
            break
        if i:
            t_ns += int(rng.gammavariate(shape, scale_s) * 1e9)
        if horizon_ns is not None and t_ns >= horizon_ns:
            break
        await sleep_until_perf_ns(t_ns)
        item = workload.next_item()
        await sem.acquire()  # waiting here is slot wait: t_ns stays the scheduled time
        task = asyncio.get_running_loop().create_task(one(item, next(ids), t_ns))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*list(tasks))


async def run_phase(
    client: StreamingClient,
    workload: Workload,
    load: LoadSpec,
    segment: str | None = None,
    on_result: OnResult | None = None,
    id_prefix: str = "",
    health: HealthMonitor | None = None,
) -> PhaseOutcome:
    """Warm-up (closed loop, excluded), then the measured load. ``client`` must be open.

    Request ids are ``{id_prefix}{segment}-{n}`` (``w`` marks warm-up). Runs on the
    calling loop; returns when every request has finished (each bounded by the client's
    timeout).
    """
    outcome = PhaseOutcome()
    own_health = health is None
    if health is None:
        health = HealthMonitor()
        health.start()
    label = f"{id_prefix}{segment or 'r'}"
    if load.warmup_requests:
        wids = (f"{label}-w{i}" for i in itertools.count())
        await _closed_loop(client, workload, min(load.concurrency, load.warmup_requests), load.warmup_requests,
                           None, segment, True, wids, outcome.results, None)
    ids = (f"{label}-{i}" for i in itertools.count())
    n = load.bounded_requests
    start = time.perf_counter_ns()
    outcome.start_ns = client.unix_ns(start)
    measured: list[RequestResult] = []
    if load.rate_rps is None:
        deadline = None if load.duration_s is None else start + int(load.duration_s * 1e9)
        await _closed_loop(client, workload, load.concurrency, n, deadline, segment, False, ids, measured, on_result)
    else:
        await _open_loop(client, workload, load, n, start, segment, ids, measured, on_result)
    outcome.end_ns = max([r.last_ns or r.headers_ns or r.start_ns for r in measured] + [outcome.start_ns])
    outcome.results.extend(measured)
    if own_health:
        outcome.health.append(await health.stop())
    return outcome


# --- worker processes -------------------------------------------------------------------------

#: gen_ai.provider.name of the probe's client spans: the API it speaks (OpenAI-compatible)
PROBE_PROVIDER = "openai"


@dataclass
class WorkerJob:
    """Everything one worker process needs (picklable)."""

    index: int
    endpoint: Any
    client_kwargs: dict[str, Any]
    workload_spec: Any
    tokenizer_path: str | None
    load: LoadSpec
    segment: str | None
    out_path: str
    trace: bool
    words_per_token: float = 1.0
    #: CPUs to pin this worker to (``--cpus``: its own one when there is one per worker)
    cpus: tuple[int, ...] | None = None
    #: also export this worker's client spans over OTLP/HTTP here
    otlp_endpoint: str | None = None


def run_worker(job: WorkerJob, wait_start: Callable[[], None],
               on_client: Callable[[StreamingClient], None] | None = None) -> tuple[PhaseOutcome, list[str]]:
    """One worker's share of a phase on a new event loop (blocks the calling thread): pin it
    (``job.cpus``), build its workload, span sink and client, call ``on_client`` on the client
    (before it opens), ``wait_start()`` (a barrier, a start time), then :func:`run_phase` with a
    health monitor of its own (entity ``worker{index}``). Returns the outcome and the worker's
    client spans as OTLP JSON lines. Process workers and Ray actors both run this."""
    if job.cpus:
        from collectors.probe.affinity import pin_process

        pin_process(job.cpus)
    from collectors.probe.spans_io import drain_span_lines
    from collectors.probe.workload import TokenCounter
    from collectors.spans import setup_tracing

    tok = TokenCounter(job.tokenizer_path) if job.tokenizer_path else None
    workload = Workload(job.workload_spec, tok)
    workload.words_per_token = job.words_per_token
    sink = setup_tracing(service_name="ttft-probe", memory=True, otlp_endpoint=job.otlp_endpoint,
                         provider_name=PROBE_PROVIDER) if job.trace else None

    async def main() -> PhaseOutcome:
        client = StreamingClient(job.endpoint, job.load.concurrency, sink=sink, **job.client_kwargs)
        client.count_tokens = tok.count if tok is not None else None
        if on_client is not None:
            on_client(client)
        await client.open()
        try:
            wait_start()
            mon = HealthMonitor(entity=f"worker{job.index}")
            mon.start()
            outcome = await run_phase(client, workload, job.load, job.segment, None,
                                      id_prefix=f"p{job.index}.", health=mon)
            outcome.health.append(await mon.stop())
            return outcome
        finally:
            await client.close()

    try:
        outcome = eventloop.run(main())
        lines = drain_span_lines(sink) if sink is not None else []
    finally:
        if sink is not None:
            sink.shutdown()
    return outcome, lines


def _worker_main(job: WorkerJob, barrier: Any) -> None:
    """Entry point of a spawned worker: run one phase, write results/health/spans to a file."""
    payload: dict[str, Any] = {"results": [], "health": [], "span_lines": [], "error": None}
    try:
        outcome, lines = run_worker(job, lambda: barrier.wait(120))
        payload["results"] = [r.to_dict() for r in outcome.results]
        payload["health"] = [h.to_dict() for h in outcome.health]
        payload["start_ns"], payload["end_ns"] = outcome.start_ns, outcome.end_ns
        payload["span_lines"] = lines
    except Exception as exc:  # reported by the parent, never a silent loss
        payload["error"] = f"{type(exc).__name__}: {exc}"
        payload["traceback"] = traceback.format_exc()
        try:
            barrier.abort()
        except Exception:
            pass
    tmp = job.out_path + ".tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, job.out_path)


def worker_jobs(
    workers: int,
    endpoint: Any,
    client_kwargs: dict[str, Any],
    workload: Workload,
    load: LoadSpec,
    segment: str | None,
    trace: bool = True,
    cpus: tuple[int, ...] | None = None,
    otlp_endpoint: str | None = None,
    out_dir: str | Path = "",
) -> list[WorkerJob]:
    """One job per share of ``load`` split over ``workers`` (:meth:`LoadSpec.split`): each its
    share, its own workload seed, its CPUs and its result file ``worker-{k}.pkl`` under ``out_dir``."""
    shares = load.split(workers)
    jobs = []
    for k, share in enumerate(shares):
        wspec = replace(workload.spec, seed=workload.spec.seed * 7919 + k + 1) if hasattr(workload.spec, "seed") else workload.spec
        jobs.append(WorkerJob(k, endpoint, client_kwargs, wspec,
                              workload.tokenizer.path if workload.tokenizer is not None else None,
                              share, segment, str(Path(out_dir) / f"worker-{k}.pkl"), trace,
                              workload.words_per_token, worker_cpus(cpus, k, len(shares)), otlp_endpoint))
    return jobs


def run_phase_in_workers(
    workers: int,
    endpoint: Any,
    client_kwargs: dict[str, Any],
    workload: Workload,
    load: LoadSpec,
    segment: str | None,
    trace: bool = True,
    cpus: tuple[int, ...] | None = None,
    otlp_endpoint: str | None = None,
) -> PhaseOutcome:
    """Run one phase split over ``workers`` spawned processes and merge what they return.

    ``cpus`` pins the workers (each its own CPU when there are enough, else all share them).

    Blocks the calling thread (do not call it from a running event loop). Workers start
    together after a barrier; a worker that fails is reported in ``notes`` and the others'
    results are kept.
    """
    ctx = mp.get_context("spawn")
    outcome = PhaseOutcome()
    with tempfile.TemporaryDirectory(prefix="ttft-probe-") as tmp:
        jobs = worker_jobs(workers, endpoint, client_kwargs, workload, load, segment, trace, cpus, otlp_endpoint, tmp)
        barrier = ctx.Barrier(len(jobs) + 1)
        procs = [ctx.Process(target=_worker_main, args=(job, barrier), daemon=True) for job in jobs]
        for p in procs:
            p.start()
        try:
            barrier.wait(180)
        except Exception:
            outcome.notes.append("workers did not all start (barrier broken); results of those that ran are kept")
        budget_s = (load.duration_s or 0) + 3600
        for p in procs:
            p.join(budget_s)
            if p.is_alive():
                p.terminate()
                outcome.notes.append(f"worker pid {p.pid} did not finish; terminated")
        starts, ends = [], []
        for job in jobs:
            path = Path(job.out_path)
            if not path.exists():
                outcome.notes.append(f"worker {job.index} exited without results")
                continue
            with open(path, "rb") as fh:
                payload = pickle.load(fh)
            if payload.get("error"):
                outcome.notes.append(f"worker {job.index} failed: {payload['error']}")
            outcome.results.extend(RequestResult.from_dict(d) for d in payload["results"])
            outcome.health.extend(HealthSamples.from_dict(h) for h in payload["health"])
            outcome.span_lines.extend(payload["span_lines"])
            if payload.get("start_ns"):
                starts.append(payload["start_ns"])
                ends.append(payload["end_ns"])
    outcome.start_ns = min(starts) if starts else time.time_ns()
    outcome.end_ns = max(ends) if ends else outcome.start_ns
    return outcome


def cpu_count() -> int:
    """CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


__all__ = ["LoadSpec", "PhaseOutcome", "WorkerJob", "cpu_count", "run_phase", "run_phase_in_workers", "run_worker",
           "worker_jobs"]
