"""The probe's workers as Ray actors: ``ttft probe URL --ray ADDRESS --workers N``.

:class:`RayWorkers` connects to a Ray cluster (``auto``, ``ray://HOST:10001``, ``HOST:PORT``) or
starts one on this machine (``local``: its CPUs), and places N :class:`ProbeWorker` actors where
Ray puts them (spread over the nodes). Each phase is split over the live actors exactly as over
process workers (:func:`.load.worker_jobs`), and each actor runs the same per-worker phase
(:func:`.load.run_worker`: its own event loop, its own client, its share of the concurrency or
rate, its seed). The actors get the driver's own ``collectors`` and ``diag`` packages through
the job's ``runtime_env`` (``py_modules``, :func:`runtime_env`), so they run the code the driver
runs; a tokenizer or prompts file travels with the job (nodes share no disk).

What comes back, all through Ray's return values (no shared files):

* every request's raw :class:`~.results.RequestResult`: the driver asks each running actor every
  :data:`POLL_S` for the results finished since it last asked and a snapshot of the requests in
  flight (:class:`.inflight.InFlightTracker`), and takes the rest with the phase's return value;
* the worker's health samples and its client spans (OTLP JSON lines) with the return value.

Clocks: before each phase the driver measures each actor's Unix clock against its own
(:mod:`.clock_sync`: several round trips, the shortest kept; offset +- half of it) and the worker
applies the offset to every timestamp it takes (its client's perf-counter-to-Unix offset, its
health samples), so results and spans arrive on the driver's clock and merge as they are. An actor
on the driver's own kernel reads the same clock: zero is applied there, the measurement recorded.
meta.json ``probe.ray`` holds each worker's node, host, offset, uncertainty and what was applied.

A worker that dies (actor crash, node lost, or a phase that does not end in time and is killed)
is reported in the notes and in meta.json; each request the driver last saw in flight on it
and never got a result for becomes a failed request of kind ``worker_lost``
(:func:`.inflight.lost_result`), and the driver writes the client spans of that worker's requests
itself (:func:`.inflight.stand_in_span_lines`); the other workers' results land as usual. Its
requests sent after the driver last heard from it (within :data:`POLL_S`) cannot be known: their
count, where the phase had one, is in the note. Later phases run on the workers left.

Priority: Ray's raylet starts its workers at niceness 15 (``RAY_worker_niceness``), so a probe
actor yields the CPU to everything else on its node and times that; ``local`` starts Ray with 0,
and each actor puts its threads back at 0 where it may (:func:`raise_priority`); one left above 0
is a note. A run of several sessions (a scenario matrix) keeps one set of actors for all of them
(:func:`kept`), placed before its engines start.

Threading: :class:`RayWorkers` methods block their caller (the probe session calls them from a
thread-pool thread). In an actor, :meth:`ProbeWorker.run` holds one of its threads (the phase's
event loop) while :meth:`ProbeWorker.take` and :meth:`ProbeWorker.now_ns` answer on others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collectors.probe.clock_sync import clock_id, measure
from collectors.probe.health import HealthSamples
from collectors.probe.inflight import InFlight, lost_result, stand_in_span_lines
from collectors.probe.load import LoadSpec, PhaseOutcome, WorkerJob, cpu_count, worker_jobs
from collectors.probe.ray_actor import ProbeWorker, RayJob, one_line
from diag.ground.capture import CaptureError

#: the optional dependency that brings Ray, as a user installs it
RAY_EXTRA = "pip install 'ttft-diag[ray]'"
#: seconds between the driver's asks for finished results and in-flight snapshots
POLL_S = 0.5
#: seconds from the clock measurement to the workers' common start
START_DELAY_S = 0.25
#: seconds to wait for the actors to be placed and answer (runtime_env set up, packages imported)
PLACE_TIMEOUT_S = 180.0
#: seconds a phase may run past its duration (or at all, without one) before its workers are killed
PHASE_GRACE_S = 3600.0
#: threads of an actor: the phase, the driver's asks, the clock
ACTOR_THREADS = 4
#: seconds a worker may take to answer one clock exchange before it counts as lost
CLOCK_TIMEOUT_S = 30.0
#: Ray's setting of the niceness its raylet starts workers at (15 when unset)
NICENESS_ENV = "RAY_worker_niceness"


class RayWorkersError(CaptureError):
    """Ray missing, a cluster not reached, workers not placed: one line, exit code 2."""


def require_ray() -> Any:
    """The ``ray`` module, or a one-line error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise RayWorkersError(f"--ray needs Ray, which is not installed: {RAY_EXTRA}") from None
    return ray


def check_address(address: str) -> str:
    """``local``, ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT``; raises a one-line error otherwise."""
    a = address.strip()
    if a in ("local", "auto"):
        return a
    rest = a[len("ray://"):] if a.startswith("ray://") else a
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in rest:
        raise RayWorkersError(f"--ray {address!r}: expected local, auto, ray://HOST:PORT or HOST:PORT")
    return a


# --- the driver -------------------------------------------------------------------------------


def runtime_env() -> dict[str, Any]:
    """What the actors need to run the driver's code: its ``collectors`` and ``diag`` packages
    (a job's ``runtime_env``: :class:`RayWorkers` passes it to ``ray.init``; a caller that starts
    Ray itself passes it there)."""
    import collectors
    import diag

    return {"py_modules": [str(Path(m.__file__).parent) for m in (collectors, diag)],
            "excludes": ["__pycache__", "*.pyc"]}


def connect(address: str) -> bool:
    """Connect this process to the Ray cluster at ``address`` (``local`` starts one on this
    machine's CPUs) with the probe's :func:`runtime_env`; False when Ray was initialised already
    (used as it is), True when this call connected it. Raises :class:`RayWorkersError` in one
    line. Blocks (seconds: a local start, the runtime_env upload)."""
    ray = require_ray()
    address = check_address(address)
    if ray.is_initialized():
        return False
    try:
        # Ray's own warnings (a SIGTERM handler set only from the main thread, its token
        # authentication) are not the probe's: errors still raise and are said in one line
        common = {"log_to_driver": False, "logging_level": logging.ERROR, "runtime_env": runtime_env()}
        if address == "local":
            # the raylet starts its workers at RAY_worker_niceness (15 by default): a probe there
            # loses the CPU to whatever else runs here (the server beside it) and its timing with it
            before = os.environ.get(NICENESS_ENV)
            os.environ.setdefault(NICENESS_ENV, "0")
            try:
                ray.init(address="local", num_cpus=cpu_count(), include_dashboard=False, **common)
            finally:
                if before is None:
                    os.environ.pop(NICENESS_ENV, None)
        else:
            ray.init(address=address, **common)
    except Exception as exc:
        hint = " (start one with 'ray start --head', or use --ray local)" if address == "auto" else ""
        raise RayWorkersError(f"--ray {address}: no Ray cluster reached{hint}: "
                              f"{one_line(f'{type(exc).__name__}: {exc}')}") from None
    return True


#: actors kept for a run of probe sessions by :func:`kept`, by (address, workers)
_KEPT: dict[tuple[str, int], RayWorkers] = {}


@contextlib.contextmanager
def kept(address: str | None, workers: int) -> Iterator[RayWorkers | None]:
    """Ray joined and ``workers`` actors placed once for a run of probe sessions (a scenario
    matrix: each step its own session): a session with the same ``ray_address`` and ``workers``
    runs its phases on them (:func:`session_workers`) and leaves them up, so no step waits seconds
    for placement after its engine started (an in-process probe is there at once: a cold start's
    first requests must arrive while the model loads). On exit the actors are killed, and Ray shut
    down where this joined it. ``None`` address: nothing kept. Blocks while placing."""
    if address is None:
        yield None
        return
    started = connect(address)
    pool: RayWorkers | None = None
    try:
        pool = RayWorkers(address, workers).start()
        _KEPT[(pool.address, pool.workers)] = pool
        yield pool
    finally:
        if pool is not None:
            _KEPT.pop((pool.address, pool.workers), None)
            pool.close()
        if started:
            require_ray().shutdown()


def session_workers(address: str, workers: int) -> tuple[RayWorkers, bool]:
    """A probe session's actors: those :func:`kept` holds for this address and count (not the
    session's to close), else a new set placed now (the session's); (workers, owned). Blocks."""
    pool = _KEPT.get((check_address(address), max(1, int(workers))))
    if pool is not None:
        return pool, False
    return RayWorkers(address, workers).start(), True


@dataclass
class _Phase:
    """One worker's part of one phase, as the driver collects it."""

    index: int
    actor: Any
    job: WorkerJob
    ref: Any = None
    take_ref: Any = None
    results: dict[str, tuple[Any, str]] = field(default_factory=dict)
    inflight: list[InFlight] = field(default_factory=list)
    payload: dict[str, Any] | None = None
    lost: str | None = None

    def absorb(self, done: list[tuple[Any, str]], inflight: list[InFlight]) -> None:
        for res, span_id in done:
            self.results[res.request_id] = (res, span_id)
        self.inflight = list(inflight)


class RayWorkers:
    """``workers`` probe-worker actors on a Ray cluster, for one probe session: :meth:`start`,
    then :meth:`run_phase` per phase, then :meth:`close`; :meth:`facts` for meta.json."""

    def __init__(self, address: str, workers: int, poll_s: float = POLL_S) -> None:
        self.address = check_address(address)
        self.workers = max(1, int(workers))
        self.poll_s = poll_s
        self._ray: Any = None
        self._started_ray = False
        self.actors: list[Any] = []
        self._info: list[dict[str, Any]] = []
        self._clock_id = clock_id()
        self._cpus_per_worker = 1.0
        self.lost_requests = 0
        #: workers already noted as running above niceness 0
        self._nice_noted: set[int] = set()
        #: set by :meth:`close`: a phase still running (the run interrupted) stops collecting
        self._closing = False

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> RayWorkers:
        """Connect (or start a local Ray; a Ray this process already initialised is used as it is),
        place the actors and learn where they run (blocks)."""
        ray = self._ray = require_ray()
        self._started_ray = connect(self.address)
        cpus = float(ray.cluster_resources().get("CPU", 0.0))
        # one CPU each where the cluster has them; else they share (Ray would leave the rest unplaced)
        self._cpus_per_worker = 1.0 if cpus >= self.workers else max(0.01, int(100 * cpus / self.workers) / 100)
        cls = ray.remote(ProbeWorker).options(num_cpus=self._cpus_per_worker, max_concurrency=ACTOR_THREADS,
                                              max_restarts=0, scheduling_strategy="SPREAD")
        self.actors = [cls.remote(k) for k in range(self.workers)]
        try:
            facts = ray.get([a.facts.remote() for a in self.actors], timeout=PLACE_TIMEOUT_S)
        except Exception as exc:
            self.close()
            why = (f"not placed within {PLACE_TIMEOUT_S:.0f} s (the cluster has {cpus:g} CPUs)"
                   if type(exc).__name__ == "GetTimeoutError" else one_line(f"{type(exc).__name__}: {exc}"))
            raise RayWorkersError(f"--ray {self.address}: the probe's {self.workers} worker actor(s) did not start: "
                                  f"{why}") from None
        self._info = [{"index": k, **{n: v for n, v in f.items() if n != "clock_id"},
                       "same_clock": f["clock_id"] == self._clock_id, "state": "ok", "clock": None, "clock_measurements": 0}
                      for k, f in enumerate(facts)]
        return self

    def close(self) -> None:
        """Kill the actors; shut Ray down where :meth:`start` started or connected it (blocks)."""
        ray = self._ray
        self._closing = True
        if ray is None:
            return
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.actors = []
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False

    def facts(self) -> dict[str, Any]:
        """meta.json ``probe.ray``: the cluster, each worker (node, host, clock, state) and the
        requests marked ``worker_lost``."""
        ray = self._ray
        return {
            "address": self.address,
            "ray_version": getattr(ray, "__version__", None),
            "driver_host": socket.gethostname(),
            "nodes": len({i.get("node_id") for i in self._info}),
            "cpus_per_worker": self._cpus_per_worker,
            "clock_alignment": "each worker shifts its own timestamps by its measured offset to the driver "
                               "(worker minus driver, the shortest of several round trips, +- half of it) "
                               "before they come back; zero where it shares the driver's clock (same kernel)",
            "workers": [dict(i) for i in self._info],
            "lost_requests": self.lost_requests,
        }

    # --- one phase ------------------------------------------------------------------------------

    def _clock(self, k: int) -> int:
        """Measure worker ``k``'s offset; returns the offset to apply (0 on the driver's clock)."""
        off = measure(lambda: self._ray.get(self.actors[k].now_ns.remote(), timeout=CLOCK_TIMEOUT_S))
        info = self._info[k]
        applied = 0 if info["same_clock"] else off.offset_ns
        info["clock"] = {**off.to_dict(), "applied_ns": applied}
        info["clock_measurements"] += 1
        return applied

    def _files(self, job: WorkerJob) -> dict[str, bytes]:
        paths = [job.tokenizer_path, getattr(job.workload_spec, "prompts_file", None)]
        out = {}
        for p in paths:
            if p:
                q = Path(p) / "tokenizer.json" if Path(p).is_dir() else Path(p)
                out[p] = q.read_bytes()
        return out

    def run_phase(self, endpoint: Any, client_kwargs: dict[str, Any], workload: Any, load: LoadSpec,
                  segment: str | None, trace: bool = True, otlp_endpoint: str | None = None,
                  on_progress: Callable[[int, int | None], None] | None = None) -> PhaseOutcome:
        """Run one phase split over the live actors and merge what comes back (blocks; see the
        module doc for clocks and lost workers). ``on_progress(measured done, total)`` is called
        from this thread after each ask."""
        ray = self._ray
        offsets: dict[int, int] = {}
        notes = []
        for k, info in enumerate(self._info):
            if info["state"] != "ok":
                continue
            try:
                offsets[k] = self._clock(k)
            except Exception as exc:  # gone since the last phase: nothing of this phase was on it
                why = one_line(f"{type(exc).__name__}: {exc}", 160)
                info["state"] = "lost"
                info["lost"] = {"segment": segment, "why": why, "results_received": 0, "in_flight_marked": 0,
                                "unaccounted": 0, "at_unix_s": time.time()}
                notes.append(f"worker {k} (host {info.get('host')}) was lost before this phase ({why}); the phase "
                             "runs on the workers left")
        live = sorted(offsets)
        if not live:
            raise RayWorkersError("every Ray worker of this probe was lost: none is left to run the next phase")
        jobs = worker_jobs(len(live), endpoint, client_kwargs, workload, load, segment, trace, None, otlp_endpoint)
        parts = [_Phase(live[j], self.actors[live[j]], replace(job, index=live[j])) for j, job in enumerate(jobs)]
        files = self._files(parts[0].job)
        start_at = time.time_ns() + int(START_DELAY_S * 1e9)
        for p in parts:
            p.ref = p.actor.run.remote(RayJob(p.job, start_at, offsets[p.index], files))
        deadline = time.monotonic() + (load.duration_s or 0.0) + PHASE_GRACE_S
        running = list(parts)
        while running:
            ray.wait([p.ref for p in running], num_returns=len(running), timeout=self.poll_s)
            for p in list(running):
                if not ray.wait([p.ref], timeout=0)[1]:
                    running.remove(p)
                    try:
                        p.payload = ray.get(p.ref)
                    except Exception as exc:
                        p.lost = one_line(f"{type(exc).__name__}: {exc}", 160)
            for p in running:
                self._ask(p)
            if on_progress is not None:
                on_progress(sum(1 for p in parts for r, _ in p.results.values() if not r.warmup), load.bounded_requests)
            if running and self._closing:  # the run was interrupted and its workers are being killed
                for p in running:
                    p.lost = "the probe was stopped"
                break
            if running and time.monotonic() > deadline:
                for p in running:
                    ray.kill(p.actor, no_restart=True)
                    p.lost = f"did not finish within {(load.duration_s or 0.0) + PHASE_GRACE_S:.0f} s; killed"
                running = []
        outcome = self._merge(parts, endpoint)
        outcome.notes[:0] = notes
        return outcome

    def _ask(self, p: _Phase, wait_s: float = 0.0) -> None:
        """Collect worker ``p``'s pending answer when it is in, and ask again (one ask in flight)."""
        ray = self._ray
        if p.take_ref is not None:
            if ray.wait([p.take_ref], timeout=wait_s)[1]:
                return  # not answered yet: kept, collected later (what it took is in it)
            try:
                p.absorb(*ray.get(p.take_ref))
            except Exception:
                pass  # the worker is going: its run's answer says so
            p.take_ref = None
        if p.payload is None and p.lost is None:
            p.take_ref = p.actor.take.remote()

    def _merge(self, parts: list[_Phase], endpoint: Any) -> PhaseOutcome:
        """One outcome from the parts: a worker that ended well gives what it sent; a lost or failed
        one its results so far, its in-flight requests as ``worker_lost``, stand-in spans and a note."""
        ray = self._ray
        out = PhaseOutcome()
        starts, ends = [], []
        for p in parts:
            if p.take_ref is not None:  # an ask answered after the run ended still holds results
                self._ask(p, wait_s=30.0 if p.lost is None else 1.0)
            pay = p.payload or {}
            if p.payload is not None:
                p.absorb(pay.get("done", []), pay.get("inflight", []))
            info = self._info[p.index]
            error = pay.get("error")
            if p.lost is None and error is None:
                out.results.extend(r for r, _ in p.results.values())
                out.health.extend(HealthSamples.from_dict(h) for h in pay.get("health", []))
                out.span_lines.extend(pay.get("span_lines", []))
                if pay.get("start_ns"):
                    starts.append(pay["start_ns"])
                    ends.append(pay["end_ns"])
                nice = info["nice"] = pay.get("nice", info.get("nice"))  # its phase loop's
                if nice and p.index not in self._nice_noted:  # its timing yields to the rest of its node
                    self._nice_noted.add(p.index)
                    out.notes.append(
                        f"worker {p.index} (host {info.get('host')}) ran at niceness {nice} (Ray's workers start at "
                        f"{info.get('nice_at_start')}, and it may not lower it): anything else on its node takes the CPU "
                        f"first and its timing suffers; start that node's Ray with {NICENESS_ENV}=0")
                try:
                    after = measure(lambda: ray.get(p.actor.now_ns.remote(), timeout=CLOCK_TIMEOUT_S), n=4)
                    info["clock_after"] = after.to_dict()
                except Exception:
                    pass
                continue
            why = p.lost or f"failed: {error}"
            if p.lost is not None:
                info["state"] = "lost"
            where = f"worker {p.index} (host {info.get('host')}, node {str(info.get('node_id'))[:12]})"
            seen = set(p.results)
            detail = f"{where} lost with this request in flight ({why}); its outcome never reached the driver"
            marked = [(lost_result(e, detail), e.span_id) for e in p.inflight if e.request_id not in seen]
            share = p.job.load
            expected = None if share.bounded_requests is None else share.bounded_requests + share.warmup_requests
            unaccounted = None if expected is None else max(0, expected - len(seen) - len(marked))
            got = list(p.results.values())
            out.results.extend(r for r, _ in got)
            out.results.extend(r for r, _ in marked)
            out.span_lines.extend(stand_in_span_lines(got + marked, endpoint.api, endpoint.model))
            self.lost_requests += len(marked)
            # a lost worker's record; a failed one (its phase raised, the actor alive) keeps working
            info["lost" if p.lost else "failed"] = {"segment": p.job.segment, "why": why, "results_received": len(seen),
                                                    "in_flight_marked": len(marked), "unaccounted": unaccounted,
                                                    "at_unix_s": time.time()}
            out.notes.append(
                f"{where} {'was lost' if p.lost else 'failed'} ({why}): {len(seen)} results came back, "
                f"{len(marked)} request(s) in flight marked worker_lost"
                + (f", {unaccounted} more of its share never reported (not sent, or sent after the driver last "
                   f"heard from it)" if unaccounted else "")
                + ("; the next phases run on the workers left" if p.lost else ""))
        out.start_ns = min(starts) if starts else time.time_ns()
        out.end_ns = max(ends) if ends else out.start_ns
        return out


__all__ = ["POLL_S", "RAY_EXTRA", "ProbeWorker", "RayJob", "RayWorkers", "RayWorkersError", "check_address",
           "connect", "kept", "require_ray", "runtime_env", "session_workers"]
