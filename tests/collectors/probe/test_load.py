"""Load shapes: closed loop, Poisson/gamma arrivals, slot wait, warm-up, bounds, workers."""

from __future__ import annotations

import numpy as np
import pytest

import time

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, eventloop, run_probe
from collectors.probe.load import sleep_until_perf_ns

from support.probe_timings import SLOW_S


def _cfg(url, load, out=2, **kw):
    return ProbeConfig(url, api="completions", load=load,
                       workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse(str(out))), timeout_s=5, **kw)


def test_closed_loop_keeps_exactly_c_in_flight(server):
    res = run_probe(_cfg(server.url("slow"), LoadSpec(concurrency=3, requests=9)))
    assert server.max_in_flight == 3
    assert res.metrics["requests"]["ok"] == 9
    # closed loop: a request is sent the moment its slot frees, so slot wait is only client lag
    assert res.metrics["slot_wait_s"]["max"] < 0.05


def test_slot_wait_measured_under_overload(server):
    # 50 req/s offered, 2 slots, 0.1 s per request: requests queue for a client slot
    res = run_probe(_cfg(server.url("slow"), LoadSpec(concurrency=2, rate_rps=50, requests=12, seed=1)))
    rs = sorted(res.results, key=lambda r: r.scheduled_ns)
    assert server.max_in_flight <= 2
    waits = [r.slot_wait_s for r in rs]
    assert waits[-1] > 0.3  # the last one waited for several service times
    # TTFT starts at the real send: it stays near the server's own delay despite the queue
    assert all(r.ttft_s < SLOW_S + 0.08 for r in rs)
    m = res.metrics
    assert m["ttft_incl_slot_wait_s"]["p99"] > m["ttft_s"]["p99"] + 0.2
    for r in rs:
        assert r.start_ns >= r.scheduled_ns


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_open_loop_never_wakes_before_its_scheduled_time(loop, monkeypatch):
    # uvloop's millisecond timers end a sleep up to ~1 ms early; an open loop that sent then
    # would start a request before its scheduled time and offer more than the asked rate
    monkeypatch.setenv("TTFT_EVENT_LOOP", loop)
    if eventloop.loop_name() != loop:
        pytest.skip(f"{loop} not installed")

    async def lateness_ns() -> list[int]:
        late = []
        for i in range(60):
            t_ns = time.perf_counter_ns() + int((0.3 + (i % 7) * 0.37) * 1e6)
            await sleep_until_perf_ns(t_ns)
            late.append(time.perf_counter_ns() - t_ns)
        return late

    assert min(eventloop.run(lateness_ns())) >= 0


def test_poisson_arrivals_have_the_right_rate(server):
    res = run_probe(_cfg(server.url("flaky"), LoadSpec(concurrency=64, rate_rps=80, requests=120, seed=3), out=1))
    sched = np.sort([r.scheduled_ns for r in res.results]) / 1e9
    gaps = np.diff(sched)
    rate = 1 / gaps.mean()
    assert 80 * 0.7 < rate < 80 * 1.4
    cv = gaps.std() / gaps.mean()
    assert 0.7 < cv < 1.35  # exponential gaps: CV ~ 1
    starts = np.sort([r.start_ns for r in res.results]) / 1e9
    assert abs((starts[-1] - starts[0]) - (sched[-1] - sched[0])) < 0.1  # the client kept up


def test_gamma_burstiness_changes_dispersion():
    import random

    def cv(shape):
        rng = random.Random(0)
        g = np.array([rng.gammavariate(shape, 1 / (10 * shape)) for _ in range(4000)])
        return g.std() / g.mean(), g.mean()

    bursty, mean_b = cv(0.25)
    smooth, mean_s = cv(4.0)
    assert bursty > 1.7 and smooth < 0.6
    assert abs(mean_b - 0.1) < 0.02 and abs(mean_s - 0.1) < 0.01  # same rate either way


def test_warmup_excluded(server):
    res = run_probe(_cfg(server.url("ok"), LoadSpec(concurrency=2, requests=4, warmup_requests=2)))
    assert sum(r.warmup for r in res.results) == 2
    assert res.metrics["requests"]["total"] == 4 and res.metrics["requests"]["warmup_excluded"] == 2
    assert len(server.log) == 1 + 2 + 6  # the compatibility check, two length calibrations, 2 warm-up, 4 measured


def test_duration_bound(server):
    res = run_probe(_cfg(server.url("slow"), LoadSpec(concurrency=2, duration_s=0.35)))
    n = res.metrics["requests"]["total"]
    assert 4 <= n <= 10
    assert res.metrics["duration_s"] < 0.35 + SLOW_S + 0.3


def test_load_spec_validation_and_split():
    with pytest.raises(ValueError):
        LoadSpec(concurrency=0)
    with pytest.raises(ValueError):
        LoadSpec(rate_rps=0)
    parts = LoadSpec(concurrency=5, rate_rps=10, requests=11, warmup_requests=3).split(2)
    assert [p.concurrency for p in parts] == [3, 2] and [p.requests for p in parts] == [6, 5]
    assert [p.rate_rps for p in parts] == [5, 5] and sum(p.warmup_requests for p in parts) == 3
    assert LoadSpec().bounded_requests == 100 and LoadSpec(duration_s=1).bounded_requests is None
    # no more shares than requests in flight: one stream over two workers stays one stream
    one = LoadSpec(concurrency=1, requests=8).split(2)
    assert [(p.concurrency, p.requests) for p in one] == [(1, 8)]
    assert [p.concurrency for p in LoadSpec(concurrency=3, rate_rps=9, requests=9).split(8)] == [1, 1, 1]


def test_workers_merge_results_and_spans(server, tmp_path):
    from diag.ground.capture import load_capture
    from diag.ground.tables import build_tables

    cfg = _cfg(server.url("ok"), LoadSpec(concurrency=4, requests=8, warmup_requests=2), workers=2,
               output=tmp_path / "cap")
    res = run_probe(cfg)
    assert res.metrics["requests"]["total"] == 8 and res.metrics["requests"]["ok"] == 8
    assert len({r.request_id for r in res.results}) == 10
    assert res.client_health["processes"] >= 2
    req = build_tables(load_capture(tmp_path / "cap")).requests
    req = req.loc[~req["segment"].isin(["calibrate", "compat"])]
    assert len(req) == 10 and req["client_ttft_s"].notna().all()
    traced = {s.headers["traceparent"].split("-")[1] for s in server.log}
    assert set(req["trace_id"]) <= traced
