"""CPU pinning for the probe's processes (``ttft probe --cpus LIST``), and the machine's CPU use.

A probe on the engine's machine takes CPU the engine's threads may need (its event loop parses
every streamed chunk). ``--cpus 3`` or ``--cpus 2-3`` keeps the probe, and every worker process
it starts, on those CPUs; pair it with the engine pinned elsewhere (``taskset -c 0-1 ...``).
Linux only (``os.sched_setaffinity``); elsewhere pinning is a one-line error.

:func:`machine_cpu_s` reads the machine's busy and total CPU seconds from ``/proc/stat`` (None
where there is none), so the client's own CPU can be set against what the machine had.

Threading: :func:`pin_process` pins every thread of the process that exists when it is called;
threads and processes started later inherit the mask. Call it before the load starts.
"""

from __future__ import annotations

import os
from pathlib import Path


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` -> ``(0, 2, 3)`` (sorted, unique). Raises ValueError with a one-line reason."""
    cpus: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"--cpus {text!r}: {part!r} is not a CPU number or range (e.g. 2,3 or 2-3)") from None
        if a < 0 or b < a:
            raise ValueError(f"--cpus {text!r}: bad range {part!r}")
        cpus.update(range(a, b + 1))
    if not cpus:
        raise ValueError(f"--cpus {text!r}: no CPU given (e.g. 2,3 or 2-3)")
    return tuple(sorted(cpus))


def available_cpus() -> tuple[int, ...] | None:
    """The CPUs this process may run on (None where the OS cannot say)."""
    get = getattr(os, "sched_getaffinity", None)
    return tuple(sorted(get(0))) if get is not None else None


def check_cpus(cpus: tuple[int, ...]) -> None:
    """Raise ValueError (one line) when pinning is unsupported or a CPU is not available here."""
    avail = available_cpus()
    if avail is None or not hasattr(os, "sched_setaffinity"):
        raise ValueError("--cpus needs Linux (os.sched_setaffinity); run the probe without it here")
    missing = sorted(set(cpus) - set(avail))
    if missing:
        raise ValueError(f"--cpus: CPU(s) {','.join(map(str, missing))} not available to this process "
                         f"(available: {_ranges(avail)})")


def pin_process(cpus: tuple[int, ...]) -> tuple[int, ...]:
    """Pin every thread of this process to ``cpus``; returns the mask now in force."""
    check_cpus(cpus)
    mask = set(cpus)
    tasks = Path("/proc/self/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, mask)
        except (ProcessLookupError, PermissionError):
            continue  # the thread ended meanwhile (or is not ours to move)
    os.sched_setaffinity(0, mask)
    return tuple(sorted(os.sched_getaffinity(0)))


def worker_cpus(cpus: tuple[int, ...] | None, index: int, workers: int) -> tuple[int, ...] | None:
    """Worker ``index``'s mask: its own CPU when there is one per worker, else all of ``cpus``."""
    if not cpus:
        return None
    return (cpus[index % len(cpus)],) if len(cpus) >= workers else cpus


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat; None elsewhere.

    Busy is everything but idle and iowait; the counters are in clock ticks (``SC_CLK_TCK``).
    """
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        ticks = [int(v) for v in fields[1:]]
    except (OSError, ValueError, IndexError):
        return None
    if fields[0] != "cpu" or len(ticks) < 5:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = sum(ticks[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    idle = ticks[3] + ticks[4]
    return (total - idle) / tick, total / tick


def _ranges(cpus: tuple[int, ...]) -> str:
    out, start, prev = [], None, None
    for c in cpus:
        if start is None:
            start = prev = c
        elif c == prev + 1:  # type: ignore[operator]
            prev = c
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)
