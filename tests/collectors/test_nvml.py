"""NVML sampler against a fake pynvml (and the real one: no driver here; a GPU where marked)."""

from __future__ import annotations

import json
import sys
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.base import SeriesCollector
from collectors.nvml import NvmlSampler
from diag.ground import stages as S

from support.fake_pynvml import FakeClock, FakeGpu, FakeNvml, make_fake

KIB = 1024.0


def rows(df: pd.DataFrame, series: str, entity: str) -> pd.Series:
    return df[(df.series == series) & (df.entity == entity)].value


def run(sampler: NvmlSampler, clock: FakeClock, n: int, dt_s: float = 0.1037) -> None:
    for _ in range(n):
        sampler.sample_once()
        clock.advance(dt_s)


@pytest.fixture
def rig():
    fake, clock = make_fake(3)
    s = NvmlSampler(nvml=fake, clock=clock)
    yield fake, clock, s
    s.stop()


def test_frame_shape_and_basic_values(rig):
    fake, clock, s = rig
    assert s.available and s.note.startswith("NVML: 3 GPU(s)")
    t0 = clock()
    run(s, clock, 3)
    df = s.collect()
    assert tuple(df.columns) == S.SERIES_COLUMNS
    assert set(df.source) == {"nvml"}
    assert df.ts_s.min() == pytest.approx(t0)
    assert list(rows(df, S.SERIES_HBM_TOTAL_BYTES, "gpu0")) == [80 * 2**30] * 3
    assert list(rows(df, S.SERIES_HBM_USED_BYTES, "gpu2")) == [2**30] * 3
    assert list(rows(df, S.SERIES_GPU_UTIL_PCT, "gpu1")) == [87.0] * 3
    assert list(rows(df, S.SERIES_MEM_UTIL_PCT, "gpu1")) == [41.0] * 3
    assert list(rows(df, S.SERIES_POWER_W, "gpu0")) == [350.0] * 3  # mW -> W
    assert list(rows(df, S.SERIES_SM_CLOCK_MHZ, "gpu0")) == [1980.0] * 3
    assert list(rows(df, S.SERIES_TEMPERATURE_C, "gpu0")) == [61.0] * 3
    assert list(rows(df, S.SERIES_CLOCK_EVENT_REASONS, "gpu0")) == [4.0] * 3
    # the v2 memory struct is used where the driver has it
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 9


def test_nvlink_and_pcie_rates_from_counter_deltas_over_field_timestamps(rig):
    fake, clock, s = rig
    # irregular intervals, counters refreshed by the "driver" every 20 ms: only rates over
    # the fields' own timestamps come out exact
    for dt in (0.1037, 0.0911, 0.25, 0.1, 0.0333):
        s.sample_once()
        clock.advance(dt)
    s.sample_once()
    df = s.collect()
    for gpu, base in (("gpu0", 1000.0), ("gpu1", 2000.0)):
        for link in range(4):
            tx = rows(df, S.SERIES_NVLINK_TX_BYTES_PER_S, f"{gpu}/nvlink{link}")
            rx = rows(df, S.SERIES_NVLINK_RX_BYTES_PER_S, f"{gpu}/nvlink{link}")
            assert len(tx) == 5 and len(rx) == 5  # no rate on the first sample
            assert tx.tolist() == pytest.approx([base * (link + 1) * KIB] * 5, rel=1e-9)
            assert rx.tolist() == pytest.approx([500.0 * (link + 1) * KIB] * 5, rel=1e-9)
        assert rows(df, S.SERIES_PCIE_TX_BYTES_PER_S, gpu).tolist() == pytest.approx([3.0e9] * 5, rel=1e-9)
        assert rows(df, S.SERIES_PCIE_RX_BYTES_PER_S, gpu).tolist() == pytest.approx([1.5e9] * 5, rel=1e-9)
    # no PCIe byte counters on gpu2: the throughput call (KB/s, KB = 1024 B) on every sample
    assert rows(df, S.SERIES_PCIE_TX_BYTES_PER_S, "gpu2").tolist() == [2000 * KIB] * 6
    assert rows(df, S.SERIES_PCIE_RX_BYTES_PER_S, "gpu2").tolist() == [1000 * KIB] * 6
    info = {g["entity"]: g for g in s.device_info()["gpus"]}
    assert info["gpu0"]["pcie_source"] == "field_counters"
    assert info["gpu2"]["pcie_source"] == "throughput"


class _PlainObjectsNvml(FakeNvml):
    """A binding that answers field values with plain Python objects (no ctypes array)."""

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        out = super().nvmlDeviceGetFieldValues(h, field_ids)
        return [SimpleNamespace(nvmlReturn=fv.nvmlReturn, timestamp=fv.timestamp,
                                value=SimpleNamespace(ullVal=fv.value.ullVal, uiVal=fv.value.uiVal))
                for fv in out]


@pytest.mark.parametrize("path", ["c_entry_point", "public_call", "plain_objects"])
def test_every_field_value_path_gives_the_same_rates(path):
    clock = FakeClock()
    cls = _PlainObjectsNvml if path == "plain_objects" else FakeNvml
    gpu0 = FakeGpu(field_errors={(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 1): pynvml.NVML_ERROR_NOT_SUPPORTED})
    fake = cls([gpu0, FakeGpu(nvlink_links=0, pcie_counters=False)], clock,
               fast_path=(path == "c_entry_point"))
    s = NvmlSampler(nvml=fake, clock=clock)
    run(s, clock, 4)
    df = s.collect()
    assert rows(df, S.SERIES_NVLINK_TX_BYTES_PER_S, "gpu0/nvlink3").tolist() == pytest.approx([4000 * KIB] * 3)
    assert rows(df, S.SERIES_NVLINK_RX_BYTES_PER_S, "gpu0/nvlink1").empty
    assert rows(df, S.SERIES_PCIE_RX_BYTES_PER_S, "gpu0").tolist() == pytest.approx([1.5e9] * 3)
    assert s.not_supported()["gpu0"] == {"nvlink_rx_bytes_per_s[nvlink1]": "NVML_ERROR_NOT_SUPPORTED"}
    assert s.device_info()["gpus"][0]["nvlink_links"] == [0, 1, 2, 3]
    assert (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 1) not in fake.field_requests[0]
    assert (fake.calls["nvmlDeviceGetFieldValues[C entry point]"] > 0) == (path == "c_entry_point")
    s.stop()


def test_field_values_batched_in_one_call_per_device(rig):
    fake, clock, s = rig
    before = fake.calls["nvmlDeviceGetFieldValues"]
    s.sample_once()
    # gpu0 and gpu1: one call each for 4 links x TX/RX + PCIe TX/RX; gpu2 has no counters
    assert fake.calls["nvmlDeviceGetFieldValues"] - before == 2
    req = fake.field_requests[0]
    assert len(req) == 4 * 2 + 2
    assert (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 3) in req
    assert (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0) in req


@given(st.lists(st.floats(min_value=0.021, max_value=2.0), min_size=1, max_size=12))
@settings(max_examples=30, deadline=None)
def test_rates_exact_for_any_positive_intervals(dts):
    fake, clock = make_fake(2)
    s = NvmlSampler(nvml=fake, clock=clock)
    for dt in dts:
        s.sample_once()
        clock.advance(dt)
    s.sample_once()
    df = s.collect()
    tx = rows(df, S.SERIES_NVLINK_TX_BYTES_PER_S, "gpu1/nvlink2")
    # a sample that lands in the same 20 ms driver refresh as the previous one gives no row
    assert 1 <= len(tx) <= len(dts)
    assert tx.tolist() == pytest.approx([2000.0 * 3 * KIB] * len(tx), rel=1e-9)
    assert (df.value >= 0).all()
    s.stop()


def test_unrefreshed_counter_gives_no_row_never_zero(rig):
    fake, clock, s = rig
    s.sample_once()
    clock.advance(0.1)
    s.sample_once()
    s.sample_once()  # same instant: NVML has the same timestamp, so no new rate
    df = s.collect()
    tx = rows(df, S.SERIES_NVLINK_TX_BYTES_PER_S, "gpu0/nvlink0")
    assert tx.tolist() == pytest.approx([1000.0 * KIB])


def test_counter_reset_restarts_the_baseline(rig):
    fake, clock, s = rig
    run(s, clock, 2, 0.1)
    fake.boot_s = clock() - 1.0  # counters fall back (driver reload / wrap)
    run(s, clock, 3, 0.1)
    tx = rows(s.collect(), S.SERIES_NVLINK_TX_BYTES_PER_S, "gpu0/nvlink1")
    assert tx.tolist() == pytest.approx([2000.0 * KIB] * 3)  # the reset sample is skipped
    assert (tx > 0).all()


def test_unsupported_counters_reported_once_never_as_zero(rig):
    fake, clock, s = rig
    run(s, clock, 10)
    df = s.collect()
    g2 = df[df.entity.str.startswith("gpu2")]
    assert S.SERIES_POWER_W not in set(g2.series)
    assert not g2.series.isin([S.SERIES_NVLINK_TX_BYTES_PER_S, S.SERIES_NVLINK_RX_BYTES_PER_S,
                               S.SERIES_DRAM_BW_UTIL_PCT, S.SERIES_SM_UTIL_PCT,
                               S.SERIES_TENSOR_UTIL_PCT]).any()
    ns = s.not_supported()["gpu2"]
    assert "NOT_SUPPORTED" in ns[S.SERIES_POWER_W]
    assert "NOT_SUPPORTED" in ns[S.SERIES_NVLINK_TX_BYTES_PER_S]
    assert "GPM not supported" in ns[S.SERIES_DRAM_BW_UTIL_PCT]
    assert s.not_supported()["gpu0"] == {}
    # asked once (first sample), never retried: 10 samples x 2 good GPUs + 1
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 21
    assert fake.calls["nvmlGpmSampleGet"] == 20  # only the GPM-capable GPUs
    # GPM works on gpu0 from the second sample on
    assert rows(df, S.SERIES_DRAM_BW_UTIL_PCT, "gpu0").tolist() == [55.5] * 9
    assert rows(df, S.SERIES_SM_UTIL_PCT, "gpu0").tolist() == [80.0] * 9
    assert rows(df, S.SERIES_TENSOR_UTIL_PCT, "gpu0").tolist() == [62.5] * 9


def test_per_field_error_drops_only_that_field_and_stops_asking():
    clock = FakeClock()
    gpu0 = FakeGpu(field_errors={(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 2): pynvml.NVML_ERROR_NOT_SUPPORTED})
    fake = FakeNvml([gpu0, FakeGpu()], clock)
    s = NvmlSampler(nvml=fake, clock=clock)
    run(s, clock, 4)
    df = s.collect()
    assert rows(df, S.SERIES_NVLINK_TX_BYTES_PER_S, "gpu0/nvlink2").empty
    assert len(rows(df, S.SERIES_NVLINK_RX_BYTES_PER_S, "gpu0/nvlink2")) == 3
    assert len(rows(df, S.SERIES_NVLINK_TX_BYTES_PER_S, "gpu0/nvlink3")) == 3
    ns = s.not_supported()["gpu0"]
    assert ns == {"nvlink_tx_bytes_per_s[nvlink2]": "NVML_ERROR_NOT_SUPPORTED"}
    assert (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 2) not in fake.field_requests[0]
    s.stop()


def test_gpm_metric_error_drops_that_metric_only():
    clock = FakeClock()
    fake = FakeNvml([FakeGpu(gpm_metric_errors={pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: pynvml.NVML_ERROR_NOT_SUPPORTED})], clock)
    s = NvmlSampler(nvml=fake, clock=clock)
    run(s, clock, 4)
    df = s.collect()
    assert rows(df, S.SERIES_TENSOR_UTIL_PCT, "gpu0").empty
    assert rows(df, S.SERIES_DRAM_BW_UTIL_PCT, "gpu0").tolist() == [55.5] * 3
    assert "NOT_SUPPORTED" in s.not_supported()["gpu0"][S.SERIES_TENSOR_UTIL_PCT]
    s.stop()
    assert fake.gpm_live == 0  # GPM sample buffers freed


def test_missing_functions_fall_back_to_older_entry_points():
    fake, clock = make_fake(2, missing={"nvmlDeviceGetMemoryInfo_v2",
                                        "nvmlDeviceGetCurrentClocksEventReasons"})
    s = NvmlSampler(nvml=fake, clock=clock)
    run(s, clock, 5)
    df = s.collect()
    assert rows(df, S.SERIES_HBM_USED_BYTES, "gpu1").tolist() == [21 * 2**30] * 5
    assert rows(df, S.SERIES_CLOCK_EVENT_REASONS, "gpu1").tolist() == [4.0] * 5
    assert s.not_supported() == {"gpu0": {}, "gpu1": {}}
    # the missing entry points were tried once per GPU, then never again
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 2
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 2
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 10
    s.stop()


def test_missing_gpm_function_means_not_supported():
    fake, clock = make_fake(1, missing={"nvmlGpmQueryDeviceSupport"})
    s = NvmlSampler(nvml=fake, clock=clock)
    run(s, clock, 3)
    assert "FUNCTION_NOT_FOUND" in s.not_supported()["gpu0"][S.SERIES_SM_UTIL_PCT]
    assert rows(s.collect(), S.SERIES_SM_UTIL_PCT, "gpu0").empty
    s.stop()


def test_transient_errors_skip_samples_then_give_up_after_a_run(rig, monkeypatch):
    fake, clock, s = rig
    real_temp = fake.nvmlDeviceGetTemperature
    fail = {"n": 2}

    def flaky(h, sensor):
        if h.index == 0 and fail["n"] > 0:
            fail["n"] -= 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real_temp(h, sensor)

    monkeypatch.setattr(fake, "nvmlDeviceGetTemperature", flaky)
    run(s, clock, 4)
    assert rows(s.collect(), S.SERIES_TEMPERATURE_C, "gpu0").tolist() == [61.0] * 2
    assert S.SERIES_TEMPERATURE_C not in s.not_supported()["gpu0"]
    fail["n"] = 100
    run(s, clock, 8)
    reason = s.not_supported()["gpu0"][S.SERIES_TEMPERATURE_C]
    assert reason.startswith("failed 5 times in a row")
    assert fail["n"] == 95  # given up: not asked any more
    assert len(rows(s.collect(), S.SERIES_TEMPERATURE_C, "gpu1")) == 12


def test_collect_new_returns_only_new_rows(rig):
    fake, clock, s = rig
    assert s.collect_new().empty
    run(s, clock, 2)
    a = s.collect_new()
    run(s, clock, 3)
    b = s.collect_new()
    assert s.collect_new().empty
    assert a.ts_s.nunique() == 2 and b.ts_s.nunique() == 3
    assert a.ts_s.max() < b.ts_s.min()
    assert len(s.collect()) == len(a) + len(b)


def test_many_samples_cross_buffer_chunks(rig):
    fake, clock, s = rig
    run(s, clock, 1100, 0.1)
    first = s.collect_new()
    run(s, clock, 30, 0.1)
    df = s.collect()
    assert df.ts_s.nunique() == 1130
    assert len(df) == len(first) + len(s.collect_new())
    power = rows(df, S.SERIES_POWER_W, "gpu1")
    assert len(power) == 1130 and (power == 350.0).all()


def test_topology_and_device_info_are_json_ready(rig):
    fake, clock, s = rig
    info = s.device_info()
    json.dumps(info)
    topo = {(t["a"], t["b"]): t for t in info["topology"]}
    assert topo[("gpu0", "gpu1")]["link"] == "nvlink"
    assert topo[("gpu0", "gpu2")]["link"] == "pcie"
    assert topo[("gpu0", "gpu2")]["pcie_level"] == "PHB"
    assert topo[("gpu0", "gpu1")]["pcie_level"] == "PIX"
    gpus = info["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA L4"]
    assert gpus[2]["memory_total_bytes"] == 24 * 2**30
    assert gpus[0]["nvlink_links"] == [0, 1, 2, 3] and gpus[2]["nvlink_links"] == []
    assert gpus[0]["gpm_supported"] and not gpus[2]["gpm_supported"]
    assert info["driver_version"] == "550.54.15"


def test_background_thread_samples_and_stops_cleanly():
    fake, _clock = make_fake(3)
    s = NvmlSampler(interval_s=0.01, nvml=fake)  # real clock, real thread
    t0 = time.time()
    s.start()
    s.start()  # idempotent
    deadline = time.monotonic() + 5.0
    got = []
    while time.monotonic() < deadline and s.samples_taken < 8:
        got.append(s.collect_new())  # concurrent with the sampling thread
        time.sleep(0.01)
    s.stop()
    s.stop()
    got.append(s.collect_new())
    assert s.samples_taken >= 8
    df = pd.concat(got)
    assert df.ts_s.nunique() == s.samples_taken
    assert t0 <= df.ts_s.min() <= time.time()
    assert not any(t.name == "nvml-sampler" for t in threading.enumerate())
    assert fake.gpm_live == 0 and not fake.initialized  # GPM freed, NVML shut down
    assert s.device_info()["sampler_cpu_s"] > 0
    s.sample_once()  # after stop: a no-op, no crash
    assert s.samples_taken == df.ts_s.nunique()


def test_sampler_is_a_series_collector_start_collect_stop():
    fake, _clock = make_fake(2)
    s = NvmlSampler(interval_s=0.01, nvml=fake)  # fake pynvml; real clock, real thread
    assert isinstance(s, SeriesCollector)
    assert s.collect().empty and tuple(s.collect().columns) == S.SERIES_COLUMNS
    s.start()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and s.samples_taken < 3:
        time.sleep(0.01)
    during = s.collect()  # while the thread samples
    s.stop()
    s.stop()  # idempotent
    df = s.collect()
    assert s.samples_taken >= 3 and len(during) > 0
    assert tuple(df.columns) == S.SERIES_COLUMNS and set(df.source) == {"nvml"}
    assert df.ts_s.nunique() == s.samples_taken  # collect() is every row so far, not only new ones
    assert df.iloc[: len(during)].equals(during) and s.collect().equals(df)


# --- no driver / no library / no GPU ---------------------------------------------------------


def _assert_unavailable(s: NvmlSampler) -> None:
    assert s.available is False
    assert s.note.startswith("NVML unavailable: ")
    assert "\n" not in s.note
    n = threading.active_count()
    s.start()
    assert threading.active_count() == n and s._thread is None
    s.sample_once()
    assert tuple(s.collect().columns) == S.SERIES_COLUMNS and s.collect().empty
    assert s.collect_new().empty
    json.dumps(s.device_info())
    s.stop()


def test_real_pynvml_without_driver_gives_a_note_not_a_crash():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    s = NvmlSampler()
    _assert_unavailable(s)
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in s.note or "DRIVER" in s.note


def test_fake_driver_not_loaded():
    fake, clock = make_fake(2, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    s = NvmlSampler(nvml=fake, clock=clock)
    _assert_unavailable(s)
    assert "NVML_ERROR_DRIVER_NOT_LOADED" in s.note


def test_binding_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    s = NvmlSampler()
    _assert_unavailable(s)
    assert "nvidia-ml-py is not installed" in s.note


def test_a_gpu_without_permission_is_skipped(monkeypatch):
    fake, clock = make_fake(2)
    real = fake.nvmlDeviceGetHandleByIndex

    def handle(i):
        if i == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return real(i)

    monkeypatch.setattr(fake, "nvmlDeviceGetHandleByIndex", handle)
    s = NvmlSampler(nvml=fake, clock=clock)
    assert s.available
    run(s, clock, 2)
    assert set(s.collect().entity.str.split("/").str[0]) == {"gpu1"}
    (warning,) = s.device_info()["warnings"]
    assert warning.startswith("gpu0 skipped: NVML_ERROR_NO_PERMISSION")
    s.stop()


def test_no_gpu():
    fake, clock = make_fake(0)
    s = NvmlSampler(nvml=fake, clock=clock)
    _assert_unavailable(s)
    assert "no GPU" in s.note
    assert not fake.initialized  # shut down again


def test_bad_arguments():
    fake, clock = make_fake(2)
    with pytest.raises(ValueError):
        NvmlSampler(interval_s=0, nvml=fake, clock=clock)
    with pytest.raises(ValueError, match="out of range"):
        NvmlSampler(nvml=fake, clock=clock, device_indices=[5])
    s = NvmlSampler(nvml=fake, clock=clock, device_indices=[1])
    run(s, clock, 2)
    assert set(s.collect().entity.str.split("/").str[0]) == {"gpu1"}
    s.stop()


# --- a real GPU --------------------------------------------------------------------------------


def _hold_gpu_memory(n_bytes: int) -> list:  # noqa: ANN202
    """One tensor of ``n_bytes`` on every CUDA device torch sees (none without CUDA torch): an idle
    GPU reports 0 bytes used (H200 under the device tool: 0.00 GiB), so the sampler is checked
    against memory the test holds."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.empty(n_bytes, dtype=torch.uint8, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]


@pytest.mark.gpu
def test_real_gpu_sampler():
    s = NvmlSampler(interval_s=0.05)
    if not s.available:
        pytest.skip(s.note)
    held_bytes = 1 << 30
    held = _hold_gpu_memory(held_bytes)
    s.start()
    time.sleep(1.0)
    s.stop()
    held_all = len(held) == len(s.device_info()["gpus"])  # torch sees every GPU NVML does
    del held
    df = s.collect()
    info = s.device_info()
    print(json.dumps(info, indent=1))
    print(df.groupby(["series", "entity"]).value.agg(["count", "min", "max"]).to_string())
    assert s.samples_taken >= 10
    for gpu in info["gpus"]:
        e = gpu["entity"]
        used = rows(df, S.SERIES_HBM_USED_BYTES, e)
        assert len(used) >= 10 and (used >= 0).all()
        if held_all:  # the tensor this test held on that GPU is in what NVML reports used
            assert (used >= held_bytes).all(), used.describe()
        assert (rows(df, S.SERIES_HBM_TOTAL_BYTES, e) == gpu["memory_total_bytes"]).all()
        got = set(df[df.entity.str.split("/").str[0] == e].series)
        for series in (S.SERIES_GPU_UTIL_PCT, S.SERIES_SM_CLOCK_MHZ, S.SERIES_TEMPERATURE_C):
            assert series in got or series in gpu["not_supported"], series
    assert (df.value >= 0).all()
