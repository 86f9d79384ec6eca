"""NVML sampler: per-GPU counters on a background thread, as long time-series rows.

Front door: :class:`NvmlSampler`. It talks to NVML only through the ``pynvml`` module of
``nvidia-ml-py``, which is injected (``nvml=``) so that tests pass a fake; the timestamp
clock is injected too (``clock=``, Unix seconds). Which counters a GPU has is found in
:mod:`collectors.nvml_setup`; the readers themselves are in :mod:`collectors.nvml_counters`.

Rows follow :data:`diag.ground.stages.SERIES_COLUMNS` = (ts_s, source="nvml", series, entity, value):

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

import math
import threading
import time
from typing import Any, Callable

import numpy as np
import pandas as pd

from collectors.base import empty_series_frame
from collectors.nvml_counters import CounterDisabled, GpmCounters, GpuState
from collectors.nvml_setup import GpuSetup
from diag.ground import stages as S

SOURCE = "nvml"
DEFAULT_INTERVAL_S = 0.1  # 10 Hz
_CHUNK_SAMPLES = 512  # samples per preallocated buffer chunk
_MAX_CONSECUTIVE_ERRORS = 5  # transient errors in a row before a counter is given up
_NAN = float("nan")

# Error names whose meaning is "this GPU/driver cannot do that": give the counter up at once.
_PERMANENT_ERRORS = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "NVML_ERROR_DEPRECATED",
)


class NvmlSampler(GpuSetup):
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
        self._gpus: list[GpuState] = []
        self._gpm: list[GpmCounters] = []
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
                self._gpus.append(GpuState(idx, f"gpu{idx}", handle))
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

    def _give_up(self, gpu: GpuState, name: str, series: tuple[str, ...], reason: str) -> None:
        for s in series:
            gpu.not_supported.setdefault(s, reason)
        if not series:
            gpu.not_supported.setdefault(name, reason)
        gpu.probes = tuple(p for p in gpu.probes if p[0] != name)

    def _on_error(self, gpu: GpuState, name: str, series: tuple[str, ...], exc: BaseException) -> None:
        nv = self._nvml
        if isinstance(exc, CounterDisabled):  # its parts were noted one by one already
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
        """All rows sampled so far, in :data:`diag.ground.stages.SERIES_COLUMNS` (any thread)."""
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

