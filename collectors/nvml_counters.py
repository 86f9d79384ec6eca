"""NVML counter readers for :class:`~collectors.nvml.NvmlSampler`: one GPU's state, its
batched field counters (NVLink, PCIe) and its GPM metrics.

Each reader writes its values into the sampler's row (``vals``, indexed by slot) and raises
:class:`CounterDisabled` when nothing of it is left to read. Rates are bytes/s or %; NVML field
timestamps are µs. Sampling thread only (setup on the thread that builds the sampler).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from diag.ground import stages as S

if TYPE_CHECKING:
    from collectors.nvml import NvmlSampler

KIB = 1024.0

GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", S.SERIES_DRAM_BW_UTIL_PCT),
    ("NVML_GPM_METRIC_SM_UTIL", S.SERIES_SM_UTIL_PCT),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", S.SERIES_TENSOR_UTIL_PCT),
)


class CounterDisabled(Exception):
    """Raised inside a probe to give the whole counter up with a reason."""


@dataclass
class GpuState:
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


def field_value_dtype(nvml: Any) -> np.dtype | None:
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


class FieldCounters:
    """Cumulative NVML field counters (NVLink KiB, PCIe bytes) read in one batched call.

    Rate = Δcounter × scale / Δtimestamp, with the timestamps (µs) NVML returns per field; a
    field whose timestamp has not moved gives no value that sample, a counter that went back
    (wrap, driver reload) restarts its baseline. A field that fails with a permanent error is
    dropped (noted once) and the request is rebuilt without it.

    Fast path (the real nvidia-ml-py): the ``c_nvmlFieldValue_t`` array, its field ids and a
    numpy view over it are built once and the C entry point is called directly, so a sample
    allocates no ctypes objects. Otherwise the public ``nvmlDeviceGetFieldValues`` is called.
    """

    def __init__(self, sampler: NvmlSampler, gpu: GpuState) -> None:
        self._s = sampler
        self._gpu = gpu
        self._fields: list[tuple[int, int]] = []
        self._slots: list[int] = []
        self._scale_l: list[float] = []  # bytes per counter unit
        self._labels: list[str] = []  # not_supported key for each field
        self._prev_v: list[int] = []
        self._prev_t: list[int] = []
        self._scale: list[float] = []
        self._dtype = field_value_dtype(sampler._nvml)
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
                raise CounterDisabled("no field counter left")


class GpmCounters:
    """GPM metrics (Hopper+): one GPM sample per sampler tick, metrics over consecutive pairs."""

    def __init__(self, sampler: NvmlSampler, gpu: GpuState, metrics: list[tuple[int, str, int]]) -> None:
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
                    raise CounterDisabled("no GPM metric left")
                self._mg = self._build()
        self._have_prev = True
        self._cur = 1 - self._cur
