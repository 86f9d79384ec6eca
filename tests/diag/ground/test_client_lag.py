"""diag.ground.client_lag: a client stall counts against a request's TTFT only where it covers the
request's send or its first token; the machine's part of a stall is told apart from the client's."""

from __future__ import annotations

import numpy as np
import pytest

from diag.ground.client_lag import first_token_lag, in_windows, stalls_of, ttft_delays, windows_of

T0 = 1000.0


def _stall(start: float, lag: float, starved: float = 0.0):
    """One lag sample: the loop could not run from ``start`` to ``start + lag``."""
    return T0 + start + lag, lag, starved


def _stalls(*samples):
    ts, lag, starved = zip(*samples)
    return stalls_of(ts, lag, starved)


def test_a_stall_under_way_at_the_first_token_delays_it_from_the_stall_start() -> None:
    st = _stalls(_stall(0.90, 0.20))  # stalled from 0.90 to 1.10; the first token read at its end
    total, own = ttft_delays([st], np.array([T0]), np.array([T0 + 1.10]))
    assert total[0] == pytest.approx(0.20) and own[0] == pytest.approx(0.20)


def test_a_stall_while_the_request_waits_on_the_server_delays_nothing() -> None:
    st = _stalls(_stall(0.30, 0.20))  # the loop stalled mid-wait; the first token came at 1.0, after it
    total, _ = ttft_delays([st], np.array([T0]), np.array([T0 + 1.0]))
    assert total[0] == 0.0


def test_a_stall_under_way_at_the_send_delays_it_to_the_stall_end() -> None:
    st = _stalls(_stall(-0.05, 0.15))  # under way when the request was to be sent, ends 0.10 after
    total, _ = ttft_delays([st], np.array([T0]), np.array([T0 + 1.0]))
    assert total[0] == pytest.approx(0.10)


def test_the_delay_is_capped_at_the_ttft() -> None:
    st = _stalls(_stall(-0.5, 2.0))
    total, _ = ttft_delays([st], np.array([T0]), np.array([T0 + 1.5]))
    assert total[0] == pytest.approx(1.5)


def test_the_machines_part_is_not_the_clients_own() -> None:
    st = _stalls(_stall(0.90, 0.20, starved=0.15))  # 0.15 of the 0.20 s the loop was runnable, given no CPU
    total, own = ttft_delays([st], np.array([T0]), np.array([T0 + 1.10]))
    assert total[0] == pytest.approx(0.20) and own[0] == pytest.approx(0.05)


def test_with_several_processes_a_request_gets_the_largest_delay_not_the_sum() -> None:
    a, b = _stalls(_stall(0.90, 0.20)), _stalls(_stall(0.95, 0.15))
    total, _ = ttft_delays([a, b], np.array([T0]), np.array([T0 + 1.10]))
    assert total[0] == pytest.approx(0.20)


def test_stalls_between_requests_count_nowhere() -> None:
    # two requests 0-1 s and 3-4 s; the loop stalled 1.5-2.5 s (the tool's own work between them)
    st = _stalls(_stall(0.40, 0.001), _stall(1.5, 1.0), _stall(3.5, 0.001))
    out = first_token_lag([st], [T0, T0 + 3.0], [T0 + 1.0, T0 + 4.0])
    assert out["share"] == 0.0 and out["requests_delayed"] == 0
    assert out["stall_frac"] == pytest.approx(0.001)
    assert out["lag_max_s"] == pytest.approx(0.001)  # the 1 s stall was taken while nothing waited


def test_first_token_lag_sums_over_requests() -> None:
    # four 1 s requests, two of them read their first token at the end of a 0.25 s stall, half of it the machine's
    st = _stalls(_stall(0.75, 0.25, starved=0.125), _stall(2.75, 0.25, starved=0.125))
    start = [T0, T0 + 2.0, T0 + 4.0, T0 + 6.0]
    out = first_token_lag([st], start, [s + 1.0 for s in start])
    assert out["requests"] == 4 and out["requests_delayed"] == 2
    assert out["share"] == pytest.approx(0.5 / 4.0)
    assert out["own_share"] == pytest.approx(0.25 / 4.0) and out["starved_share"] == pytest.approx(0.25 / 4.0)


def test_windows_merge_overlapping_requests() -> None:
    w = windows_of(np.array([0.0, 0.5, 3.0]), np.array([1.0, 2.0, 4.0]))
    assert w.tolist() == [[0.0, 2.0], [3.0, 4.0]]
    assert in_windows(np.array([1.5, 2.5, 3.5]), w).tolist() == [True, False, True]


def test_no_samples_or_no_requests() -> None:
    out = first_token_lag([], [T0], [T0 + 1.0])
    assert out["share"] is None and out["stall_frac"] is None and out["lag_p99_s"] is None
    assert first_token_lag([_stalls(_stall(0.1, 0.1))], [], [])["share"] is None


def _ticks(lags: list[float], tick: float = 0.01, start: float = 0.0) -> list[tuple[float, float, float]]:
    """The monitor's samples: it sleeps ``tick``, then wakes ``lag`` late, one after another."""
    out, t = [], start
    for lag in lags:
        t += tick + lag
        out.append((T0 + t, lag, 0.0))
    return out


def test_a_loop_late_at_every_tick_is_one_stall_across_the_unobserved_sleeps() -> None:
    """A thread holding the GIL across the loop's brief wakes: late 50 ms at every 10 ms tick. The
    sleeps between are unobserved, so the bound counts the chain as one stall; a first token read at
    its end may have waited since it began."""
    st = _stalls(*_ticks([0.005, 0.05, 0.05, 0.05, 0.05, 0.001, 0.001]))
    assert len(st.end_s) == 4  # the short first, the chain of four, two short ones
    chain = st.lag_s[1]
    assert chain == pytest.approx(0.05 * 4 + 0.01 * 3)
    first = st.end_s[1]
    total, _ = ttft_delays([st], np.array([first - 0.30]), np.array([first]))
    assert total[0] == pytest.approx(chain)


def test_a_healthy_loop_late_a_little_at_each_tick_stays_many_small_stalls() -> None:
    st = _stalls(*_ticks([0.0005] * 50))
    assert len(st.end_s) == 50 and st.lag_s.max() == pytest.approx(0.0005)
