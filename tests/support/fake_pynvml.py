"""A fake ``pynvml`` module for the NVML sampler's tests and benchmark.

It re-exports the real nvidia-ml-py constants, error classes and ctypes structs (importing
``pynvml`` needs no driver), and answers the calls the sampler makes from a list of
:class:`FakeGpu` over a :class:`FakeClock`:

* NVLink and PCIe counters are monotonic functions of the fake time, refreshed by the "driver"
  every ``counter_period_s`` and stamped with that refresh time (µs), so a rate is exact only
  when computed over the field timestamps, not over the sampler's clock;
* each field value carries its own ``nvmlReturn`` (``field_errors``);
* calls a GPU does not support raise the real ``NVMLError_NotSupported``; functions listed in
  ``missing`` raise ``NVMLError_FunctionNotFound`` (an older driver);
* ``calls`` counts every call by name, so tests can check nothing is retried every sample.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import ctypes

import numpy as np
import pynvml as _real

KIB = 1024


_F = _real.c_nvmlFieldValue_t
_FIELD_DTYPE = np.dtype({
    "names": ["fid", "scope", "ts", "vtype", "ret", "val"],
    "formats": [np.uint32, np.uint32, np.int64, np.uint32, np.uint32, np.uint64],
    "offsets": [_F.fieldId.offset, _F.scopeId.offset, _F.timestamp.offset, _F.valueType.offset,
                _F.nvmlReturn.offset, _F.value.offset],
    "itemsize": ctypes.sizeof(_F),
})


class FakeClock:
    """Unix seconds that move only when told to."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, dt_s: float) -> None:
        self.now_s += dt_s


@dataclass
class FakeGpu:
    """One fake GPU. Rates are per link (NVLink, KiB/s) or per device (PCIe, bytes/s)."""

    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int = 80 * 2**30
    memory_used_bytes: int = 21 * 2**30
    gpu_util_pct: int = 87
    mem_util_pct: int = 41
    nvlink_links: int = 4  # active links; 0 = no NVLink (NotSupported)
    nvlink_tx_kib_per_s: float = 1000.0  # link l sends (l + 1) × this
    nvlink_rx_kib_per_s: float = 500.0
    pcie_counters: bool = True  # NVML_FI_DEV_PCIE_COUNT_*_BYTES supported
    pcie_tx_bytes_per_s: float = 3.0e9
    pcie_rx_bytes_per_s: float = 1.5e9
    pcie_tx_kb_per_s: int = 2000  # nvmlDeviceGetPcieThroughput answer
    pcie_rx_kb_per_s: int = 1000
    sm_clock_mhz: int = 1980
    power_mw: int = 350_000
    temperature_c: int = 61
    clock_event_reasons: int = 0x4  # SwPowerCap
    gpm_supported: bool = True
    gpm_values: dict[int, float] = field(
        default_factory=lambda: {10: 55.5, 2: 80.0, 5: 62.5}  # DRAM_BW, SM, ANY_TENSOR
    )
    unsupported: set[str] = field(default_factory=set)  # function names -> NotSupported
    field_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (fid, scope) -> code
    gpm_metric_errors: dict[int, int] = field(default_factory=dict)  # metric id -> code
    pci_switch: int = 0  # GPUs on the same switch are PIX, else PHB
    index: int = -1


@dataclass
class _GpmSample:
    gpu: FakeGpu | None = None
    t_s: float = math.nan


class _GpmMetric:
    __slots__ = ("metricId", "nvmlReturn", "value")

    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class FakeGpmMetricsGet:
    """Stands in for ``c_nvmlGpmMetricsGet_t`` (the real one needs real sample pointers)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = [_GpmMetric() for _ in range(_real.NVML_GPM_METRIC_MAX)]


def _error(code: int) -> Exception:
    return _real.NVMLError(code)  # maps to the right subclass, e.g. NVMLError_NotSupported


class FakeNvml:
    """The module object the sampler receives as ``nvml=``."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        clock: FakeClock,
        *,
        missing: set[str] | None = None,
        init_error: int | None = None,
        nvlink_pairs: set[frozenset[int]] | None = None,
        counter_period_s: float = 0.02,
        fast_path: bool = True,
    ) -> None:
        for name in dir(_real):
            if name.startswith(("NVML_", "NVMLError", "c_nvml", "nvmlMemory_v")):
                setattr(self, name, getattr(_real, name))
        self.c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet
        self.gpus = gpus
        for i, g in enumerate(gpus):
            g.index = i
        self.clock = clock
        self.missing = set(missing or ())
        self.init_error = init_error
        self.nvlink_pairs = nvlink_pairs if nvlink_pairs is not None else {
            frozenset((a.index, b.index)) for a in gpus for b in gpus
            if a.index < b.index and a.nvlink_links and b.nvlink_links
        }
        self.counter_period_s = counter_period_s
        self.fast_path = fast_path  # offer _nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        self.boot_s = clock() - 3600.0  # counters count from the (fake) boot
        self.calls: collections.Counter[str] = collections.Counter()
        self.field_requests: dict[int, list[Any]] = {}  # GPU index -> last field-id request
        self.initialized = False
        self.gpm_live = 0  # allocated GPM samples not yet freed

    # --- plumbing -------------------------------------------------------------------------

    def _enter(self, fn: str, gpu: FakeGpu | None = None) -> None:
        self.calls[fn] += 1
        if fn in self.missing:
            raise _error(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if fn not in ("nvmlInit", "nvmlShutdown") and not self.initialized:
            raise _error(_real.NVML_ERROR_UNINITIALIZED)
        if gpu is not None and fn in gpu.unsupported:
            raise _error(_real.NVML_ERROR_NOT_SUPPORTED)

    def _refresh_us(self) -> int:
        """The driver's last counter refresh time, integer µs (counters move in steps)."""
        now_us = round(self.clock() * 1e6)
        p = round(self.counter_period_s * 1e6)
        return now_us // p * p if p > 0 else now_us

    # --- init -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise _error(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return "12.550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        return self.gpus[i]

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return f"GPU-fake-{h.index:04d}"

    # --- per-sample calls -----------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: int | None = None) -> Any:
        if version:
            self._enter("nvmlDeviceGetMemoryInfo_v2", h)
            m = _real.c_nvmlMemory_v2_t()
            m.version = version
            m.reserved = 512 * 2**20
        else:
            self._enter("nvmlDeviceGetMemoryInfo", h)
            m = _real.c_nvmlMemory_t()
        m.total = h.memory_total_bytes
        m.used = h.memory_used_bytes
        m.free = h.memory_total_bytes - h.memory_used_bytes
        return m

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        u = _real.c_nvmlUtilization_t()
        u.gpu = h.gpu_util_pct
        u.memory = h.mem_util_pct
        return u

    def _field(self, h: FakeGpu, fid: int, scope: int, t_us: int) -> tuple[int, int, str]:
        """(nvmlReturn, value, union member) of one field, t_us after boot (integer maths)."""
        err = h.field_errors.get((fid, scope))
        if err is not None:
            return err, 0, "ullVal"
        if fid == _real.NVML_FI_DEV_NVLINK_LINK_COUNT:
            if not h.nvlink_links:
                return _real.NVML_ERROR_NOT_SUPPORTED, 0, "uiVal"
            return 0, h.nvlink_links, "uiVal"
        if fid in (_real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            if scope >= h.nvlink_links:
                return _real.NVML_ERROR_NOT_SUPPORTED, 0, "ullVal"
            rate = h.nvlink_tx_kib_per_s if fid == _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else h.nvlink_rx_kib_per_s
            return 0, int(rate) * (scope + 1) * t_us // 1_000_000, "ullVal"
        if fid in (_real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
            if not h.pcie_counters:
                return _real.NVML_ERROR_NOT_SUPPORTED, 0, "ullVal"
            rate = h.pcie_tx_bytes_per_s if fid == _real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES else h.pcie_rx_bytes_per_s
            return 0, int(rate) * t_us // 1_000_000, "ullVal"
        return _real.NVML_ERROR_NOT_SUPPORTED, 0, "ullVal"

    def _fill(self, h: FakeGpu, out: Any) -> None:
        """Answer every request in a ``c_nvmlFieldValue_t`` array (fieldId/scopeId set)."""
        n = len(out)
        view = np.frombuffer(out, dtype=_FIELD_DTYPE)
        self.field_requests[h.index] = list(zip(view["fid"].tolist(), view["scope"].tolist()))
        t_us = self._refresh_us()
        since_boot_us = t_us - round(self.boot_s * 1e6)
        rets, vals, types = [], [], []
        for fid, scope in zip(view["fid"].tolist(), view["scope"].tolist()):
            ret, value, member = self._field(h, fid, scope, since_boot_us)
            rets.append(ret)
            vals.append(value)
            types.append(_real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG if member == "ullVal"
                         else _real.NVML_VALUE_TYPE_UNSIGNED_INT)
        view["ret"] = rets
        view["val"] = vals
        view["vtype"] = types
        view["ts"] = np.full(n, t_us, dtype=np.int64)

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, field_ids: list[Any]) -> Any:
        """The public call: a fresh ctypes array (``c_nvmlFieldValue_t``), like nvidia-ml-py."""
        self._enter("nvmlDeviceGetFieldValues", h)
        out = (_real.c_nvmlFieldValue_t * len(field_ids))()
        for i, f in enumerate(field_ids):
            fid, scope = (f if isinstance(f, tuple) else (f, 0))
            out[i].fieldId, out[i].scopeId = fid, scope
        self._fill(h, out)
        return out

    def _nvmlGetFunctionPointer(self, name: str) -> Callable[..., int]:
        """The binding's private entry-point lookup; only the field-values C function is faked:
        ``fn(handle, c_int32(n), byref(array)) -> nvmlReturn``, filling the caller's array."""
        self._enter("_nvmlGetFunctionPointer")
        if not self.fast_path or name != "nvmlDeviceGetFieldValues":
            raise _error(_real.NVML_ERROR_FUNCTION_NOT_FOUND)

        def c_field_values(h: FakeGpu, n: Any, ref: Any) -> int:
            self.calls["nvmlDeviceGetFieldValues[C entry point]"] += 1
            try:
                self._enter("nvmlDeviceGetFieldValues", h)
            except _real.NVMLError as err:
                return err.value
            arr = ref._obj
            assert n.value == len(arr)
            self._fill(h, arr)
            return _real.NVML_SUCCESS

        return c_field_values

    def nvmlDeviceGetPcieThroughput(self, h: FakeGpu, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", h)
        return h.pcie_tx_kb_per_s if counter == _real.NVML_PCIE_UTIL_TX_BYTES else h.pcie_rx_kb_per_s

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock_type: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        return h.sm_clock_mhz

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        return h.temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.clock_event_reasons

    # --- NVLink / topology ----------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", h)
        if not h.nvlink_links:
            raise _error(_real.NVML_ERROR_NOT_SUPPORTED)
        if link >= _real.NVML_NVLINK_MAX_LINKS:
            raise _error(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _real.NVML_FEATURE_ENABLED if link < h.nvlink_links else _real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetP2PStatus(self, a: FakeGpu, b: FakeGpu, index: int) -> int:
        self._enter("nvmlDeviceGetP2PStatus", a)
        if index == _real.NVML_P2P_CAPS_INDEX_NVLINK:
            ok = frozenset((a.index, b.index)) in self.nvlink_pairs
            return _real.NVML_P2P_STATUS_OK if ok else _real.NVML_P2P_STATUS_NOT_SUPPORTED
        return _real.NVML_P2P_STATUS_OK

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeGpu, b: FakeGpu) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor", a)
        return _real.NVML_TOPOLOGY_SINGLE if a.pci_switch == b.pci_switch else _real.NVML_TOPOLOGY_HOSTBRIDGE

    # --- GPM ------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=1 if h.gpm_supported else 0)

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._enter("nvmlGpmSampleAlloc")
        self.gpm_live += 1
        return _GpmSample()

    def nvmlGpmSampleFree(self, s: _GpmSample) -> None:
        self._enter("nvmlGpmSampleFree")
        self.gpm_live -= 1

    def nvmlGpmSampleGet(self, h: FakeGpu, s: _GpmSample) -> _GpmSample:
        self._enter("nvmlGpmSampleGet", h)
        if not h.gpm_supported:
            raise _error(_real.NVML_ERROR_NOT_SUPPORTED)
        s.gpu, s.t_s = h, self.clock()
        return s

    def nvmlGpmMetricsGet(self, mg: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        self._enter("nvmlGpmMetricsGet")
        s1, s2 = mg.sample1, mg.sample2
        if (mg.version != _real.NVML_GPM_METRICS_GET_VERSION or s1 is None or s2 is None
                or s1 is s2 or s1.gpu is not s2.gpu or not s2.t_s > s1.t_s):
            raise _error(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = s1.gpu
        assert gpu is not None
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            err = gpu.gpm_metric_errors.get(m.metricId)
            m.nvmlReturn = err if err is not None else 0
            m.value = 0.0 if err is not None else gpu.gpm_values.get(m.metricId, 0.0)
        return mg


def make_fake(
    n_gpus: int = 3,
    clock: FakeClock | None = None,
    **kwargs: Any,
) -> tuple[FakeNvml, FakeClock]:
    """The standard test rig: GPU0/1 with 4 NVLink links and GPM, GPU2 (an "L4") with no
    NVLink, no GPM, no PCIe counters and no power reading; more GPUs repeat GPU0's shape."""
    clock = clock or FakeClock()
    gpus: list[FakeGpu] = []
    for i in range(n_gpus):
        if i == 2:
            gpus.append(FakeGpu(
                name="NVIDIA L4", memory_total_bytes=24 * 2**30, memory_used_bytes=2**30,
                nvlink_links=0, gpm_supported=False, pcie_counters=False,
                unsupported={"nvmlDeviceGetPowerUsage"}, pci_switch=1,
            ))
        else:
            gpus.append(FakeGpu(nvlink_tx_kib_per_s=1000.0 * (i + 1)))
    return FakeNvml(gpus, clock, **kwargs), clock


def eight_h100(clock: FakeClock | None = None, links: int = 18) -> tuple[FakeNvml, FakeClock]:
    """An HGX-like box for the benchmark: 8 × H100, 18 NVLink links each, GPM on."""
    clock = clock or FakeClock()
    gpus = [FakeGpu(nvlink_links=links) for _ in range(8)]
    return FakeNvml(gpus, clock), clock


Factory = Callable[..., tuple[FakeNvml, FakeClock]]
