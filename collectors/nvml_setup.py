"""Per-GPU setup of :class:`~collectors.nvml.NvmlSampler`: which counters a GPU has and how each is read.

:class:`GpuSetup` is a base of the sampler. For each GPU it assigns the row slots and builds
the readers (memory, utilisation, NVLink and PCIe counters, clocks, power, temperature, clock
event reasons, GPM), noting once in ``not_supported`` what the GPU or driver cannot do, and probes
the pairwise topology. Runs on the thread that builds the sampler, before sampling starts.
"""

from __future__ import annotations

from typing import Any, Callable

from collectors.nvml_counters import GPM_METRICS, KIB, FieldCounters, GpmCounters, GpuState
from diag.ground import stages as S

# nvidia-smi's names for nvmlGpuTopologyLevel_t (PCIe path between two GPUs).
TOPOLOGY_LEVEL_NAMES: dict[int, str] = {
    0: "internal",  # same board (multi-GPU board)
    10: "PIX",  # one PCIe switch
    20: "PXB",  # several PCIe switches, no host bridge
    30: "PHB",  # a PCIe host bridge
    40: "NODE",  # host bridges within one NUMA node
    50: "SYS",  # across NUMA nodes (SMP interconnect)
}



class GpuSetup:
    """Slot assignment and reader construction per GPU."""

    # the sampler's state, set by NvmlSampler.__init__ (collectors.nvml)
    _nvml: Any
    _keys: list[tuple[str, str]]
    _gpus: list[GpuState]
    _gpm: list[GpmCounters]
    _describe: Callable[[BaseException | None], str]

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

    def _setup_gpu(self, gpu: GpuState, gpm: bool) -> None:
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
        counters = FieldCounters(self, gpu)
        gpu.nvlink_links = self._active_nvlinks(gpu)
        tx_id = nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
        rx_id = nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        for link in gpu.nvlink_links:
            le = f"{e}/nvlink{link}"
            counters.add(tx_id, link, self._slot(S.SERIES_NVLINK_TX_BYTES_PER_S, le), KIB,
                         f"{S.SERIES_NVLINK_TX_BYTES_PER_S}[nvlink{link}]")
            counters.add(rx_id, link, self._slot(S.SERIES_NVLINK_RX_BYTES_PER_S, le), KIB,
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
                vals[pcie_tx] = nv.nvmlDeviceGetPcieThroughput(h, tx_c) * KIB
                vals[pcie_rx] = nv.nvmlDeviceGetPcieThroughput(h, rx_c) * KIB

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

        gpm_series = tuple(s for _n, s in GPM_METRICS)
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

    def _active_nvlinks(self, gpu: GpuState) -> list[int]:
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

    def _pcie_counters_work(self, gpu: GpuState) -> bool:
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

    def _setup_gpm(self, gpu: GpuState) -> GpmCounters | None:
        nv = self._nvml
        series = [s for _n, s in GPM_METRICS]

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
        metrics = [(int(getattr(nv, name)), s, self._slot(s, gpu.entity)) for name, s in GPM_METRICS]
        try:
            probe = GpmCounters(self, gpu, metrics)
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
                    entry["pcie_level"] = TOPOLOGY_LEVEL_NAMES.get(level, str(level))
                except Exception as exc:  # noqa: BLE001
                    entry["pcie_level"] = None
                    entry["pcie_level_error"] = self._describe(exc)
                entry["link"] = "nvlink" if p2p == nv.NVML_P2P_STATUS_OK else (
                    "pcie" if entry["pcie_level"] is not None else "unknown")
                out.append(entry)
        return out
