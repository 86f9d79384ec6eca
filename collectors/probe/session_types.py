"""The probe session's plain types: what one probe or sweep needs (:class:`ProbeConfig`), what
it returns (:class:`ProbeResult`) and the progress callback. Seconds unless a name says otherwise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.probe.client import KEEPALIVE_S, Endpoint, RequestResult
from collectors.probe.load import LoadSpec
from collectors.probe.metrics import DEFINITIONS
from collectors.probe.workload import WorkloadSpec

#: Progress callback: (requests done in this phase, phase total or None, phase label).
Progress = Callable[[int, "int | None", str], None]


@dataclass
class ProbeConfig:
    """Everything one probe (or sweep) needs. ``output`` is the capture directory (None = no
    capture). ``segment`` labels a plain probe's requests (ATTR_SEGMENT)."""

    url: str
    api: str | None = None
    model: str | None = None
    api_key: str | None = None
    load: LoadSpec = field(default_factory=LoadSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    tokenizer_path: str | None = None
    timeout_s: float = 60.0
    workers: int = 1
    output: str | Path | None = None
    slo: dict[str, float] | None = None
    #: one /metrics URL, or ``--metrics`` values (``prefill=URL``, ``decode=URL``: collectors.prometheus.metrics_targets)
    metrics_url: str | tuple[str, ...] | None = None
    gpu: bool = False
    record_prompts: bool = False
    segment: str | None = None
    progress: Progress | None = None
    concurrency_set: bool = False  # the user chose --concurrency (a cap in rate sweeps)
    extra_body: dict[str, Any] = field(default_factory=dict)
    #: optional request elements not to send (keys of client.OPTIONAL_ELEMENTS)
    dropped: frozenset[str] = frozenset()
    #: on a first request refused with 4xx, find which optional element the server refuses
    compat_check: bool = True
    #: pin the probe's processes to these CPUs (``--cpus``; None = wherever the OS puts them)
    cpus: tuple[int, ...] | None = None
    #: also export the client spans over OTLP/HTTP to this URL (``--otlp``, or OTEL_EXPORTER_OTLP_* )
    otlp_endpoint: str | None = None
    #: seconds to wait for a server that is not serving yet (refused, 503 loading; ``--wait-ready``)
    wait_ready_s: float = 0.0
    #: told one line at once when the server is not serving yet (the CLI prints it on stderr)
    on_wait: Callable[[str], None] | None = None
    #: seconds an idle pooled connection may be reused (below the servers' 5 s idle timeout)
    keepalive_s: float = KEEPALIVE_S
    #: send a request once more on a fresh connection when its reused one was found closed
    #: before any answer (off: it fails as server_disconnected)
    retry_reused: bool = True
    #: run the phases' workers as Ray actors on this cluster (``--ray``: local, auto, ray://HOST:PORT)
    ray_address: str | None = None


@dataclass
class ProbeResult:
    """What a probe or sweep returns. ``metrics`` covers all measured requests; ``segments``
    holds (label, metrics) per sweep point."""

    endpoint: Endpoint
    metrics: dict[str, Any]
    client_health: dict[str, Any]
    results: list[RequestResult] = field(default_factory=list)
    segments: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    capture_path: Path | None = None
    notes: list[str] = field(default_factory=list)
    sweep: dict[str, Any] | None = None

    def to_dict(self, per_request: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.endpoint.url,
            "api": self.endpoint.api,
            "model": self.endpoint.model,
            "capture": str(self.capture_path) if self.capture_path else None,
            "metrics": self.metrics,
            "segments": [{"segment": s, "metrics": m} for s, m in self.segments],
            "client_health": self.client_health,
            "sweep": self.sweep,
            "notes": self.notes,
            "definitions": DEFINITIONS,
        }
        if per_request:
            out["requests"] = [{k: v for k, v in r.to_dict().items() if k != "output_text"} for r in self.results]
        return out
