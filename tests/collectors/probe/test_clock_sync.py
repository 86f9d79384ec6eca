"""NTP-style clock offsets: the shortest round trip wins, its half is the uncertainty."""

from __future__ import annotations

import time

import pytest

from collectors.probe.clock_sync import ClockOffset, clock_id, estimate, measure


def test_estimate_keeps_the_shortest_round_trip():
    # (t0, remote reading, round trip): the remote is 5 ms ahead; the slow exchanges read it late
    exchanges = [(1_000_000_000, 1_005_400_000, 900_000), (2_000_000_000, 2_005_050_000, 100_000),
                 (3_000_000_000, 3_006_000_000, 2_000_000)]
    off = estimate(exchanges)
    assert off == ClockOffset(offset_ns=5_000_000, uncertainty_ns=50_000, rtt_ns=100_000, exchanges=3,
                              at_ns=2_000_000_000)
    with pytest.raises(ValueError):
        estimate([])


def test_measure_finds_a_skewed_clock_within_its_uncertainty():
    skew_ns = -42_000_000  # the remote runs 42 ms behind

    def ask() -> int:
        time.sleep(0.0005)
        return time.time_ns() + skew_ns

    off = measure(ask, n=6)
    assert off.exchanges == 6 and off.rtt_ns >= 500_000
    assert abs(off.offset_ns - skew_ns) <= off.uncertainty_ns + 200_000  # plus this machine's scheduling noise


def test_clock_id_is_stable_in_one_process():
    assert clock_id() == clock_id() and clock_id().split(":")[0] in ("boot", "host")
