"""Client health: loop lag, CPU, saturation verdict; the alongside hooks skip cleanly."""

from __future__ import annotations

import asyncio
import time

import pytest

from collectors.probe.alongside import Alongside
from collectors.probe.health import HealthMonitor, HealthSamples, summarize


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
    assert set(frame["source"]) == {"client"} and len(frame) == 2 * len(s.ts_s)


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
