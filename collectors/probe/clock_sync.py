"""A remote process's Unix clock against this one's, measured NTP-style.

One exchange: this process reads its clock (``t0``), asks the remote for its Unix ns (``r``) and
reads its clock again when the answer is back (``t3``). If the answer was read at the midpoint
of the round trip, ``offset = r - (t0 + t3) / 2``; wherever in the round trip it was read, the
true offset lies within ``rtt / 2`` of that. Of several exchanges the one with the shortest
round trip is kept (the least queueing on either side): its offset, and ``rtt / 2`` as its
uncertainty. The round trip is timed on ``perf_counter_ns`` (a clock that is never stepped),
the midpoint placed on ``time_ns``.

Two processes under one kernel read one ``CLOCK_REALTIME`` (time namespaces do not cover it), so
their offset is zero by construction: :func:`clock_id` names that clock (Linux's boot id), and a
caller may apply zero where the ids match rather than a measurement that is only ever noise there.

Units: ns throughout. Threading: :func:`measure` blocks its caller for the round trips.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: exchanges per measurement (the shortest round trip wins)
EXCHANGES = 8
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class ClockOffset:
    """The remote clock minus this one (ns), its uncertainty (half the kept round trip, ns), that
    round trip (ns), how many exchanges were made, and when (this clock's Unix ns)."""

    offset_ns: int
    uncertainty_ns: int
    rtt_ns: int
    exchanges: int
    at_ns: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(exchanges: Sequence[tuple[int, int, int]]) -> ClockOffset:
    """The offset from exchanges ``(t0 Unix ns, remote Unix ns, round trip ns)``: the one with the
    shortest round trip, its remote reading against the midpoint ``t0 + rtt / 2``."""
    if not exchanges:
        raise ValueError("no clock exchange to estimate an offset from")
    t0, remote, rtt = min(exchanges, key=lambda e: e[2])
    rtt = max(0, rtt)
    return ClockOffset(remote - (t0 + rtt // 2), (rtt + 1) // 2, rtt, len(exchanges), t0)


def measure(ask: Callable[[], int], n: int = EXCHANGES) -> ClockOffset:
    """Measure with ``n`` exchanges; ``ask()`` returns the remote's ``time.time_ns()`` (blocks)."""
    out = []
    for _ in range(max(1, n)):
        t0 = time.time_ns()
        p0 = time.perf_counter_ns()
        remote = int(ask())
        out.append((t0, remote, time.perf_counter_ns() - p0))
    return estimate(out)


def clock_id() -> str:
    """This machine's realtime clock: ``boot:<Linux boot id>`` (shared by every process and container
    under one kernel), else ``host:<hostname>:<pid>`` (unique: never taken for another's clock)."""
    try:
        with open(_BOOT_ID, encoding="ascii") as fh:
            boot = fh.read().strip()
        if boot:
            return f"boot:{boot}"
    except OSError:
        pass
    return f"host:{socket.gethostname()}:{os.getpid()}"


__all__ = ["EXCHANGES", "ClockOffset", "clock_id", "estimate", "measure"]
