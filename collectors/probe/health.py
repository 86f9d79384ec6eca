"""Client health while probing: is the load generator itself the bottleneck?

:class:`HealthMonitor` runs as a task on the probe's event loop. Every ``interval_s``
(default 10 ms) it measures

* event-loop lag: how late its own ``asyncio.sleep`` woke up (s) — the delay any SSE chunk
  arriving at that moment would also have suffered before being timestamped;
* client CPU: the CPU time of the loop's own thread (``time.thread_time``) over wall time,
  in % of one core — the thread that parses every chunk. Thread time, not process time, so
  that a server running in the same process (tests, scenarios) does not count as client load;
* starved: the part of the lag the machine caused (s; NaN where the OS does not say): the loop
  thread's run-queue wait over the sample (runnable but given no CPU, Linux
  ``/proc/thread-self/schedstat``), never the loop's own CPU time, and less the share of the
  sample the client's other threads were on a CPU (then they, the client's own work, took the
  CPU the loop waited for) (:func:`starved_part_s`). Every CPU busy with the server beside the
  probe is the machine's doing, not the client's.

A stall is seen only when one of the monitor's ticks falls due inside it (its lag then runs from
that tick to the loop's wake), so the interval is short against the stalls that matter: at 50 ms
a client whose loop waited 50 ms for the GIL at every wake-up showed stalls covering 12 % of its
TTFT, at 10 ms 27 % (the catalogue's loadgen scenario; its server-side TTFT was a sixth of the
client's). A tick takes about 15 us of the loop's time (0.2 % of a core at 100 a second).

Connection-pool waits come from the client's results (``conn_wait_s``). :func:`summarize`
turns the samples into meta.json's ``client_health`` with a ``saturated`` verdict, judging the
lag by the stalls under way at the measured requests' sends and first tokens
(:mod:`diag.ground.client_lag`): a stall while nothing waited for a first token delays nothing.

Threading: start/stop from the loop's thread; the monitor only touches its own lists.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from collectors.probe.affinity import machine_cpu_s
from collectors.probe.eventloop import being_cancelled
from diag.ground import client_lag, stages

#: Saturation thresholds (client_health.thresholds in meta.json).
LOOP_STALL_FRAC_LIMIT = 0.15  # share of wall time the event loop ran late (a sustained stall; without requests)
#: the client's loop stalls under way at the measured requests' sends and first tokens, over their TTFT
FIRST_TOKEN_SHARE_LIMIT = 0.20
CPU_PCT_P90_LIMIT = 90.0
CONN_WAIT_P99_LIMIT_S = 0.005
_SCHEDSTAT = "/proc/thread-self/schedstat"


def runq_wait_s() -> float | None:
    """Seconds the calling thread has waited runnable for a CPU since it started (Linux
    schedstat's second field), or None where the OS does not say."""
    try:
        with open(_SCHEDSTAT, "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class HealthSamples:
    """Raw samples: Unix seconds and values (lag in s, CPU in % of one core)."""

    entity: str = ""
    ts_s: list[float] = field(default_factory=list)
    lag_s: list[float] = field(default_factory=list)
    cpu_pct: list[float] = field(default_factory=list)
    #: the part of each sample's lag the machine caused (s; NaN where unmeasured)
    starved_s: list[float] = field(default_factory=list)
    #: from the monitor's start to its stop: the loop thread's CPU s, wall s, and the whole
    #: machine's busy and total CPU s (/proc/stat; 0 where there is none)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    machine_busy_s: float = 0.0
    machine_total_s: float = 0.0

    def extend(self, other: HealthSamples) -> None:
        self.ts_s.extend(other.ts_s)
        self.lag_s.extend(other.lag_s)
        self.cpu_pct.extend(other.cpu_pct)
        self.starved_s.extend(other.starved_s)
        self.cpu_s += other.cpu_s
        self.wall_s += other.wall_s
        self.machine_busy_s += other.machine_busy_s
        self.machine_total_s += other.machine_total_s

    def to_frame(self) -> pd.DataFrame:
        """Long-format rows (source="client") for CaptureWriter.write_series: lag and CPU, and the
        machine's part of the lag where it was measured."""
        n = len(self.ts_s)
        starved = [(t, v) for t, v in zip(self.ts_s, self.starved_s) if v == v]  # NaN: unmeasured
        return pd.DataFrame(
            {
                "ts_s": self.ts_s + self.ts_s + [t for t, _ in starved],
                "source": ["client"] * (2 * n + len(starved)),
                "series": ([stages.SERIES_LOOP_LAG_S] * n + [stages.SERIES_CLIENT_CPU_PCT] * n
                           + [stages.SERIES_LOOP_STARVED_S] * len(starved)),
                "entity": [self.entity] * (2 * n + len(starved)),
                "value": self.lag_s + self.cpu_pct + [v for _, v in starved],
            }
        )

    def stalls(self) -> client_lag.Stalls:
        """These samples as the loop's stalls (:mod:`diag.ground.client_lag`)."""
        return client_lag.stalls_of(self.ts_s, self.lag_s,
                                    self.starved_s if len(self.starved_s) == len(self.ts_s) else None)

    def to_dict(self) -> dict[str, Any]:
        return {"entity": self.entity, "ts_s": self.ts_s, "lag_s": self.lag_s, "cpu_pct": self.cpu_pct,
                "starved_s": self.starved_s, "cpu_s": self.cpu_s, "wall_s": self.wall_s,
                "machine_busy_s": self.machine_busy_s, "machine_total_s": self.machine_total_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HealthSamples:
        return cls(d.get("entity", ""), list(d["ts_s"]), list(d["lag_s"]), list(d["cpu_pct"]),
                   list(d.get("starved_s") or []), float(d.get("cpu_s", 0.0)), float(d.get("wall_s", 0.0)),
                   float(d.get("machine_busy_s", 0.0)), float(d.get("machine_total_s", 0.0)))


def starved_part_s(lag_s: float, runq_s: float | None, loop_cpu_s: float, others_cpu_s: float, wall_s: float) -> float:
    """The part of one sample's ``lag_s`` the machine caused: the loop thread's run-queue wait
    ``runq_s``, at most the lag less the loop's own CPU time in the sample (``loop_cpu_s``: its own
    work is its own, however long the machine made it take), less the share of the sample's
    ``wall_s`` the process's other threads were on a CPU (``others_cpu_s``: the client's own
    threads took it). NaN when ``runq_s`` is None (not measured)."""
    if runq_s is None:
        return float("nan")
    own_busy = min(1.0, max(0.0, others_cpu_s) / wall_s) if wall_s > 0 else 0.0
    return min(max(runq_s, 0.0), max(0.0, lag_s - max(0.0, loop_cpu_s))) * (1.0 - own_busy)


class HealthMonitor:
    """Samples loop lag, the loop thread's CPU and the machine's part of the lag on the running
    loop every ``interval_s`` seconds."""

    def __init__(self, interval_s: float = 0.01, entity: str = "") -> None:
        self.interval_s = interval_s
        self.samples = HealthSamples(entity)
        self._task: asyncio.Task[None] | None = None
        self._t0: tuple[float, float, tuple[float, float] | None] | None = None

    def start(self) -> None:
        """Start sampling (call from the loop's thread, with the loop running)."""
        if self._task is None:
            self._t0 = (time.thread_time(), time.perf_counter(), machine_cpu_s())
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> HealthSamples:
        """Stop sampling (loop thread); the totals since :meth:`start` go on the samples."""
        interrupted = False
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                interrupted = being_cancelled()  # ours (Ctrl-C), not only the sampler's: raised below
            self._task = None
        if self._t0 is not None:
            cpu0, wall0, mach0 = self._t0
            self._t0 = None
            s = self.samples
            s.cpu_s += time.thread_time() - cpu0
            s.wall_s += time.perf_counter() - wall0
            mach1 = machine_cpu_s()
            if mach0 is not None and mach1 is not None:
                s.machine_busy_s += mach1[0] - mach0[0]
                s.machine_total_s += mach1[1] - mach0[1]
        if interrupted:
            raise asyncio.CancelledError
        return self.samples

    async def _run(self) -> None:
        s = self.samples
        interval = self.interval_s
        last_wall = time.perf_counter()
        last_cpu = time.thread_time()
        last_proc = time.process_time()
        last_rq = runq_wait_s()
        target = time.perf_counter() + interval
        while True:
            await asyncio.sleep(max(0.0, target - time.perf_counter()))
            now = time.perf_counter()
            cpu = time.thread_time()
            proc = time.process_time()
            rq = runq_wait_s()
            wall = now - last_wall
            lag = max(0.0, now - target)
            s.ts_s.append(time.time())
            s.lag_s.append(lag)
            s.cpu_pct.append(100.0 * (cpu - last_cpu) / wall if wall > 0 else 0.0)
            s.starved_s.append(starved_part_s(lag, rq - last_rq if rq is not None and last_rq is not None else None,
                                              cpu - last_cpu, (proc - last_proc) - (cpu - last_cpu), wall))
            last_wall, last_cpu, last_proc, last_rq = now, cpu, proc, rq
            # the next tick is due one interval after this wake, not after this bookkeeping: time the
            # loop loses here (a thread taking the GIL at the /proc read) counts in the next lag
            target = now + interval


def loop_stall_fraction(samples: Sequence[HealthSamples]) -> float | None:
    """Share of the sampled wall time the event loop ran late: sum of lateness / time covered."""
    stalled = covered = 0.0
    for s in samples:
        if len(s.ts_s) >= 2:
            stalled += float(sum(s.lag_s[1:]))
            covered += float(s.ts_s[-1] - s.ts_s[0])
    return min(1.0, stalled / covered) if covered > 0 else None


#: The client "took CPU the server needed" when the server is on this machine, the machine was
#: this busy over the run (share of all its CPUs), and the client's own share of it was this high.
MACHINE_BUSY_FRAC_LIMIT = 0.9
CLIENT_MACHINE_SHARE_LIMIT = 0.05
_LOOPBACK = ("127.", "localhost", "[::1]", "::1", "0.0.0.0")


def server_is_local(base_url: str | None) -> bool:
    """Whether the server URL names this machine (loopback or this host's name)."""
    if not base_url:
        return False
    from urllib.parse import urlsplit
    import socket

    host = (urlsplit(base_url if "://" in base_url else "http://" + base_url).hostname or "").lower()
    return host.startswith(_LOOPBACK) or host in ("::1",) or host == socket.gethostname().lower()


def client_cpu(samples: Sequence[HealthSamples], requests: int | None = None, chunks: int | None = None,
               server_local: bool = False, pinned: Sequence[int] | None = None) -> dict[str, Any]:
    """The client's own CPU (its loop threads) per request and per streamed chunk, set against the
    machine's: ``took_server_cpu`` (with a one-line ``note``) when the server shares this machine,
    the machine had no CPU to spare (>= 90 % busy) and the client used >= 5 % of it."""
    cpu_s = float(sum(s.cpu_s for s in samples))
    wall = max((s for s in samples), key=lambda s: s.machine_total_s, default=None)
    busy_frac = share = None
    if wall is not None and wall.machine_total_s > 0:
        busy_frac = wall.machine_busy_s / wall.machine_total_s
        share = min(1.0, cpu_s / wall.machine_total_s)
    out: dict[str, Any] = {
        "cpu_s": cpu_s,
        "cpu_ms_per_request": cpu_s / requests * 1e3 if requests else None,
        "cpu_us_per_chunk": cpu_s / chunks * 1e6 if chunks else None,
        "machine_busy_frac": busy_frac,
        "client_machine_share": share,
        "machine_cpus": os.cpu_count(),
        "pinned_cpus": list(pinned) if pinned else None,
        "server_local": server_local,
        "took_server_cpu": False,
        "note": None,
    }
    if (server_local and busy_frac is not None and share is not None
            and busy_frac >= MACHINE_BUSY_FRAC_LIMIT and share >= CLIENT_MACHINE_SHARE_LIMIT):
        out["took_server_cpu"] = True
        where = (f"pinned to CPU(s) {','.join(map(str, pinned))}: they may be the engine's too"
                 if pinned else "pin it off the engine's cores with --cpus LIST (and the engine with taskset)")
        out["note"] = (f"the client used {share:.0%} of this machine's {os.cpu_count()} CPUs "
                       f"({out['cpu_us_per_chunk'] or 0:.0f} us per chunk) while the server shares the machine "
                       f"and it was {busy_frac:.0%} busy: CPU the server needed, which can slow its steps; "
                       f"{where}, or probe from another machine")
    return out


def connection_retries(retries: Iterable[int], lost_s: Iterable[float] = ()) -> dict[str, Any]:
    """meta.json's ``client_health.connection_retries``: requests the client sent once more on a
    fresh connection because the reused one was closed before any response byte (the server's
    idle keep-alive timeout crossing the request); client-side, not server failures. ``lost_s_max``
    is the longest time lost on a dead connection (s)."""
    counts = [int(r) for r in retries]
    lost = [float(x) for x in lost_s if x]
    n = sum(counts)
    return {"retried": n, "requests": len(counts), "lost_s_max": max(lost) if lost else None,
            "note": (f"{n} request(s) found their pooled keep-alive connection closed by the server before any "
                     "answer and were sent again on a fresh connection (counted here, not as failures)")
            if n else None}


def summarize(samples: Sequence[HealthSamples], conn_waits_s: Iterable[float] = (),
              ttft_windows_s: tuple[Sequence[float], Sequence[float]] | None = None) -> dict[str, Any]:
    """meta.json's ``client_health``: lag and CPU figures and the ``saturated`` verdict.

    ``ttft_windows_s`` are the measured requests' (sends, first-content reads), Unix seconds: with
    them the lag is judged where it could inflate TTFT (:func:`diag.ground.client_lag.first_token_lag`,
    ``first_token`` in the result): saturated when the stalls under way at the sends and first
    tokens add up to >= 20 % of the requests' TTFT; ``machine_starved`` when most of that was the
    machine's doing (the loop given no CPU while every CPU was busy), not the client's own work.
    Without them, when the event loop was stalled for >= 15 % of the wall time (the sum of its
    lateness over the time sampled). Also saturated when CPU p90 >= 90 % of one core (a Python
    client cannot use more), or the connection-pool wait p99 > 5 ms (inside TTFT); ``reason``
    says which. ``processes`` counts the client processes sampled (their entities), ``segments``
    the monitored stretches.
    """
    lag = np.asarray([v for s in samples for v in s.lag_s], dtype="float64")
    cpu = np.asarray([v for s in samples for v in s.cpu_pct], dtype="float64")
    waits = np.asarray(list(conn_waits_s), dtype="float64")
    out: dict[str, Any] = {
        "samples": int(lag.size),
        "processes": len({s.entity for s in samples}),
        "segments": len(samples),
        "loop_lag_p50_s": float(np.percentile(lag, 50)) if lag.size else None,
        "loop_lag_p99_s": float(np.percentile(lag, 99)) if lag.size else None,
        "loop_lag_max_s": float(lag.max()) if lag.size else None,
        "loop_stall_frac": loop_stall_fraction(samples),
        "cpu_pct_mean": float(cpu.mean()) if cpu.size else None,
        "cpu_pct_p90": float(np.percentile(cpu, 90)) if cpu.size else None,
        "cpu_pct_max": float(cpu.max()) if cpu.size else None,
        "conn_wait_p99_s": float(np.percentile(waits, 99)) if waits.size else None,
        "conn_wait_max_s": float(waits.max()) if waits.size else None,
        "first_token": None,
        "thresholds": {
            "loop_stall_frac": LOOP_STALL_FRAC_LIMIT,
            "first_token_share": FIRST_TOKEN_SHARE_LIMIT,
            "cpu_pct_p90": CPU_PCT_P90_LIMIT,
            "conn_wait_p99_s": CONN_WAIT_P99_LIMIT_S,
        },
    }
    reasons = []
    ft = None
    if ttft_windows_s is not None and len(ttft_windows_s[0]) and lag.size:
        by_entity: dict[str, HealthSamples] = {}
        for smp in samples:
            by_entity.setdefault(smp.entity, HealthSamples(smp.entity)).extend(smp)
        ft = client_lag.first_token_lag([h.stalls() for h in by_entity.values()], *ttft_windows_s)
        out["first_token"] = ft
    out["machine_starved"] = False
    if ft is not None and ft["share"] is not None:
        if ft["share"] >= FIRST_TOKEN_SHARE_LIMIT:
            machine = (ft["starved_share"] or 0.0) > (ft["own_share"] or 0.0)
            out["machine_starved"] = machine
            whose = (f"the machine's doing ({ft['starved_share']:.0%}: its loop got no CPU while every CPU was busy, "
                     "e.g. with the server on this machine), not the client's own work" if machine
                     else f"the client's own ({ft['own_share']:.0%})")
            reasons.append(f"event-loop stalls at the requests' sends and first tokens could add {ft['share']:.0%} to "
                           f"their TTFT >= {FIRST_TOKEN_SHARE_LIMIT:.0%}, {whose} (lag p99 "
                           f"{(ft['lag_p99_s'] or 0.0) * 1e3:.1f} ms while requests waited)")
    elif out["loop_stall_frac"] is not None and out["loop_stall_frac"] >= LOOP_STALL_FRAC_LIMIT:
        reasons.append(f"event loop stalled {out['loop_stall_frac']:.0%} of the time >= {LOOP_STALL_FRAC_LIMIT:.0%} "
                       f"(lag p99 {out['loop_lag_p99_s'] * 1e3:.1f} ms)")
    if out["cpu_pct_p90"] is not None and out["cpu_pct_p90"] >= CPU_PCT_P90_LIMIT:
        reasons.append(f"client CPU p90 {out['cpu_pct_p90']:.0f}% of one core >= {CPU_PCT_P90_LIMIT:.0f}%")
    if out["conn_wait_p99_s"] is not None and out["conn_wait_p99_s"] > CONN_WAIT_P99_LIMIT_S:
        reasons.append(f"connection-pool wait p99 {out['conn_wait_p99_s'] * 1e3:.1f} ms > {CONN_WAIT_P99_LIMIT_S * 1e3:.0f} ms")
    out["saturated"] = bool(reasons)
    out["reason"] = "; ".join(reasons) if reasons else (
        "client healthy: loop lag, CPU and pool waits under their limits" if lag.size else "no health samples")
    if out["machine_starved"] and len(reasons) == 1:
        out["reason"] += (" — client-side delay inflates measured TTFT; probe from another machine, or pin the server "
                          "and the probe to CPUs of their own (--cpus)")
    elif reasons:
        out["reason"] += " — client-side delay inflates measured TTFT; use --workers N or a lower load"
    return out
