"""Whether the watched server is answering the probe, from the probe's own requests.

A live view (``ttft watch``) follows the last ``window`` seconds; when the server stops
answering, a window that still holds a minute of answered requests keeps the old verdict for
most of that minute, and after it comes back the window holds the outage for a minute more.
:func:`server_state` finds the outage in the client's requests so that the live source can
start the rules' window at the outage (the rules then see only what the probe sees now: the
failed requests and their kinds) and, once requests are answered again, at the first answered
one. The verdict itself stays the rule engine's.

An outage is :data:`OUTAGE_MIN_FAILED` or more consecutive failed probe requests (ordered by
when they were sent) with none answered between them. Times are Unix ns.
Threading: pure functions over a DataFrame; any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

#: consecutive failed probe requests that make an outage (one failed request is not one)
OUTAGE_MIN_FAILED = 3


@dataclass(frozen=True)
class ServerState:
    """The probe's view of the server: down since when, or back since when (both None: no outage seen)."""

    #: when the first request of the current run of failures was sent (the server is not answering)
    down_since_ns: int | None = None
    #: when the first answered request after the last outage was sent (the server came back)
    back_since_ns: int | None = None
    #: failed requests in the current outage, by error kind
    kinds: dict[str, int] = field(default_factory=dict)

    @property
    def down(self) -> bool:
        return self.down_since_ns is not None


def _column(req: pd.DataFrame, name: str) -> np.ndarray:
    if name not in req.columns:
        return np.full(len(req), np.nan)
    return pd.to_numeric(req[name], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


def server_state(requests: pd.DataFrame, min_failed: int = OUTAGE_MIN_FAILED) -> ServerState:
    """The current outage (or the recovery from the last one) among the probe's measured
    requests in ``requests`` (a :class:`diag.ground.tables.Tables` requests table)."""
    n = len(requests)
    if not n or "has_client" not in requests.columns:
        return ServerState()
    client = requests["has_client"].fillna(False).astype(bool).to_numpy()
    if "warmup" in requests.columns:
        client = client & ~requests["warmup"].fillna(False).astype(bool).to_numpy()
    err = requests["error"] if "error" in requests.columns else pd.Series([None] * n, index=requests.index)
    failed = (err.notna() & (err.astype(str).str.len() > 0)).to_numpy()
    answered = ~failed & ~np.isnan(_column(requests, "ttft_s"))
    t = _column(requests, "client_start_ns")
    t = np.where(np.isnan(t), _column(requests, "start_ns"), t)
    keep = client & (failed | answered) & ~np.isnan(t)  # a request still streaming is neither
    if not keep.any():
        return ServerState()
    order = np.argsort(t[keep], kind="stable")
    t_k = t[keep][order]
    f_k = failed[keep][order]
    kinds_k = err.to_numpy(dtype=object)[keep][order]
    # runs of equal outcome: start index of each run and its length
    starts = np.flatnonzero(np.r_[True, f_k[1:] != f_k[:-1]])
    lengths = np.diff(np.r_[starts, len(f_k)])
    outages = [i for i, (s, ln) in enumerate(zip(starts, lengths)) if f_k[s] and ln >= min_failed]
    if not outages:
        return ServerState()
    last = outages[-1]
    s, ln = int(starts[last]), int(lengths[last])
    if s + ln == len(f_k):  # the run of failures is still going on
        kinds: dict[str, int] = {}
        for k in kinds_k[s:]:
            kinds[str(k)] = kinds.get(str(k), 0) + 1
        return ServerState(down_since_ns=int(t_k[s]), kinds=kinds)
    return ServerState(back_since_ns=int(t_k[s + ln]))
