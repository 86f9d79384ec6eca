"""Linux /proc readings for the benchmarks: a process tree's CPU (ticks and each thread's
schedstat), ttft-diag's own threads (``ttft-*``) inside a server, and pinning a tree or those
threads to one CPU. Times in ns (schedstat) or s (ticks); call from any thread; Linux only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


Sched = tuple[int, int, int]  # a thread's (on-CPU ns, ns waiting on a run queue, timeslices run)


def tree_cpu(pid: int) -> tuple[float, dict[str, Sched]]:
    """CPU of ``pid``'s process tree: (ticks-based seconds, :data:`Sched` per live thread).

    ``/proc/P/stat`` user + system counts exited threads too but only in clock ticks (10 ms:
    over a 13-request round that is 0.8 ms per request, 3 % of a small model's request);
    ``/proc/P/task/T/schedstat`` gives each live thread's on-CPU and run-queue time in ns and
    the timeslices it ran.
    """
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    ticks_s, per_thread = 0.0, {}
    for p in _tree_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            ticks_s += (int(fields[11]) + int(fields[12])) / tick
            for t in Path(f"/proc/{p}/task").iterdir():
                cpu_ns, wait_ns, slices = (int(v) for v in (t / "schedstat").read_text().split()[:3])
                per_thread[f"{p}/{t.name}"] = (cpu_ns, wait_ns, slices)
        except (OSError, IndexError, ValueError):
            continue
    return ticks_s, per_thread


def cpu_delta_s(before: tuple[float, dict[str, Sched]], after: tuple[float, dict[str, Sched]]) -> float:
    """CPU seconds between two :func:`tree_cpu` readings: ns from schedstat when no thread exited
    in between (a thread that exits takes its ns with it), else the ticks."""
    ticks0, ns0 = before
    ticks1, ns1 = after
    if not ns1 or any(t not in ns1 for t in ns0):
        return ticks1 - ticks0
    return sum(ns[0] - ns0.get(t, (0, 0, 0))[0] for t, ns in ns1.items()) / 1e9


def own_threads(pid: int, prefix: str = "ttft-") -> list[Path]:
    """``/proc/P/task/T`` of the threads of ``pid``'s tree whose OS name starts with ``prefix``
    (our span build and export threads name themselves: collectors.span_export.name_native_thread)."""
    out = []
    for p in _tree_pids(pid):
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for t in tasks:
            try:
                if (t / "comm").read_text().startswith(prefix):
                    out.append(t)
            except OSError:
                continue
    return out


def own_threads_ns(pid: int) -> int:
    """On-CPU ns of our own threads in ``pid``'s tree (:func:`own_threads`)."""
    total = 0
    for t in own_threads(pid):
        try:
            total += int((t / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def thread_labels(pid: int) -> dict[str, str]:
    """A name per live thread of ``pid``'s tree, keyed as :func:`tree_cpu` keys them: the Python
    thread's name where py-spy sees one (``py-spy dump --json``: os_thread_id), else the OS name
    (torch's OpenMP workers, native threads; ours name themselves ``ttft-...``)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    labels: dict[str, str] = {}
    for p in _tree_pids(pid):
        try:
            for t in Path(f"/proc/{p}/task").iterdir():
                labels[f"{p}/{t.name}"] = f"{(t / 'comm').read_text().strip()} (native)"
        except OSError:
            continue
        if not Path(exe).exists():
            continue
        try:
            dump = subprocess.run([exe, "dump", "--json", "--pid", str(p)], capture_output=True, timeout=30)
            threads = json.loads(dump.stdout) if dump.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired, ValueError):
            threads = []
        for th in threads:
            if th.get("os_thread_id") and th.get("thread_name"):
                labels[f"{p}/{th['os_thread_id']}"] = f"{th['thread_name']} (pid {p})"
    return labels


def add_thread_deltas(into: dict[str, list[int]], before: dict[str, Sched], after: dict[str, Sched]) -> None:
    """Add each live thread's :data:`Sched` change between two :func:`tree_cpu` readings to ``into``."""
    for key, now in after.items():
        then = before.get(key, (0, 0, 0))
        acc = into.setdefault(key, [0, 0, 0])
        for i in range(3):
            acc[i] += now[i] - then[i]


def pin_tree(pid: int, cpu: int) -> None:
    """Pin every thread of ``pid``'s process tree to ``cpu`` (threads started later inherit it)."""
    for p in _tree_pids(pid):
        try:
            tids = [int(t.name) for t in Path(f"/proc/{p}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, {cpu})
            except OSError:
                pass


def pin_own_threads(pid: int, cpu: int) -> None:
    """Pin our own threads in ``pid``'s tree (:func:`own_threads`) to ``cpu``."""
    for t in own_threads(pid):
        try:
            os.sched_setaffinity(int(t.name), {cpu})
        except (OSError, ValueError):
            continue
