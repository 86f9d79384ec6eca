"""NVML sampler: per-GPU counters on a background thread, as long time-series rows.

Front door: :class:`NvmlSampler`. It talks to NVML only through the ``pynvml`` module of
``nvidia-ml-py``, which is injected (``nvml=``) so that tests pass a fake; the timestamp
clock is injected too (``clock=``, Unix seconds).

Rows follow :data:`diag.stages.SERIES_COLUMNS` = (ts_s, source="nvml", series, entity, value):

========================  ===============  ==================================================
series                    entity           what / unit
========================  ===============  ==================================================
hbm_used_bytes            gpu0             ``nvmlDeviceGetMemoryInfo`` v2 (v1 fallback), bytes
hbm_total_bytes           gpu0             same call, bytes
gpu_util_pct              gpu0             ``nvmlDeviceGetUtilizationRates().gpu``, %
mem_util_pct              gpu0             ``.memory``: memory-controller duty cycle, %
nvlink_tx_bytes_per_s     gpu0/nvlink3     Δ NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (KiB) over
nvlink_rx_bytes_per_s     gpu0/nvlink3     Δ of its own field timestamps (µs), bytes/s
pcie_tx_bytes_per_s       gpu0             Δ NVML_FI_DEV_PCIE_COUNT_TX_BYTES over Δ timestamp
pcie_rx_bytes_per_s       gpu0             where supported, else nvmlDeviceGetPcieThroughput
                                           (KB/s over NVML's 20 ms window, KB = 1024 B)
sm_clock_mhz              gpu0             ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``, MHz
power_w                   gpu0             ``nvmlDeviceGetPowerUsage`` mW / 1000, W
temperature_c             gpu0             ``nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)``
clock_event_reasons       gpu0             ``nvmlDeviceGetCurrentClocksEventReasons`` bitmask
                                           (fallback: ``...ThrottleReasons``), as a float
dram_bw_util_pct          gpu0             GPM (Hopper+) DRAM bandwidth used / peak, %
sm_util_pct               gpu0             GPM SM utilisation, %
tensor_util_pct           gpu0             GPM any-tensor-pipe utilisation, %
========================  ===============  ==================================================

Rates need two readings, so the first sample carries no NVLink/PCIe-counter/GPM rows.
A counter that a GPU does not support (or a function its driver lacks) is recorded once in
that GPU's ``not_supported`` dict (series -> reason, see :meth:`NvmlSampler.device_info`),
is never emitted as a row (never as zero) and is not called again.

:class:`NvmlSampler` is a :class:`collectors.base.SeriesCollector` (``start``/``stop``/
``collect``); ``collect_new()`` hands out only the rows since its previous call.

Threading: ``start()``, ``stop()``, ``collect()``, ``collect_new()``, ``device_info()`` may be
called from any thread; the sampling itself (``sample_once()``) runs on the sampler's own
daemon thread once started (or on the caller's thread when called directly, e.g. in tests).
A lock guards the sample buffer only; NVML calls are made outside it.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from collectors.base import empty_series_frame
from diag import stages as S

SOURCE = "nvml"
DEFAULT_INTERVAL_S = 0.1  # 10 Hz
_CHUNK_SAMPLES = 512  # samples per preallocated buffer chunk
_MAX_CONSECUTIVE_ERRORS = 5  # transient errors in a row before a counter is given up
_NAN = float("nan")
_KIB = 1024.0

# nvidia-smi's names for nvmlGpuTopologyLevel_t (PCIe path between two GPUs).
_TOPOLOGY_LEVEL_NAMES: dict[int, str] = {
    0: "internal",  # same board (multi-GPU board)
    10: "PIX",  # one PCIe switch
    20: "PXB",  # several PCIe switches, no host bridge
    30: "PHB",  # a PCIe host bridge
    40: "NODE",  # host bridges within one NUMA node
    50: "SYS",  # across NUMA nodes (SMP interconnect)
}

# Error names whose meaning is "this GPU/driver cannot do that": give the counter up at once.
_PERMANENT_ERRORS = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "NVML_ERROR_DEPRECATED",
)

_GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", S.SERIES_DRAM_BW_UTIL_PCT),
    ("NVML_GPM_METRIC_SM_UTIL", S.SERIES_SM_UTIL_PCT),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", S.SERIES_TENSOR_UTIL_PCT),
)


class _Disabled(Exception):
    """Raised inside a probe to give the whole counter up with a reason."""


@dataclass
class _Gpu:
    """Per-GPU sampling state. Mutated only by the sampling thread after setup."""

    index: int
    entity: str
    handle: Any
    name: str = ""
    uuid: str = ""
    memory_total_bytes: float | None = None
    nvlink_links: list[int] = field(default_factory=list)
    gpm_supported: bool = False
    pcie_source: str = ""  # "field_counters" | "throughput" | ""
    not_supported: dict[str, str] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    # (counter name, series covered, reader) for the counters still sampled
    probes: tuple[tuple[str, tuple[str, ...], Callable[[list[float]], None]], ...] = ()


def _field_value_dtype(nvml: Any) -> np.dtype | None:
    """A numpy view of ``c_nvmlFieldValue_t`` (fieldId, scopeId, timestamp, nvmlReturn, value):
    reads a whole result array without touching ctypes attributes one by one."""
    try:
        f = nvml.c_nvmlFieldValue_t
        return np.dtype({
            "names": ["fid", "scope", "ts", "ret", "val"],
            "formats": [np.uint32, np.uint32, np.int64, np.uint32, np.uint64],
            "offsets": [f.fieldId.offset, f.scopeId.offset, f.timestamp.offset,
                        f.nvmlReturn.offset, f.value.offset],
            "itemsize": ctypes.sizeof(f),
        })
    except Exception:  # noqa: BLE001 - a binding without the ctypes struct
        return None


class _FieldCounters:
    """Cumulative NVML field counters (NVLink KiB, PCIe bytes) read in one batched call.

    Rate = Δcounter × scale / Δtimestamp, with the timestamps (µs) NVML returns per field; a
    field whose timestamp has not moved gives no value that sample, a counter that went back
    (wrap, driver reload) restarts its baseline. A field that fails with a permanent error is
    dropped (noted once) and the request is rebuilt without it.

    Fast path (the real nvidia-ml-py): the ``c_nvmlFieldValue_t`` array, its field ids and a
    numpy view over it are built once and the C entry point is called directly, so a sample
    allocates no ctypes objects. Otherwise the public ``nvmlDeviceGetFieldValues`` is called.
    """

    def __init__(self, sampler: NvmlSampler, gpu: _Gpu) -> None:
        self._s = sampler
        self._gpu = gpu
        self._fields: list[tuple[int, int]] = []
        self._slots: list[int] = []
        self._scale_l: list[float] = []  # bytes per counter unit
        self._labels: list[str] = []  # not_supported key for each field
        self._prev_v: list[int] = []
        self._prev_t: list[int] = []
        self._scale: list[float] = []
        self._dtype = _field_value_dtype(sampler._nvml)
        self._fn: Any = None
        self._view: np.ndarray | None = None

    def add(self, field_id: int, scope_id: int, slot: int, scale: float, label: str) -> None:
        self._fields.append((field_id, scope_id))
        self._slots.append(slot)
        self._scale_l.append(scale)
        self._labels.append(label)

    def __len__(self) -> int:
        return len(self._fields)

    def finalize(self, keep: list[int] | None = None) -> None:
        """Build the per-sample state (again, keeping only ``keep`` and their baselines)."""
        if keep is not None:
            for name in ("_fields", "_slots", "_scale_l", "_labels", "_prev_v", "_prev_t"):
                old = getattr(self, name)
                setattr(self, name, [old[i] for i in keep])
        else:
            self._prev_v = [0] * len(self._fields)
            self._prev_t = [-1] * len(self._fields)
        self._scale = [x * 1e6 for x in self._scale_l]  # per µs -> per s
        n = len(self._fields)
        self._fn = self._view = None
        nv = self._s._nvml
        get_fp = getattr(nv, "_nvmlGetFunctionPointer", None)
        if n and self._dtype is not None and get_fp is not None:
            try:
                fn = get_fp("nvmlDeviceGetFieldValues")
                arr = (nv.c_nvmlFieldValue_t * n)()
                view = np.frombuffer(arr, dtype=self._dtype)
            except Exception:  # noqa: BLE001 - use the public call
                return
            view["fid"] = [f for f, _sc in self._fields]
            view["scope"] = [sc for _f, sc in self._fields]
            self._fn, self._arr, self._view = fn, arr, view
            self._ref, self._n_c = ctypes.byref(arr), ctypes.c_int32(n)

    def _fetch(self) -> tuple[list[int], list[int], list[int]]:
        """(nvmlReturn, value, timestamp µs) per field."""
        nv = self._s._nvml
        if self._fn is not None:
            ret = self._fn(self._gpu.handle, self._n_c, self._ref)
            if ret:
                raise nv.NVMLError(ret)
            view = self._view
            assert view is not None
        else:
            out = nv.nvmlDeviceGetFieldValues(self._gpu.handle, self._fields)
            if self._dtype is None or not isinstance(out, ctypes.Array):
                # a binding/fake that answers with plain objects
                return ([fv.nvmlReturn for fv in out], [fv.value.ullVal for fv in out],
                        [fv.timestamp for fv in out])
            view = np.frombuffer(out, dtype=self._dtype)
        return view["ret"].tolist(), view["val"].tolist(), view["ts"].tolist()

    def read(self, vals: list[float]) -> None:
        rets, vs, ts = self._fetch()
        prev_v, prev_t, slots, scale = self._prev_v, self._prev_t, self._slots, self._scale
        bad: list[int] | None = None
        for i in range(len(slots)):
            t = ts[i]
            pt = prev_t[i]
            if t == pt:  # NVML has not refreshed this counter since the last sample
                continue
            if rets[i]:
                if bad is None:
                    bad = []
                bad.append(i)
                continue
            v = vs[i]
            pv = prev_v[i]
            if pt >= 0 and t > pt and v >= pv:
                vals[slots[i]] = (v - pv) * scale[i] / (t - pt)
            prev_v[i] = v  # a wrapped/reset counter (v < pv) restarts its baseline
            prev_t[i] = t
        if bad is not None:
            self._on_field_errors(bad, rets)

    def _on_field_errors(self, bad: list[int], rets: list[int]) -> None:
        drop: set[int] = set()
        for i in bad:
            code = int(rets[i])
            if self._s._is_permanent(code):
                self._gpu.not_supported.setdefault(self._labels[i], self._s._reason(code))
                drop.add(i)
        if drop:
            self.finalize([i for i in range(len(self._fields)) if i not in drop])
            if not self._fields:
                raise _Disabled("no field counter left")


class _Gpm:
    """GPM metrics (Hopper+): one GPM sample per sampler tick, metrics over consecutive pairs."""

    def __init__(self, sampler: NvmlSampler, gpu: _Gpu, metrics: list[tuple[int, str, int]]) -> None:
        nv = sampler._nvml
        self._s = sampler
        self._gpu = gpu
        self._samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        self._cur = 0
        self._have_prev = False
        self._metrics = metrics  # (metric id, series, slot)
        self._mg = self._build()

    def _build(self) -> Any:
        nv = self._s._nvml
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(self._metrics)
        for i, (metric_id, _series, _slot) in enumerate(self._metrics):
            mg.metrics[i].metricId = metric_id
        return mg

    def free(self) -> None:
        for smp in self._samples:
            try:
                self._s._nvml.nvmlGpmSampleFree(smp)
            except Exception:  # noqa: BLE001 - freeing must never fail the caller
                pass
        self._samples = []

    def read(self, vals: list[float]) -> None:
        nv = self._s._nvml
        cur = self._samples[self._cur]
        nv.nvmlGpmSampleGet(self._gpu.handle, cur)
        if self._have_prev:
            mg = self._mg
            mg.sample1 = self._samples[1 - self._cur]
            mg.sample2 = cur
            nv.nvmlGpmMetricsGet(mg)
            drop: list[int] = []
            for i, (_mid, series, slot) in enumerate(self._metrics):
                m = mg.metrics[i]
                if m.nvmlReturn:
                    if self._s._is_permanent(m.nvmlReturn):
                        self._gpu.not_supported.setdefault(series, self._s._reason(m.nvmlReturn))
                        drop.append(i)
                    continue
                vals[slot] = float(m.value)
            if drop:
                self._metrics = [m for i, m in enumerate(self._metrics) if i not in drop]
                if not self._metrics:
                    raise _Disabled("no GPM metric left")
                self._mg = self._build()
        self._have_prev = True
        self._cur = 1 - self._cur


class NvmlSampler:
    """Samples every GPU's counters at ``interval_s`` on a background thread.

    ``available`` is False (and ``note`` says why in one line) when the binding, the driver
    or any GPU is missing; then ``start()`` starts no thread and the frames are empty.
    ``nvml``: the ``pynvml`` module or a fake with the same names (default: ``import pynvml``).
    ``clock``: Unix seconds for ``ts_s`` (default ``time.time``). ``device_indices``: the NVML
    indices to sample (default: all). The sampler is single-use: ``stop()`` also shuts NVML
    down; the rows stay readable.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        nvml: Any = None,
        clock: Callable[[], float] = time.time,
        device_indices: list[int] | None = None,
        gpm: bool = True,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._gpus: list[_Gpu] = []
        self._gpm: list[_Gpm] = []
        self._topology: list[dict[str, Any]] = []
        self._driver_version = ""
        self._nvml_version = ""
        self._warnings: list[str] = []
        # sample buffer: a (series, entity) per slot; samples in preallocated chunks
        self._keys: list[tuple[str, str]] = []
        self._chunks: list[np.ndarray] = []
        self._ts_chunks: list[np.ndarray] = []
        self._n_samples = 0
        self._collected = 0
        self._scratch: list[float] = []
        self._nan_row: list[float] = []
        self.samples_taken = 0
        self.sampler_cpu_s = 0.0  # CPU time the sampling thread spent in sample_once(), s
        self.overruns = 0  # ticks skipped because a sample took longer than interval_s
        self.available = False
        self.note = ""
        self._nvml: Any = None
        self._err_names: dict[int, str] = {}
        self._permanent: frozenset[int] = frozenset()
        self._open(nvml, device_indices, gpm)

    # --- setup ----------------------------------------------------------------------------

    def _open(self, nvml: Any, device_indices: list[int] | None, gpm: bool) -> None:
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]
            except ImportError as exc:
                self.note = f"NVML unavailable: nvidia-ml-py is not installed ({exc})"
                return
            self._warn_unofficial_binding()
        self._nvml = nvml
        self._err_names = {}
        for k in dir(nvml):
            v = getattr(nvml, k, None) if k.startswith("NVML_ERROR_") else None
            if isinstance(v, int):
                self._err_names.setdefault(v, k)
        self._permanent = frozenset(
            getattr(nvml, n) for n in _PERMANENT_ERRORS if isinstance(getattr(nvml, n, None), int)
        )
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - any failure here means "no NVML"
            self.note = f"NVML unavailable: {self._describe(exc)} (no NVIDIA driver/GPU here?)"
            self._nvml = None
            return
        try:
            count = int(nvml.nvmlDeviceGetCount())
            indices = list(range(count)) if device_indices is None else list(device_indices)
            if not indices:
                self.note = "NVML unavailable: the driver reports no GPU"
                self._shutdown()
                return
            for idx in indices:
                if not 0 <= idx < count:
                    raise ValueError(f"GPU index {idx} out of range (the driver reports {count})")
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(idx)
                except Exception as exc:  # noqa: BLE001 - e.g. no permission on one GPU
                    self._warnings.append(f"gpu{idx} skipped: {self._describe(exc)}")
                    continue
                self._gpus.append(_Gpu(idx, f"gpu{idx}", handle))
            if not self._gpus:
                self.note = f"NVML unavailable: no usable GPU ({'; '.join(self._warnings)})"
                self._shutdown()
                return
            self._driver_version = self._try_str(nvml, "nvmlSystemGetDriverVersion")
            self._nvml_version = self._try_str(nvml, "nvmlSystemGetNVMLVersion")
            for gpu in self._gpus:
                self._setup_gpu(gpu, gpm)
            self._topology = self._probe_topology()
        except ValueError:
            self._shutdown()
            raise
        except Exception as exc:  # noqa: BLE001
            self.note = f"NVML unavailable: setup failed: {self._describe(exc)}"
            self._shutdown()
            self._gpus = []
            return
        n = len(self._keys)
        self._nan_row = [_NAN] * n
        self._scratch = [_NAN] * n
        self.available = True
        names = sorted({g.name for g in self._gpus})
        self.note = f"NVML: {len(self._gpus)} GPU(s) ({', '.join(names)}), driver {self._driver_version}"

    def _warn_unofficial_binding(self) -> None:
        try:
            from importlib import metadata

            metadata.version("pynvml")
        except Exception:  # noqa: BLE001 - not installed is the good case
            return
        self._warnings.append(
            "the deprecated 'pynvml' distribution is installed next to nvidia-ml-py; "
            "uninstall it (pip uninstall pynvml)"
        )

    @staticmethod
    def _try_str(nvml: Any, fn: str) -> str:
        try:
            v = getattr(nvml, fn)()
        except Exception:  # noqa: BLE001
            return ""
        return v.decode() if isinstance(v, bytes) else str(v)

    def _slot(self, series: str, entity: str) -> int:
        self._keys.append((series, entity))
        return len(self._keys) - 1

    def _setup_gpu(self, gpu: _Gpu, gpm: bool) -> None:
        nv = self._nvml
        h = gpu.handle
        gpu.name = self._try_call(lambda: nv.nvmlDeviceGetName(h), "")
        gpu.uuid = self._try_call(lambda: nv.nvmlDeviceGetUUID(h), "")
        if isinstance(gpu.name, bytes):
            gpu.name = gpu.name.decode()
        if isinstance(gpu.uuid, bytes):
            gpu.uuid = gpu.uuid.decode()
        e = gpu.entity
        probes: list[tuple[str, tuple[str, ...], Callable[[list[float]], None]]] = []

        # memory: v2 struct, v1 when the driver lacks the v2 entry point
        mem_used = self._slot(S.SERIES_HBM_USED_BYTES, e)
        mem_total = self._slot(S.SERIES_HBM_TOTAL_BYTES, e)
        use_v2 = [getattr(nv, "nvmlMemory_v2", None) is not None]
        v1_fallback = {getattr(nv, n, None) for n in (
            "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")} - {None}

        def read_memory(vals: list[float]) -> None:
            if use_v2[0]:
                try:
                    m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                except nv.NVMLError as err:
                    if err.value not in v1_fallback:
                        raise
                    use_v2[0] = False  # driver older than the v2 struct
                    m = nv.nvmlDeviceGetMemoryInfo(h)
            else:
                m = nv.nvmlDeviceGetMemoryInfo(h)
            vals[mem_used] = float(m.used)
            vals[mem_total] = float(m.total)

        probes.append(("memory", (S.SERIES_HBM_USED_BYTES, S.SERIES_HBM_TOTAL_BYTES), read_memory))

        util_gpu = self._slot(S.SERIES_GPU_UTIL_PCT, e)
        util_mem = self._slot(S.SERIES_MEM_UTIL_PCT, e)

        def read_util(vals: list[float]) -> None:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            vals[util_gpu] = float(u.gpu)
            vals[util_mem] = float(u.memory)

        probes.append(("utilization", (S.SERIES_GPU_UTIL_PCT, S.SERIES_MEM_UTIL_PCT), read_util))

        # NVLink per active link + PCIe byte counters: one batched field-values call
        counters = _FieldCounters(self, gpu)
        gpu.nvlink_links = self._active_nvlinks(gpu)
        tx_id = nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
        rx_id = nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        for link in gpu.nvlink_links:
            le = f"{e}/nvlink{link}"
            counters.add(tx_id, link, self._slot(S.SERIES_NVLINK_TX_BYTES_PER_S, le), _KIB,
                         f"{S.SERIES_NVLINK_TX_BYTES_PER_S}[nvlink{link}]")
            counters.add(rx_id, link, self._slot(S.SERIES_NVLINK_RX_BYTES_PER_S, le), _KIB,
                         f"{S.SERIES_NVLINK_RX_BYTES_PER_S}[nvlink{link}]")
        pcie_tx = self._slot(S.SERIES_PCIE_TX_BYTES_PER_S, e)
        pcie_rx = self._slot(S.SERIES_PCIE_RX_BYTES_PER_S, e)
        if self._pcie_counters_work(gpu):
            gpu.pcie_source = "field_counters"
            counters.add(nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0, pcie_tx, 1.0, S.SERIES_PCIE_TX_BYTES_PER_S)
            counters.add(nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0, pcie_rx, 1.0, S.SERIES_PCIE_RX_BYTES_PER_S)
        else:
            gpu.pcie_source = "throughput"
            tx_c, rx_c = nv.NVML_PCIE_UTIL_TX_BYTES, nv.NVML_PCIE_UTIL_RX_BYTES

            def read_pcie(vals: list[float]) -> None:
                vals[pcie_tx] = nv.nvmlDeviceGetPcieThroughput(h, tx_c) * _KIB
                vals[pcie_rx] = nv.nvmlDeviceGetPcieThroughput(h, rx_c) * _KIB

            probes.append(("pcie", (S.SERIES_PCIE_TX_BYTES_PER_S, S.SERIES_PCIE_RX_BYTES_PER_S), read_pcie))
        if len(counters):
            counters.finalize()
            covered = tuple(
                s for s in (S.SERIES_NVLINK_TX_BYTES_PER_S, S.SERIES_NVLINK_RX_BYTES_PER_S)
                if gpu.nvlink_links
            ) + ((S.SERIES_PCIE_TX_BYTES_PER_S, S.SERIES_PCIE_RX_BYTES_PER_S)
                 if gpu.pcie_source == "field_counters" else ())
            probes.append(("field_counters", covered, counters.read))

        sm_clock = self._slot(S.SERIES_SM_CLOCK_MHZ, e)
        clock_sm = nv.NVML_CLOCK_SM

        def read_clock(vals: list[float]) -> None:
            vals[sm_clock] = float(nv.nvmlDeviceGetClockInfo(h, clock_sm))

        probes.append(("sm_clock", (S.SERIES_SM_CLOCK_MHZ,), read_clock))

        power = self._slot(S.SERIES_POWER_W, e)

        def read_power(vals: list[float]) -> None:
            vals[power] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0

        probes.append(("power", (S.SERIES_POWER_W,), read_power))

        temp = self._slot(S.SERIES_TEMPERATURE_C, e)
        sensor = nv.NVML_TEMPERATURE_GPU

        def read_temp(vals: list[float]) -> None:
            vals[temp] = float(nv.nvmlDeviceGetTemperature(h, sensor))

        probes.append(("temperature", (S.SERIES_TEMPERATURE_C,), read_temp))

        reasons = self._slot(S.SERIES_CLOCK_EVENT_REASONS, e)
        reasons_fn = [getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                      or nv.nvmlDeviceGetCurrentClocksThrottleReasons]

        def read_reasons(vals: list[float]) -> None:
            try:
                v = reasons_fn[0](h)
            except nv.NVMLError as err:
                legacy = nv.nvmlDeviceGetCurrentClocksThrottleReasons
                if err.value != nv.NVML_ERROR_FUNCTION_NOT_FOUND or reasons_fn[0] is legacy:
                    raise
                reasons_fn[0] = legacy  # driver older than the "clock events" rename
                v = legacy(h)
            vals[reasons] = float(v)

        probes.append(("clock_event_reasons", (S.SERIES_CLOCK_EVENT_REASONS,), read_reasons))

        gpm_series = tuple(s for _n, s in _GPM_METRICS)
        if gpm:
            gpm_probe = self._setup_gpm(gpu)
            if gpm_probe is not None:
                self._gpm.append(gpm_probe)
                probes.append(("gpm", gpm_series, gpm_probe.read))
        else:
            for s in gpm_series:
                gpu.not_supported.setdefault(s, "GPM sampling switched off (gpm=False)")

        gpu.probes = tuple(probes)
        # the total is constant: keep it for the meta even if the first sample fails
        try:
            gpu.memory_total_bytes = float(nv.nvmlDeviceGetMemoryInfo(h).total)
        except Exception:  # noqa: BLE001
            gpu.memory_total_bytes = None

    def _try_call(self, fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except Exception:  # noqa: BLE001
            return default

    def _active_nvlinks(self, gpu: _Gpu) -> list[int]:
        """Indices of the links in state ENABLED; a GPU without NVLink is noted once."""
        nv = self._nvml
        n_links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
        try:  # the link count field narrows the walk where the driver knows it
            fv = nv.nvmlDeviceGetFieldValues(gpu.handle, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])[0]
            if fv.nvmlReturn == 0 and 0 < fv.value.uiVal <= n_links:
                n_links = int(fv.value.uiVal)
        except Exception:  # noqa: BLE001
            pass
        links: list[int] = []
        first_error: BaseException | None = None
        for link in range(n_links):
            try:
                state = nv.nvmlDeviceGetNvLinkState(gpu.handle, link)
            except nv.NVMLError as err:
                if link == 0:
                    first_error = err
                if err.value in (nv.NVML_ERROR_INVALID_ARGUMENT, nv.NVML_ERROR_NOT_SUPPORTED):
                    break  # past the last link (or no NVLink at all)
                continue
            if state == nv.NVML_FEATURE_ENABLED:
                links.append(link)
        if not links:
            reason = self._describe(first_error) if first_error else "no active NVLink link"
            for s in (S.SERIES_NVLINK_TX_BYTES_PER_S, S.SERIES_NVLINK_RX_BYTES_PER_S):
                gpu.not_supported.setdefault(s, reason)
        return links

    def _pcie_counters_work(self, gpu: _Gpu) -> bool:
        nv = self._nvml
        ids = (getattr(nv, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", None),
               getattr(nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", None))
        if None in ids:
            return False
        try:
            out = nv.nvmlDeviceGetFieldValues(gpu.handle, [(ids[0], 0), (ids[1], 0)])
        except Exception:  # noqa: BLE001
            return False
        return out[0].nvmlReturn == 0 and out[1].nvmlReturn == 0

    def _setup_gpm(self, gpu: _Gpu) -> _Gpm | None:
        nv = self._nvml
        series = [s for _n, s in _GPM_METRICS]

        def unsupported(reason: str) -> None:
            for s in series:
                gpu.not_supported.setdefault(s, reason)

        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            unsupported("GPM not in this nvidia-ml-py")
            return None
        try:
            support = nv.nvmlGpmQueryDeviceSupport(gpu.handle)
        except Exception as exc:  # noqa: BLE001
            unsupported(f"nvmlGpmQueryDeviceSupport: {self._describe(exc)}")
            return None
        if not support.isSupportedDevice:
            unsupported("GPM not supported on this device (Hopper or newer needed)")
            return None
        metrics = [(int(getattr(nv, name)), s, self._slot(s, gpu.entity)) for name, s in _GPM_METRICS]
        try:
            probe = _Gpm(self, gpu, metrics)
        except Exception as exc:  # noqa: BLE001
            unsupported(f"GPM sample allocation failed: {self._describe(exc)}")
            return None
        gpu.gpm_supported = True
        return probe

    def _probe_topology(self) -> list[dict[str, Any]]:
        """NVLink (P2P status over the NVLink index) or the PCIe common-ancestor level per pair."""
        nv = self._nvml
        out: list[dict[str, Any]] = []
        for i, a in enumerate(self._gpus):
            for b in self._gpus[i + 1:]:
                entry: dict[str, Any] = {"a": a.entity, "b": b.entity}
                try:
                    p2p = nv.nvmlDeviceGetP2PStatus(a.handle, b.handle, nv.NVML_P2P_CAPS_INDEX_NVLINK)
                except Exception:  # noqa: BLE001
                    p2p = None
                try:
                    level = int(nv.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle))
                    entry["pcie_level"] = _TOPOLOGY_LEVEL_NAMES.get(level, str(level))
                except Exception as exc:  # noqa: BLE001
                    entry["pcie_level"] = None
                    entry["pcie_level_error"] = self._describe(exc)
                entry["link"] = "nvlink" if p2p == nv.NVML_P2P_STATUS_OK else (
                    "pcie" if entry["pcie_level"] is not None else "unknown")
                out.append(entry)
        return out

    # --- errors ---------------------------------------------------------------------------

    def _is_permanent(self, code: int) -> bool:
        return code in self._permanent

    def _reason(self, code: int) -> str:
        return self._err_names.get(code, f"NVML error {code}")

    def _describe(self, exc: BaseException | None) -> str:
        if exc is None:
            return ""
        code = getattr(exc, "value", None)
        if isinstance(code, int) and self._nvml is not None and isinstance(exc, self._nvml.NVMLError):
            try:
                text = str(exc)
            except Exception:  # noqa: BLE001
                text = ""
            name = self._reason(code)
            return f"{name} ({text})" if text and text != name else name
        return f"{type(exc).__name__}: {exc}"

    def _give_up(self, gpu: _Gpu, name: str, series: tuple[str, ...], reason: str) -> None:
        for s in series:
            gpu.not_supported.setdefault(s, reason)
        if not series:
            gpu.not_supported.setdefault(name, reason)
        gpu.probes = tuple(p for p in gpu.probes if p[0] != name)

    def _on_error(self, gpu: _Gpu, name: str, series: tuple[str, ...], exc: BaseException) -> None:
        nv = self._nvml
        if isinstance(exc, _Disabled):  # its parts were noted one by one already
            gpu.probes = tuple(p for p in gpu.probes if p[0] != name)
            return
        if isinstance(exc, AttributeError):  # an older nvidia-ml-py without this call
            self._give_up(gpu, name, series, f"not in this nvidia-ml-py: {exc}")
            return
        if isinstance(exc, nv.NVMLError) and self._is_permanent(exc.value):
            self._give_up(gpu, name, series, self._describe(exc))
            return
        n = gpu.errors.get(name, 0) + 1
        gpu.errors[name] = n
        if n >= _MAX_CONSECUTIVE_ERRORS:
            self._give_up(gpu, name, series, f"failed {n} times in a row: {self._describe(exc)}")

    # --- sampling -------------------------------------------------------------------------

    def sample_once(self) -> None:
        """Take one sample of every GPU now; runs on the calling thread (the sampler's own
        once started). Never raises for an NVML error: the counter is noted and skipped."""
        if not self.available or self._closed:
            return
        ts = self._clock()
        vals = self._scratch
        vals[:] = self._nan_row
        for gpu in self._gpus:
            errors = gpu.errors
            for name, series, read in gpu.probes:
                try:
                    read(vals)
                except Exception as exc:  # noqa: BLE001 - instrumentation never crashes
                    self._on_error(gpu, name, series, exc)
                else:
                    if errors and name in errors:
                        del errors[name]
        with self._lock:
            k = self._n_samples % _CHUNK_SAMPLES
            if k == 0:
                self._chunks.append(np.empty((_CHUNK_SAMPLES, len(vals)), dtype=np.float64))
                self._ts_chunks.append(np.empty(_CHUNK_SAMPLES, dtype=np.float64))
            self._chunks[-1][k] = vals
            self._ts_chunks[-1][k] = ts
            self._n_samples += 1
        self.samples_taken += 1

    def _run(self) -> None:
        interval = self.interval_s
        next_t = time.monotonic()
        thread_time = time.thread_time
        while True:
            c0 = thread_time()
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - never let the thread die noisily
                self.note = f"NVML sampler stopped: {type(exc).__name__}: {exc}"
                return
            self.sampler_cpu_s += thread_time() - c0
            next_t += interval
            now = time.monotonic()
            if next_t <= now:  # overran: skip the missed ticks, keep the phase
                missed = math.floor((now - next_t) / interval) + 1
                self.overruns += missed
                next_t += missed * interval
            if self._stop_evt.wait(next_t - now):
                return

    def start(self) -> None:
        """Start the sampling thread (no-op when NVML is unavailable or already started)."""
        if not self.available or self._closed or self._thread is not None:
            return
        self._stop_evt.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, free GPM buffers and shut NVML down. Rows remain readable."""
        self._stop_evt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._thread = None
        if not self._closed:
            self._closed = True
            for g in self._gpm:
                g.free()
            self._shutdown()

    def __enter__(self) -> NvmlSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _shutdown(self) -> None:
        if self._nvml is None:
            return
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    # --- output ---------------------------------------------------------------------------

    def _snapshot(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Copies of samples [start, end); call with the lock held."""
        if end <= start or not self._keys:
            return None
        parts, ts_parts = [], []
        for c in range(start // _CHUNK_SAMPLES, (end - 1) // _CHUNK_SAMPLES + 1):
            lo = max(start - c * _CHUNK_SAMPLES, 0)
            hi = min(end - c * _CHUNK_SAMPLES, _CHUNK_SAMPLES)
            parts.append(self._chunks[c][lo:hi])
            ts_parts.append(self._ts_chunks[c][lo:hi])
        values = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        ts = np.concatenate(ts_parts) if len(ts_parts) > 1 else ts_parts[0].copy()
        return values, ts

    def _frame(self, snap: tuple[np.ndarray, np.ndarray] | None) -> pd.DataFrame:
        if snap is None:
            return empty_series_frame()
        values, ts = snap
        mask = ~np.isnan(values)
        rows, cols = np.nonzero(mask)
        series = np.array([s for s, _e in self._keys], dtype=object)
        entity = np.array([e for _s, e in self._keys], dtype=object)
        return pd.DataFrame({
            "ts_s": ts[rows],
            "source": np.full(len(rows), SOURCE, dtype=object),
            "series": series[cols],
            "entity": entity[cols],
            "value": values[rows, cols],
        }, columns=list(S.SERIES_COLUMNS))

    def collect(self) -> pd.DataFrame:
        """All rows sampled so far, in :data:`diag.stages.SERIES_COLUMNS` (any thread)."""
        with self._lock:
            snap = self._snapshot(0, self._n_samples)
        return self._frame(snap)

    #: the name benchmarks/nvml_sampling_cost.py reads the rows by
    to_frame = collect

    def collect_new(self) -> pd.DataFrame:
        """Rows of the samples taken since the previous ``collect_new()`` (any thread)."""
        with self._lock:
            start, end = self._collected, self._n_samples
            self._collected = end
            snap = self._snapshot(start, end)
        return self._frame(snap)

    def not_supported(self) -> dict[str, dict[str, str]]:
        """Per GPU entity: series (or counter) -> reason it is not sampled."""
        return {g.entity: dict(g.not_supported) for g in self._gpus}

    def device_info(self) -> dict[str, Any]:
        """JSON-ready facts for the capture's meta.json: GPUs, memory, topology, gaps."""
        return {
            "available": self.available,
            "note": self.note,
            "warnings": list(self._warnings),
            "driver_version": self._driver_version,
            "nvml_version": self._nvml_version,
            "interval_s": self.interval_s,
            "gpus": [
                {
                    "entity": g.entity,
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "memory_total_bytes": g.memory_total_bytes,
                    "nvlink_links": list(g.nvlink_links),
                    "pcie_source": g.pcie_source,
                    "gpm_supported": g.gpm_supported,
                    "not_supported": dict(g.not_supported),
                }
                for g in self._gpus
            ],
            "topology": [dict(t) for t in self._topology],
            "samples_taken": self.samples_taken,
            "sampler_cpu_s": self.sampler_cpu_s,
            "overruns": self.overruns,
        }

