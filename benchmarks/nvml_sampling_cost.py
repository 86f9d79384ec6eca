"""NVML sampling cost with the fake pynvml: 8 GPUs, 18 NVLink links each, GPM on.

Budget (docs/design.md): 10 Hz on 8 GPUs for < 2% of one core.

Three figures, all CPU time (``time.process_time``/``thread_time``), min over repeats:
* sampler    - ``NvmlSampler.sample_once()`` (fake NVML calls + our logic + buffering);
* baseline   - the same fake calls made directly, no sampler logic (what any sampler pays):
               field values into a prebuilt array through the C entry point, results unread;
* threaded   - the real background thread at 10 Hz for a few seconds: its CPU seconds per
               wall second, i.e. including wake-ups.
With a real driver the NVML calls themselves replace the fake's; the sampler's own share is
(sampler - baseline).

    PYTHONPATH=. python benchmarks/nvml_sampling_cost.py [--gpus 8] [--links 18] [--samples 2000]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # support.fake_pynvml

from support.fake_pynvml import FakeClock, FakeGpu, FakeNvml  # noqa: E402

from collectors.nvml import NvmlSampler  # noqa: E402

BUDGET_PCT = 2.0
RATE_HZ = 10.0


def make(n_gpus: int, links: int) -> tuple[FakeNvml, FakeClock]:
    clock = FakeClock()
    return FakeNvml([FakeGpu(nvlink_links=links) for _ in range(n_gpus)], clock), clock


def sampler_cpu_per_sample_s(n_gpus: int, links: int, n: int) -> tuple[float, int]:
    fake, clock = make(n_gpus, links)
    s = NvmlSampler(nvml=fake, clock=clock)
    for _ in range(20):  # warm-up: first samples build baselines
        s.sample_once()
        clock.advance(0.1)
    c0 = time.process_time()
    for _ in range(n):
        s.sample_once()
        clock.advance(0.1)
    per = (time.process_time() - c0) / n
    rows = len(s.to_frame()) // (n + 20)
    s.stop()
    return per, rows


def baseline_cpu_per_sample_s(n_gpus: int, links: int, n: int) -> float:
    """The same fake calls, made directly, results read and dropped."""
    fake, clock = make(n_gpus, links)
    nv = fake
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n_gpus)]
    fields = [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, k) for k in range(links)]
    fields += [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, k) for k in range(links)]
    fields += [(nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0), (nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0)]
    # field values the cheapest way the binding allows: a prebuilt array, the C entry point
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    arrays = []
    for _h in handles:
        arr = (nv.c_nvmlFieldValue_t * len(fields))()
        for i, (fid, scope) in enumerate(fields):
            arr[i].fieldId, arr[i].scopeId = fid, scope
        arrays.append((arr, ctypes.byref(arr), ctypes.c_int32(len(fields))))
    gpm = []
    for h in handles:
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 3
        for i, mid in enumerate((10, 2, 5)):
            mg.metrics[i].metricId = mid
        gpm.append([nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc(), mg])

    def once(first: bool) -> None:
        for h, g, (arr, ref, n_c) in zip(handles, gpm, arrays):
            nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used
            nv.nvmlDeviceGetUtilizationRates(h).gpu
            fn(h, n_c, ref)
            nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
            nv.nvmlDeviceGetPowerUsage(h)
            nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            nv.nvmlDeviceGetCurrentClocksEventReasons(h)
            nv.nvmlGpmSampleGet(h, g[1])
            if not first:
                g[2].sample1, g[2].sample2 = g[0], g[1]
                nv.nvmlGpmMetricsGet(g[2])
            g[0], g[1] = g[1], g[0]

    once(True)
    clock.advance(0.1)
    c0 = time.process_time()
    for _ in range(n):
        once(False)
        clock.advance(0.1)
    return (time.process_time() - c0) / n


def threaded_pct_of_core(n_gpus: int, links: int, seconds: float) -> tuple[float, int]:
    fake, _ = make(n_gpus, links)
    s = NvmlSampler(interval_s=1.0 / RATE_HZ, nvml=fake)  # real clock, real thread
    w0 = time.monotonic()
    s.start()
    time.sleep(seconds)
    s.stop()
    wall = time.monotonic() - w0
    return 100.0 * s.sampler_cpu_s / wall, s.samples_taken


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--links", type=int, default=18)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--thread-seconds", type=float, default=5.0)
    a = ap.parse_args()

    sam, rows = min(sampler_cpu_per_sample_s(a.gpus, a.links, a.samples) for _ in range(a.repeats))
    base = min(baseline_cpu_per_sample_s(a.gpus, a.links, a.samples) for _ in range(a.repeats))
    thr_pct, thr_n = threaded_pct_of_core(a.gpus, a.links, a.thread_seconds)
    pct = 100.0 * sam * RATE_HZ
    own_pct = 100.0 * max(sam - base, 0.0) * RATE_HZ
    print(f"NVML sampling cost (fake pynvml): {a.gpus} GPUs x {a.links} NVLink links, GPM on, "
          f"{rows} rows/sample")
    print(f"  sampler   {sam * 1e6:8.1f} us CPU/sample -> {pct:.3f}% of one core at {RATE_HZ:g} Hz")
    print(f"  baseline  {base * 1e6:8.1f} us CPU/sample (the fake's calls alone) "
          f"-> {100.0 * base * RATE_HZ:.3f}%")
    print(f"  ratio sampler/baseline: {sam / base:.2f}x; sampler's own logic: "
          f"{(sam - base) * 1e6:.1f} us/sample = {own_pct:.3f}% of one core")
    print(f"  threaded  {thr_pct:.3f}% of one core measured over {a.thread_seconds:g} s "
          f"({thr_n} samples)")
    ok = pct < BUDGET_PCT and thr_pct < BUDGET_PCT
    print(f"budget < {BUDGET_PCT}% of one core: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
