"""tui.outage: where the probe's requests say the watched server stopped answering, and came back."""

from __future__ import annotations

import pandas as pd

from tui.outage import OUTAGE_MIN_FAILED, server_state

MS = 1_000_000


def requests(pattern: str, kind: str = "connect_refused", server_rows: int = 0) -> pd.DataFrame:
    """One probe request every 250 ms: ``o`` answered, ``x`` failed with ``kind``, ``.`` still
    streaming (no TTFT, no error yet); ``server_rows`` engine-only rows (answered) at the end."""
    rows = []
    for i, c in enumerate(pattern):
        rows.append({"has_client": True, "warmup": False, "client_start_ns": float(i * 250 * MS),
                     "start_ns": float(i * 250 * MS), "error": kind if c == "x" else None,
                     "ttft_s": 0.05 if c == "o" else float("nan")})
    for j in range(server_rows):
        rows.append({"has_client": False, "warmup": False, "client_start_ns": float("nan"),
                     "start_ns": float((len(pattern) + j) * 250 * MS), "error": None, "ttft_s": 0.04})
    return pd.DataFrame(rows)


def test_a_run_of_failures_at_the_end_is_an_outage_since_its_first_request() -> None:
    st = server_state(requests("oooooxxxx"))
    assert st.down and st.down_since_ns == 5 * 250 * MS
    assert st.kinds == {"connect_refused": 4}
    # a request still streaming neither ends nor starts the outage
    assert server_state(requests("oooooxxx.x")).down_since_ns == 5 * 250 * MS


def test_one_or_two_failed_requests_are_not_an_outage() -> None:
    assert not server_state(requests("ooooox")).down
    assert not server_state(requests("oooo" + "x" * (OUTAGE_MIN_FAILED - 1))).down
    assert server_state(requests("ooxoooxxo")).back_since_ns is None  # scattered failures: no recovery either


def test_answered_requests_after_an_outage_are_the_recovery() -> None:
    st = server_state(requests("oooxxxxxoo", kind="http_5xx"))
    assert not st.down and st.back_since_ns == 8 * 250 * MS
    # a later outage wins over the earlier recovery
    assert server_state(requests("oxxxxoooxxx")).down_since_ns == 8 * 250 * MS


def test_only_the_probe_requests_count() -> None:
    """The engine's own spans keep arriving from requests it answered before it died: they are
    not the probe's view of whether the server answers now."""
    assert server_state(requests("oooxxxx", server_rows=5)).down
    assert server_state(pd.DataFrame()).down_since_ns is None
