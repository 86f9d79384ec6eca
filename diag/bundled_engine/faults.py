"""Fault injection: ``--inject NAME=VALUE`` knobs that simulate a bottleneck's cause.

Each knob adds a real delay at the place the cause would act; every measurement stays real
(the delay shows up in the stage it targets because it really happens there):

- ``tokenize_ms_per_token``: after encoding a prompt, sleep this many ms per prompt token
  (a slow tokenizer; moves ``tokenize``).
- ``scheduler_stall_ms``: the step loop sleeps this long before scheduling each step
  (a CPU-bound scheduler; moves ``queue`` and ITL; with ``--pd``, the prefill side's loop).
- ``collective_latency_ms``: added to every tensor-parallel all-reduce (a slow link; moves
  ``comm``; needs ``--tp`` >= 2).
- ``detokenize_ms_per_token``: sleep this many ms per detokenized output token on the step
  loop (a slow detokenizer; moves ``detokenize`` and ITL).
- ``load_delay_s``: added to model loading (a slow disk; moves ``cold_start``).
- ``network_delay_ms``: every SSE chunk (and a non-streamed response) reaches the client this
  long after the server has it ready, pipelined: chunks do not wait for each other's delay
  (a slow network between engine and client; moves ``network`` = client TTFT - server TTFT,
  not ITL; the step loop is untouched).
- ``grammar_compile_ms``: every grammar compile (a request with a ``response_format`` whose
  grammar is not cached) takes this much longer, on its grammar worker thread (a slower grammar
  compiler or a larger vocabulary; moves ``queue`` of such requests only, as
  ``ttft.grammar.wait_s``; see :mod:`diag.bundled_engine.grammar_cache`).
- ``kv_transfer_latency_ms`` and ``kv_transfer_ms_per_mb``: with ``--pd``, every KV transfer from
  the prefill side to the decode worker waits this many ms (plus this many ms per MiB of KV) on
  the sending thread before the real send (a slower link; the link carries one transfer at a
  time, so transfers queue behind a slow one; moves ``kv_transfer`` and TTFT, not ``prefill``;
  see :mod:`diag.bundled_engine.pd`).
- ``lora_load_ms``: every LoRA adapter load into a slot (``--lora-modules``) takes this much
  longer, on the step loop before the step's forward (a slower disk or host-to-device copy, a
  larger adapter; moves ``prefill`` of the requests whose admission loaded their adapter, as
  ``ttft.lora.load_s``, and ``queue`` of those waiting behind the step; see
  :mod:`diag.bundled_engine.lora_manager`).
- ``frontend_workers``: the server's front end runs at most this many HTTP request workers and
  tokenizer threads (a saturated front end, like llama.cpp's ``--threads-http`` below its
  slots; requests wait before the engine sees them: ``ttft.frontend.*`` on the request span,
  not ``queue``; see :mod:`diag.bundled_engine.frontend`). 0 = off.

Thread-safe: a :class:`FaultConfig` is immutable.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields
from typing import Iterable

#: name -> (upper bound, description); values are floats >= 0.
FAULTS: dict[str, tuple[float, str]] = {
    "tokenize_ms_per_token": (1000.0, "ms of extra tokenizer time per prompt token"),
    "scheduler_stall_ms": (60_000.0, "ms the scheduler stalls before every engine step"),
    "collective_latency_ms": (60_000.0, "ms added to every tensor-parallel all-reduce"),
    "detokenize_ms_per_token": (60_000.0, "ms of extra detokenizer time per output token"),
    "load_delay_s": (3600.0, "s added to model loading (cold start)"),
    "network_delay_ms": (60_000.0, "ms between a response chunk being ready and the client getting it (pipelined)"),
    "grammar_compile_ms": (600_000.0, "ms added to every grammar compile (response_format), on its compile thread"),
    "kv_transfer_latency_ms": (60_000.0, "ms added to every --pd KV transfer (prefill side -> decode worker), on the sending thread"),
    "kv_transfer_ms_per_mb": (60_000.0, "ms per MiB of KV added to every --pd KV transfer, on the sending thread"),
    "lora_load_ms": (600_000.0, "ms added to every LoRA adapter load into a slot (--lora-modules), on the step loop"),
    "frontend_workers": (4096.0, "HTTP workers and tokenizer threads the front end keeps at most (a whole number)"),
}


class FaultError(ValueError):
    """A bad ``--inject`` argument; the message is one line and names the knob."""


@dataclass(frozen=True)
class FaultConfig:
    """Injected delays (all default 0 = off). Units are in the names."""

    tokenize_ms_per_token: float = 0.0
    scheduler_stall_ms: float = 0.0
    collective_latency_ms: float = 0.0
    detokenize_ms_per_token: float = 0.0
    load_delay_s: float = 0.0
    network_delay_ms: float = 0.0
    grammar_compile_ms: float = 0.0
    kv_transfer_latency_ms: float = 0.0
    kv_transfer_ms_per_mb: float = 0.0
    lora_load_ms: float = 0.0
    frontend_workers: float = 0.0

    def active(self) -> dict[str, float]:
        """Only the knobs that are on, for the capture's meta.json."""
        return {k: v for k, v in asdict(self).items() if v}

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def parse_injection(item: str) -> tuple[str, float]:
    """Parse one ``NAME=VALUE``; FaultError with the allowed names on any problem."""
    name, sep, raw = item.partition("=")
    name = name.strip()
    if not sep:
        raise FaultError(f"--inject {item!r}: expected NAME=VALUE, e.g. scheduler_stall_ms=50")
    if name not in FAULTS:
        raise FaultError(f"--inject {item!r}: unknown fault {name!r}; known: {', '.join(FAULTS)}")
    try:
        value = float(raw)
    except ValueError:
        raise FaultError(f"--inject {item!r}: value {raw.strip()!r} is not a number") from None
    upper = FAULTS[name][0]
    if not math.isfinite(value) or value < 0 or value > upper:
        raise FaultError(f"--inject {item!r}: {name} must be between 0 and {upper:g}")
    if name == "frontend_workers" and value != int(value):
        raise FaultError(f"--inject {item!r}: frontend_workers must be a whole number of workers")
    return name, value


def parse_injections(items: Iterable[str] | None) -> FaultConfig:
    """``["scheduler_stall_ms=20", ...]`` -> FaultConfig; a repeated name keeps the last value."""
    values: dict[str, float] = {}
    for item in items or ():
        name, value = parse_injection(item)
        values[name] = value
    return FaultConfig(**values)


def fault_from_mapping(mapping: dict[str, float] | FaultConfig | None) -> FaultConfig:
    """Accept a FaultConfig, a ``{name: value}`` dict (validated) or None."""
    if mapping is None:
        return FaultConfig()
    if isinstance(mapping, FaultConfig):
        return mapping
    known = {f.name for f in fields(FaultConfig)}
    for k in mapping:
        if k not in known:
            raise FaultError(f"unknown fault {k!r}; known: {', '.join(FAULTS)}")
    return parse_injections(f"{k}={v}" for k, v in mapping.items())


def sleep_ms(ms: float) -> None:
    """Sleep ``ms`` milliseconds (no-op for 0)."""
    if ms > 0:
        time.sleep(ms / 1000.0)
