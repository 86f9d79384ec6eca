"""Helpers every renderer shares: reproducible prometheus_client text, time-ordered metric updates,
and OTLP JSON (hex ids, Unix ns from the run's base time)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from samplegen.sim import BASE_TS_S, NS, Req, SimResult, StateSample

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# --- exposition helpers ---------------------------------------------------------------------------


def strip_created(text: bytes) -> str:
    """prometheus_client text without ``*_created`` samples (their values are wall-clock times)."""
    lines = [ln for ln in text.decode().splitlines() if not _is_created(ln)]
    return "\n".join(lines) + "\n"


def _is_created(line: str) -> bool:
    if line.startswith("#"):
        parts = line.split(" ")
        return len(parts) > 2 and parts[2].endswith("_created")
    name = line.split("{", 1)[0].split(" ", 1)[0]
    return name.endswith("_created")


@dataclass
class Events:
    """Time-ordered callbacks that update metric objects; ``until(t)`` applies those <= t."""

    items: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    pos: int = 0

    def add(self, t: float, fn: Callable[[], None]) -> None:
        self.items.append((t, len(self.items), fn))

    def until(self, t: float) -> None:
        if self.pos == 0:
            self.items.sort(key=lambda x: (x[0], x[1]))
        while self.pos < len(self.items) and self.items[self.pos][0] <= t:
            self.items[self.pos][2]()
            self.pos += 1


def state_at(sim: SimResult, t: float) -> StateSample:
    for s in sim.states:
        if s.t == t:
            return s
    return StateSample(t, 0, 0, 0)


def decode_gaps(r: Req) -> list[tuple[float, float]]:
    """(time of the token, gap to the previous token) for tokens after the first."""
    tt = r.token_times
    return [(tt[i], tt[i] - tt[i - 1]) for i in range(1, len(tt))]


def otlp_request(service: str, scope: str, spans: list[dict[str, Any]], scope_version: str = "") -> dict[str, Any]:
    scope_doc: dict[str, Any] = {"name": scope}
    if scope_version:
        scope_doc["version"] = scope_version
    return {"resourceSpans": [{
        "resource": {"attributes": [attr_kv("service.name", service)]},
        "scopeSpans": [{"scope": scope_doc, "spans": spans}],
    }]}


def attr_kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    else:
        v = {"stringValue": str(value)}
    return {"key": key, "value": v}


def unix_ns(t: float) -> int:
    """Seconds from the run's start -> Unix ns."""
    return BASE_TS_S * NS + int(round(t * 1e9))


def export_batches(items: list[tuple[float, dict[str, Any]]], every_s: float) -> list[list[dict[str, Any]]]:
    """Group spans by export time (BatchSpanProcessor flushes every ``every_s``)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for t, span in sorted(items, key=lambda x: x[0]):
        out.setdefault(int(t // every_s), []).append(span)
    return [out[k] for k in sorted(out)]


def hex_bits(rng: random.Random, bits: int) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"
