"""Client health: loop lag, CPU, saturation verdict; the alongside hooks skip cleanly."""

from __future__ import annotations

import asyncio
import time

import pytest

from collectors.probe.alongside import Alongside
from collectors.probe.health import HealthMonitor, HealthSamples, runq_wait_s, starved_part_s, summarize
from diag.ground import stages


def test_monitor_sees_a_blocked_loop():
    async def go():
        mon = HealthMonitor(interval_s=0.02)
        mon.start()
        await asyncio.sleep(0.1)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.15:  # a busy loop, like a saturated client
            pass
        await asyncio.sleep(0.1)
        return await mon.stop()

    s = asyncio.run(go())
    assert max(s.lag_s) > 0.1
    assert max(s.cpu_pct) > 10  # (a shared machine may not give the busy loop a whole core)
    frame = s.to_frame()
    assert set(frame["source"]) == {"client"}
    assert (frame["series"] == stages.SERIES_LOOP_LAG_S).sum() == len(s.ts_s)
    if runq_wait_s() is not None:  # Linux: the machine's part of each sample, recorded beside it
        assert (frame["series"] == stages.SERIES_LOOP_STARVED_S).sum() == len(s.ts_s)
        # the loop's own busy work is never the machine's doing, however long the machine made it take
        worst = max(range(len(s.lag_s)), key=lambda i: s.lag_s[i])
        loop_cpu_s = s.cpu_pct[worst] / 100.0 * (0.02 + s.lag_s[worst])
        assert s.lag_s[worst] - s.starved_s[worst] >= min(loop_cpu_s, s.lag_s[worst]) - 0.005


def test_the_machines_part_of_a_sample() -> None:
    assert starved_part_s(0.2, 0.15, 0.0, 0.0, 0.25) == pytest.approx(0.15)  # runnable, given no CPU
    assert starved_part_s(0.2, 0.5, 0.0, 0.0, 0.25) == pytest.approx(0.2)  # at most the lag
    assert starved_part_s(0.2, 0.15, 0.12, 0.0, 0.25) == pytest.approx(0.08)  # the loop's own work is its own
    # the client's other threads were on a CPU the whole sample: they took it, the client's own doing
    assert starved_part_s(0.2, 0.15, 0.0, 0.25, 0.25) == 0.0
    nan = starved_part_s(0.2, None, 0.0, 0.0, 0.25)
    assert nan != nan  # NaN: not measured


def test_summary_verdicts():
    ok = HealthSamples("", [1.0, 2.0], [0.001, 0.002], [20.0, 30.0])
    h = summarize([ok], [0.0, 0.0])
    assert h["saturated"] is False and "healthy" in h["reason"]
    busy = HealthSamples("", [1.0 + 0.1 * i for i in range(10)], [0.05] * 10, [99.0] * 10)
    h = summarize([busy], [0.02])
    assert h["saturated"] is True and h["loop_stall_frac"] == pytest.approx(0.5)
    assert "stalled" in h["reason"] and "CPU" in h["reason"] and "pool wait" in h["reason"]
    # one OS-scheduling hiccup is not a saturated client
    hiccup = HealthSamples("", [1.0 + 0.05 * i for i in range(40)], [0.001] * 39 + [0.03], [5.0] * 40)
    assert summarize([hiccup], [0.0])["saturated"] is False
    assert summarize([], [])["reason"] == "no health samples"


def _requests(n: int, t0: float = 100.0, ttft_s: float = 0.5, gap_s: float = 1.0) -> tuple[list[float], list[float]]:
    """``n`` requests one after another: (sends, first tokens), Unix s."""
    starts = [t0 + i * (ttft_s + gap_s) for i in range(n)]
    return starts, [s + ttft_s for s in starts]


def _samples(stalls: list[tuple[float, float, float]], t0: float, t1: float) -> HealthSamples:
    """50 ms samples from ``t0`` to ``t1``, with (end, lag, machine's part) stalls among them."""
    ts = [t0 + 0.05 * k for k in range(int((t1 - t0) / 0.05))]
    rows = sorted([(t, 0.0005, 0.0) for t in ts if not any(e - lag - 0.05 < t < e + 0.05 for e, lag, _ in stalls)]
                  + stalls)
    return HealthSamples("", [r[0] for r in rows], [r[1] for r in rows], [5.0] * len(rows), [r[2] for r in rows])


def test_lag_between_requests_is_not_saturation() -> None:
    starts, firsts = _requests(6)
    # a 0.8 s stall in every gap between requests (the tool's own work between steps): 53% of the run
    stalls = [(f + 0.9, 0.8, 0.0) for f in firsts]
    h = summarize([_samples(stalls, 99.0, firsts[-1] + 2.0)], [0.0], (starts, firsts))
    assert h["loop_stall_frac"] > 0.15  # the old whole-run measure would have called it saturated
    assert h["first_token"]["share"] < 0.01 and h["first_token"]["stall_frac"] < 0.05
    assert h["saturated"] is False and h["processes"] == 1 and h["segments"] == 1


def test_lag_at_the_first_tokens_is_saturation_and_says_whose() -> None:
    starts, firsts = _requests(6)
    stalls = [(f, 0.2, 0.0) for f in firsts]  # each first token read at the end of a 0.2 s stall: 40% of TTFT
    h = summarize([_samples(stalls, 99.0, firsts[-1] + 1.0)], [0.0], (starts, firsts))
    assert h["first_token"]["share"] == pytest.approx(0.4) and h["first_token"]["own_share"] == pytest.approx(0.4)
    assert h["saturated"] is True and h["machine_starved"] is False and "client's own" in h["reason"]
    starved = [(f, 0.2, 0.18) for f in firsts]  # the same stalls, the loop runnable but given no CPU
    h = summarize([_samples(starved, 99.0, firsts[-1] + 1.0)], [0.0], (starts, firsts))
    assert h["saturated"] is True and h["machine_starved"] is True
    assert "the machine's doing" in h["reason"] and "another machine" in h["reason"]


def test_alongside_skips_with_notes(server):
    a = Alongside(metrics_url=server.base + "/metrics", gpu=True, metrics_interval_s=0.05)
    a.start()
    time.sleep(0.15)
    notes = a.stop(None)
    assert "prometheus" in notes and "nvml" in notes
    nv = notes["nvml"]
    assert isinstance(nv, dict) or nv.startswith("skipped")
    a = Alongside(metrics_url="http://127.0.0.1:1/metrics")
    a.start()
    assert "prometheus" in a.stop(None)


def test_stopping_the_monitor_keeps_an_interrupt() -> None:
    """Ctrl-C cancels the main task; if it lands while the monitor's stop() awaits the sampler it
    cancelled, stop() must pass the cancellation on, not swallow it as the sampler's (ttft diagnose
    then ran every step instead of stopping)."""
    import asyncio

    from collectors.probe.health import HealthMonitor

    async def main() -> None:
        mon = HealthMonitor()
        mon.start()
        await asyncio.sleep(0.05)
        stopping = asyncio.create_task(mon.stop())
        await asyncio.sleep(0)  # stop() has cancelled the sampler and awaits it
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        calm = HealthMonitor()
        calm.start()
        await asyncio.sleep(0.05)
        assert (await calm.stop()).wall_s > 0  # without an interrupt: the samples, as before

    asyncio.run(main())


def _monitor_for(seconds: float) -> HealthSamples:
    async def go() -> HealthSamples:
        mon = HealthMonitor(interval_s=0.02)
        mon.start()
        await asyncio.sleep(seconds)
        return await mon.stop()

    return asyncio.run(go())


@pytest.mark.slow
@pytest.mark.skipif(runq_wait_s() is None, reason="the OS does not report a thread's run-queue wait")
def test_other_processes_starving_the_loop_are_the_machines_doing_a_busy_thread_of_its_own_is_not() -> None:
    """Processes spinning on every CPU make the loop wait for a CPU: the machine's part. A thread
    of the client's own that holds the GIL makes it wait too: the client's own."""
    import os
    import subprocess
    import sys
    import threading

    spin = [sys.executable, "-c", "import time\nend = time.time() + 4\nwhile time.time() < end: pass"]
    # six per CPU: with three, the scheduler favoured the mostly sleeping loop enough to leave ~0.05 s lag
    hogs = [subprocess.Popen(spin) for _ in range(6 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.3)
        s = _monitor_for(2.0)
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    lag, starved = sum(s.lag_s), sum(s.starved_s)
    assert lag > 0.05, "the spinning processes did not delay the loop"
    assert starved >= 0.5 * lag, (starved, lag)

    stop = threading.Event()

    def hog() -> None:
        x = 0
        while not stop.is_set():
            for i in range(20000):
                x ^= i

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    t = threading.Thread(target=hog, daemon=True)
    t.start()
    try:
        s = _monitor_for(2.0)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    lag, starved = sum(s.lag_s), sum(s.starved_s)
    assert lag > 0.2, "the busy thread did not delay the loop"
    assert starved <= 0.3 * lag, (starved, lag)
