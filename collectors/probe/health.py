"""Client health while probing: is the load generator itself the bottleneck?

:class:`HealthMonitor` runs as a task on the probe's event loop. Every ``interval_s``
(default 50 ms) it measures

* event-loop lag: how late its own ``asyncio.sleep`` woke up (s) — the delay any SSE chunk
  arriving at that moment would also have suffered before being timestamped;
* client CPU: the CPU time of the loop's own thread (``time.thread_time``) over wall time,
  in % of one core — the thread that parses every chunk. Thread time, not process time, so
  that a server running in the same process (tests, scenarios) does not count as client load.

Connection-pool waits come from the client's results (``conn_wait_s``). :func:`summarize`
turns the samples into meta.json's ``client_health`` with a ``saturated`` verdict; when it is
true the rules refuse to blame the server.

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
from diag import stages

#: Saturation thresholds (client_health.thresholds in meta.json).
LOOP_STALL_FRAC_LIMIT = 0.15  # share of wall time the event loop ran late (a sustained stall)
CPU_PCT_P90_LIMIT = 90.0
CONN_WAIT_P99_LIMIT_S = 0.005


@dataclass
class HealthSamples:
    """Raw samples: Unix seconds and values (lag in s, CPU in % of one core)."""

    entity: str = ""
    ts_s: list[float] = field(default_factory=list)
    lag_s: list[float] = field(default_factory=list)
    cpu_pct: list[float] = field(default_factory=list)
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
        self.cpu_s += other.cpu_s
        self.wall_s += other.wall_s
        self.machine_busy_s += other.machine_busy_s
        self.machine_total_s += other.machine_total_s

    def to_frame(self) -> pd.DataFrame:
        """Long-format rows (source="client") for CaptureWriter.write_series."""
        n = len(self.ts_s)
        return pd.DataFrame(
            {
                "ts_s": self.ts_s + self.ts_s,
                "source": ["client"] * (2 * n),
                "series": [stages.SERIES_LOOP_LAG_S] * n + [stages.SERIES_CLIENT_CPU_PCT] * n,
                "entity": [self.entity] * (2 * n),
                "value": self.lag_s + self.cpu_pct,
            }
        )

    def to_dict(self) -> dict[str, Any]:
        return {"entity": self.entity, "ts_s": self.ts_s, "lag_s": self.lag_s, "cpu_pct": self.cpu_pct,
                "cpu_s": self.cpu_s, "wall_s": self.wall_s, "machine_busy_s": self.machine_busy_s,
                "machine_total_s": self.machine_total_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HealthSamples:
        return cls(d.get("entity", ""), list(d["ts_s"]), list(d["lag_s"]), list(d["cpu_pct"]),
                   float(d.get("cpu_s", 0.0)), float(d.get("wall_s", 0.0)),
                   float(d.get("machine_busy_s", 0.0)), float(d.get("machine_total_s", 0.0)))


class HealthMonitor:
    """Samples loop lag and process CPU on the running loop every ``interval_s`` seconds."""

    def __init__(self, interval_s: float = 0.05, entity: str = "") -> None:
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
        while True:
            target = time.perf_counter() + interval
            await asyncio.sleep(interval)
            now = time.perf_counter()
            cpu = time.thread_time()
            wall = now - last_wall
            s.ts_s.append(time.time())
            s.lag_s.append(max(0.0, now - target))
            s.cpu_pct.append(100.0 * (cpu - last_cpu) / wall if wall > 0 else 0.0)
            last_wall, last_cpu = now, cpu


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


def summarize(samples: Sequence[HealthSamples], conn_waits_s: Iterable[float] = ()) -> dict[str, Any]:
    """meta.json's ``client_health``: lag and CPU figures and the ``saturated`` verdict.

    Saturated when the event loop was stalled for >= 15 % of the wall time (the sum of its
    lateness over the time sampled: a sustained stall, not one OS-scheduling hiccup), or CPU
    p90 >= 90 % of one core (a Python client cannot use more), or the connection-pool wait
    p99 > 5 ms; ``reason`` says which.
    """
    lag = np.asarray([v for s in samples for v in s.lag_s], dtype="float64")
    cpu = np.asarray([v for s in samples for v in s.cpu_pct], dtype="float64")
    waits = np.asarray(list(conn_waits_s), dtype="float64")
    out: dict[str, Any] = {
        "samples": int(lag.size),
        "processes": len(samples),
        "loop_lag_p50_s": float(np.percentile(lag, 50)) if lag.size else None,
        "loop_lag_p99_s": float(np.percentile(lag, 99)) if lag.size else None,
        "loop_lag_max_s": float(lag.max()) if lag.size else None,
        "loop_stall_frac": loop_stall_fraction(samples),
        "cpu_pct_mean": float(cpu.mean()) if cpu.size else None,
        "cpu_pct_p90": float(np.percentile(cpu, 90)) if cpu.size else None,
        "cpu_pct_max": float(cpu.max()) if cpu.size else None,
        "conn_wait_p99_s": float(np.percentile(waits, 99)) if waits.size else None,
        "conn_wait_max_s": float(waits.max()) if waits.size else None,
        "thresholds": {
            "loop_stall_frac": LOOP_STALL_FRAC_LIMIT,
            "cpu_pct_p90": CPU_PCT_P90_LIMIT,
            "conn_wait_p99_s": CONN_WAIT_P99_LIMIT_S,
        },
    }
    reasons = []
    if out["loop_stall_frac"] is not None and out["loop_stall_frac"] >= LOOP_STALL_FRAC_LIMIT:
        reasons.append(f"event loop stalled {out['loop_stall_frac']:.0%} of the time >= {LOOP_STALL_FRAC_LIMIT:.0%} "
                       f"(lag p99 {out['loop_lag_p99_s'] * 1e3:.1f} ms)")
    if out["cpu_pct_p90"] is not None and out["cpu_pct_p90"] >= CPU_PCT_P90_LIMIT:
        reasons.append(f"client CPU p90 {out['cpu_pct_p90']:.0f}% of one core >= {CPU_PCT_P90_LIMIT:.0f}%")
    if out["conn_wait_p99_s"] is not None and out["conn_wait_p99_s"] > CONN_WAIT_P99_LIMIT_S:
        reasons.append(f"connection-pool wait p99 {out['conn_wait_p99_s'] * 1e3:.1f} ms > {CONN_WAIT_P99_LIMIT_S * 1e3:.0f} ms")
    out["saturated"] = bool(reasons)
    out["reason"] = "; ".join(reasons) if reasons else (
        "client healthy: loop lag, CPU and pool waits under their limits" if lag.size else "no health samples")
    if reasons:
        out["reason"] += " — client-side delay inflates measured TTFT; use --workers N or a lower load"
    return out
