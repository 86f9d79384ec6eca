"""The probe worker as a Ray actor: what runs on a Ray node for ``ttft probe URL --ray ADDRESS``.

:class:`ProbeWorker` (made remote by :class:`~collectors.probe.ray_workers.RayWorkers`) runs its
share of a phase (:class:`RayJob`) on a new event loop in the calling thread, with the driver's
clock offset applied to every timestamp, and hands back finished results and the requests in
flight when asked (:meth:`ProbeWorker.take`, from another of the actor's threads).
:func:`raise_priority` undoes Ray's niceness for the actor's threads. Times are Unix ns.
"""

from __future__ import annotations

import os
import platform
import socket
import tempfile
import time
from dataclasses import dataclass, field, replace
from hashlib import sha256
from pathlib import Path
from typing import Any

from collectors.probe.clock_sync import clock_id
from collectors.probe.inflight import InFlight, InFlightTracker
from collectors.probe.load import WorkerJob, run_worker


def one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line, white space folded, cut to ``limit`` characters with an ellipsis."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def raise_priority() -> tuple[int | None, int | None]:
    """Put every thread of this process at niceness 0 where it is above (Ray starts its workers
    at 15: a load generator that yields the CPU to everything else on its node measures that,
    not the server). Lowering niceness needs root, CAP_SYS_NICE or RLIMIT_NICE; where it is not
    allowed the threads keep theirs. Returns the calling thread's niceness (before, after); None
    where it cannot be read. Linux nices threads one by one (/proc/self/task); elsewhere the
    calling thread's process. Any thread."""
    try:
        was = os.getpriority(os.PRIO_PROCESS, 0)
    except (OSError, AttributeError):
        return None, None
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > 0:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
        except OSError:
            pass  # not allowed, or the thread ended
    return was, os.getpriority(os.PRIO_PROCESS, 0)


@dataclass
class RayJob:
    """One actor's share of a phase: the process worker's job, the common start (driver Unix ns),
    the clock offset to apply (worker minus driver, ns) and files the job names, by path."""

    job: WorkerJob
    start_at_ns: int
    offset_ns: int
    files: dict[str, bytes] = field(default_factory=dict)


class ProbeWorker:
    """A probe worker as a Ray actor (made remote by :class:`RayWorkers`; see the module doc)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._tracker = InFlightTracker()
        self._dir: str | None = None

    def facts(self) -> dict[str, Any]:
        """Where this actor runs: Ray node id, host, pid, clock id, Python, and its niceness as Ray
        started it and after :func:`raise_priority`."""
        import ray

        was, now = raise_priority()
        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": os.getpid(),
                "clock_id": clock_id(), "python": platform.python_version(), "nice_at_start": was, "nice": now}

    def now_ns(self) -> int:
        """This actor's Unix clock (ns)."""
        return time.time_ns()

    def take(self) -> tuple[list[tuple[Any, str]], list[InFlight]]:
        """Results finished since the last ask, and the requests in flight now."""
        return self._tracker.take()

    def _local(self, path: str | None, files: dict[str, bytes]) -> str | None:
        """The job's file ``path`` as written here (from ``files``), else ``path`` itself."""
        if path is None or path not in files:
            return path
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="ttft-ray-worker-")
        data = files[path]  # a tokenizer directory's tokenizer.json comes as a file of the directory's name
        local = Path(self._dir) / sha256(data).hexdigest()[:16] / (Path(path).name or "file")
        if not local.exists():
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(data)
        return str(local)

    def run(self, rjob: RayJob) -> dict[str, Any]:
        """Run the share on a new event loop in this thread; returns what :meth:`take` has not
        handed on yet, the health samples, the spans and the phase's bounds (driver's clock)."""
        tracker = self._tracker = InFlightTracker()
        _, nice = raise_priority()  # threads Ray made since facts(); the health monitor inherits this one's
        job = rjob.job
        spec = job.workload_spec
        if getattr(spec, "prompts_file", None):
            spec = replace(spec, prompts_file=self._local(spec.prompts_file, rjob.files))
        job = replace(job, tokenizer_path=self._local(job.tokenizer_path, rjob.files), workload_spec=spec, cpus=None)
        offset = rjob.offset_ns

        def wait_start() -> None:
            delay_s = (rjob.start_at_ns + offset - time.time_ns()) / 1e9
            if delay_s > 0:
                time.sleep(delay_s)

        def on_client(client: Any) -> None:
            client.offset_ns -= offset  # every timestamp the client takes lands on the driver's clock
            tracker.install(client)

        try:
            outcome, lines = run_worker(job, wait_start, on_client)
        except Exception as exc:  # reported by the driver with the requests it had in flight
            done, inflight = tracker.take()
            return {"done": done, "inflight": inflight, "error": f"{type(exc).__name__}: {one_line(str(exc))}"}
        health = []
        for h in outcome.health:
            h.ts_s = [t - offset / 1e9 for t in h.ts_s]
            health.append(h.to_dict())
        done, inflight = tracker.take()
        return {"done": done, "inflight": inflight, "health": health, "span_lines": lines,
                "start_ns": outcome.start_ns, "end_ns": outcome.end_ns, "error": None, "nice": nice}
