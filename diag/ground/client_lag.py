"""The load generator's event-loop stalls set against the requests they could have delayed.

A lag sample (series ``client_loop_lag_s``) taken at ``ts_s`` with lateness ``lag_s`` says the
client's loop could not run from ``ts_s - lag_s`` to ``ts_s``: a *stall*. A request's TTFT runs
from its send (``start``) to the read of its first content (``first``). A stall inflates that
TTFT only where it covers one of its ends: under way when the request was to be sent (the send
waits for the stall's end) or when its first token arrived (the read waits for the stall's end,
and the token is stamped right after it). A stall in between, while the request waits on the
server, or between requests (the tool's own work between steps), delays nothing the client
measures. So the client's delay of one request is at most (stall end - start) for a stall under
way at its start plus (first - stall start) for one under way at its first token, capped at its
TTFT: an upper bound (the bytes may have arrived late in the stall).

A sample's starved part (series ``client_loop_starved_s``: the loop thread runnable but given no
CPU while the client's other threads were not using it, see :mod:`collectors.probe.health`) is the
part of its lateness the machine caused (every CPU busy: the server beside the client, other
work); the rest is the client's own doing (its loop busy, its threads taking the CPU or holding
the GIL). Where it was not measured the whole lateness counts as the client's own.

Units: seconds (Unix seconds for times), shares 0..1. Pure numpy; no I/O, no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: a first token stamped this long after a stall's end was still read by the loop waking from it
#: (the monitor's timer and the socket's callback run in the same loop iteration, in either order)
WAKE_TOLERANCE_S = 0.005


@dataclass(frozen=True)
class Stalls:
    """One client process's stalls, in time order: [start_s, end_s] each, and the share of each
    that was the client's own (1 - starved part / lateness)."""

    start_s: np.ndarray
    end_s: np.ndarray
    own_frac: np.ndarray

    @property
    def lag_s(self) -> np.ndarray:
        return self.end_s - self.start_s


def stalls_of(ts_s: Sequence[float] | np.ndarray, lag_s: Sequence[float] | np.ndarray,
              starved_s: Sequence[float] | np.ndarray | None = None) -> Stalls:
    """The stalls of one process's lag samples (``starved_s``: each sample's part the machine
    caused, NaN or None where unmeasured)."""
    ts = np.asarray(ts_s, dtype="float64")
    lag = np.nan_to_num(np.asarray(lag_s, dtype="float64"), nan=0.0).clip(min=0.0)
    if starved_s is None:
        rq = np.zeros_like(lag)
    else:
        rq = np.nan_to_num(np.asarray(starved_s, dtype="float64"), nan=0.0).clip(min=0.0)
    order = np.argsort(ts, kind="stable")
    ts, lag, rq = ts[order], lag[order], rq[order]
    own = np.where(lag > 0, 1.0 - np.minimum(rq, lag) / np.where(lag > 0, lag, 1.0), 1.0)
    return _chained(Stalls(ts - lag, ts, own))


def _chained(st: Stalls) -> Stalls:
    """``st`` with each run of stalls longer than the monitor's tick, one tick apart, merged into one.

    The monitor sleeps a tick (its requested interval: the median spacing of its samples less
    their lag) between samples; a loop late by more than a tick at consecutive samples, with just
    that sleep between, may have been held throughout it (a thread holding the GIL across the
    loop's brief wakes): the sleep is unobserved, and an upper bound counts it stalled."""
    if len(st.end_s) < 3:
        return st
    lag = st.lag_s
    tick = float(np.median(np.diff(st.end_s) - lag[1:]))
    if not np.isfinite(tick) or tick <= 0:
        return st
    long = lag >= tick
    joins = long[:-1] & long[1:] & (st.start_s[1:] - st.end_s[:-1] <= tick + WAKE_TOLERANCE_S)
    if not joins.any():
        return st
    group = np.concatenate([[0], np.cumsum(~joins)])  # a new group where a stall does not join the one before
    starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
    ends = np.concatenate([starts[1:], [len(group)]]) - 1
    weight = np.add.reduceat(lag * st.own_frac, starts)
    total = np.add.reduceat(lag, starts)
    return Stalls(st.start_s[starts], st.end_s[ends], np.where(total > 0, weight / np.where(total > 0, total, 1.0), 1.0))


def _covering(st: Stalls, t: np.ndarray, before_s: float, after_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(index of the stall under way at each time in ``t``, or -1; a stall counts from its start -
    ``before_s`` to its end + ``after_s``). A process's stalls do not overlap: the first stall
    ending at or after ``t - after_s`` is the only candidate."""
    if not len(st.end_s) or not len(t):
        return np.full(len(t), -1), np.zeros(len(t), dtype=bool)
    k = np.searchsorted(st.end_s, t - after_s, side="left")
    inside = k < len(st.end_s)
    kk = np.where(inside, k, 0)
    inside &= st.start_s[kk] - before_s <= t
    return np.where(inside, kk, -1), inside


def ttft_delays(stalls: Sequence[Stalls], start_s: np.ndarray, first_s: np.ndarray,
                tol_s: float = WAKE_TOLERANCE_S) -> tuple[np.ndarray, np.ndarray]:
    """Per request, (the most its TTFT was inflated by the client's stalls, the client's own part
    of that) in seconds; with several processes a request gets the largest (it ran in one of them)."""
    start = np.asarray(start_s, dtype="float64")
    first = np.asarray(first_s, dtype="float64")
    ttft = np.clip(first - start, 0.0, None)
    total = np.zeros(len(start))
    own = np.zeros(len(start))
    for st in stalls:
        lag = st.lag_s
        k1, at_first = _covering(st, first, 0.0, tol_s)
        d1 = np.where(at_first, np.minimum(first - st.start_s[k1], lag[k1]), 0.0).clip(min=0.0)
        k0, at_start = _covering(st, start, tol_s, 0.0)
        d0 = np.where(at_start & (k0 != k1), np.minimum(st.end_s[k0] - start, lag[k0]), 0.0).clip(min=0.0)
        t = np.minimum(d0 + d1, ttft)
        o = np.minimum(d0 * np.where(at_start, st.own_frac[k0], 0.0) + d1 * np.where(at_first, st.own_frac[k1], 0.0), t)
        better = t > total
        total = np.where(better, t, total)
        own = np.where(better, o, own)
    return total, own


def windows_of(start_s: np.ndarray, first_s: np.ndarray) -> np.ndarray:
    """The union of the requests' TTFT windows, as sorted, disjoint (start, end) rows."""
    a = np.asarray(start_s, dtype="float64")
    b = np.asarray(first_s, dtype="float64")
    ok = np.isfinite(a) & np.isfinite(b) & (b > a)
    a, b = a[ok], b[ok]
    if not len(a):
        return np.empty((0, 2))
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    out: list[list[float]] = [[a[0], b[0]]]
    for x, y in zip(a[1:], b[1:]):
        if x <= out[-1][1]:
            out[-1][1] = max(out[-1][1], y)
        else:
            out.append([x, y])
    return np.asarray(out)


def _overlap_s(st: Stalls, windows: np.ndarray) -> float:
    """Seconds of ``st`` inside ``windows`` (both disjoint sets of intervals)."""
    total = 0.0
    for a, b in windows:
        total += float(np.clip(np.minimum(st.end_s, b) - np.maximum(st.start_s, a), 0.0, None).sum())
    return total


def in_windows(ts_s: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Whether each time lies inside one of ``windows``."""
    t = np.asarray(ts_s, dtype="float64")
    if not len(windows):
        return np.zeros(len(t), dtype=bool)
    i = np.searchsorted(windows[:, 0], t, side="right") - 1
    ii = np.clip(i, 0, None)
    return (i >= 0) & (t <= windows[ii, 1])


def first_token_lag(stalls: Sequence[Stalls], start_s: Sequence[float] | np.ndarray,
                    first_s: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """The client's lag as it bore on the requests' TTFT (``start_s``/``first_s``: each request's
    send and first-content read, Unix seconds):

    * ``share``: the requests' TTFT the client's stalls could have added, summed, over their TTFT
      summed (an upper bound); ``own_share`` its part the client caused, ``starved_share`` the
      part the machine did (the starved part);
    * ``requests_delayed``: requests with any such delay;
    * ``stall_frac``: the share of the time some request waited for its first token that the loop
      ran late (the busiest process's); ``lag_p99_s``/``lag_max_s``: length of the stalls (a chain
      of late ticks as one) that ended while one waited. Each None without samples or requests.
    """
    start = np.asarray(start_s, dtype="float64")
    first = np.asarray(first_s, dtype="float64")
    ok = np.isfinite(start) & np.isfinite(first) & (first >= start)
    start, first = start[ok], first[ok]
    ttft_sum = float(np.clip(first - start, 0.0, None).sum()) if stalls else 0.0  # no samples: nothing known
    total, own = ttft_delays(stalls, start, first)
    win = windows_of(start, first)
    covered = float((win[:, 1] - win[:, 0]).sum()) if len(win) else 0.0
    fracs = [_overlap_s(st, win) / covered for st in stalls] if covered > 0 else []
    lags = np.concatenate([st.lag_s[in_windows(st.end_s, win)] for st in stalls]) if stalls else np.empty(0)
    share = float(total.sum()) / ttft_sum if ttft_sum > 0 else None
    own_share = float(own.sum()) / ttft_sum if ttft_sum > 0 else None
    return {
        "requests": int(len(start)),
        "share": share,
        "own_share": own_share,
        "starved_share": None if share is None or own_share is None else max(0.0, share - own_share),
        "requests_delayed": int((total > 0).sum()),
        "stall_frac": min(1.0, max(fracs)) if fracs else None,
        "lag_p99_s": float(np.percentile(lags, 99)) if len(lags) else (0.0 if covered > 0 and stalls else None),
        "lag_max_s": float(lags.max()) if len(lags) else (0.0 if covered > 0 and stalls else None),
    }


__all__ = ["Stalls", "WAKE_TOLERANCE_S", "first_token_lag", "in_windows", "stalls_of", "ttft_delays", "windows_of"]
