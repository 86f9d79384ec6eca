"""The bundled torch reference engine: a Llama-style model, paged KV cache, continuous batching,
samplers, a BPE tokenizer, tensor parallel, fault injection and an OpenAI-compatible server.

Front door::

    from diag.bundled_engine import EngineConfig, start_server, parse_injections

    srv = start_server(EngineConfig(model="tiny", policy="chunked",
                                    faults=parse_injections(["scheduler_stall_ms=20"])),
                       port=0, capture_dir="out/cap")      # returns once bound
    print(srv.url)          # http://127.0.0.1:<port>
    ...
    srv.stop()              # stops HTTP, the engine, TP workers; flushes the capture

``build_engine(...)`` gives an in-process :class:`Engine` without HTTP (``submit`` /
``generate``); ``serve(...)`` is the blocking form used by ``ttft serve``.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace
from typing import Any, Callable

from typing import TYPE_CHECKING

# Lazy exports: ``import diag.bundled_engine.faults`` (the CLI's ``serve`` parser) must not import torch.
_EXPORTS: dict[str, str] = {
    "AsyncEventStream": "outputs", "Engine": "engine", "EngineConfig": "config", "EngineStoppedError": "outputs",
    "QueueFullError": "outputs", "SubmitResult": "outputs", "SyncEventStream": "outputs", "TokenEvent": "outputs",
    "build_engine": "engine", "FAULTS": "faults", "FaultConfig": "faults", "FaultError": "faults",
    "parse_injections": "faults", "METRIC_NAMES": "metrics", "PRESETS": "model", "CheckpointError": "model",
    "ModelConfig": "model", "ModelSpec": "model", "SamplingParams": "sampler", "POLICIES": "scheduler",
    "RequestRejected": "scheduler", "EngineServer": "server", "ServerThread": "server",
}

if TYPE_CHECKING:  # pragma: no cover
    from diag.bundled_engine.config import EngineConfig
    from diag.bundled_engine.engine import Engine, build_engine
    from diag.bundled_engine.outputs import (
        AsyncEventStream, EngineStoppedError, QueueFullError, SubmitResult, SyncEventStream, TokenEvent,
    )
    from diag.bundled_engine.faults import FAULTS, FaultConfig, FaultError, parse_injections
    from diag.bundled_engine.metrics import METRIC_NAMES
    from diag.bundled_engine.model import ModelSpec
    from diag.bundled_engine.model_config import PRESETS, CheckpointError, ModelConfig
    from diag.bundled_engine.sampler import SamplingParams
    from diag.bundled_engine.scheduler_types import POLICIES, RequestRejected
    from diag.bundled_engine.server import EngineServer, ServerThread


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'diag.bundled_engine' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"diag.bundled_engine.{mod}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AsyncEventStream", "CheckpointError", "Engine", "EngineConfig", "EngineServer", "EngineStoppedError",
    "FAULTS", "FaultConfig", "FaultError", "METRIC_NAMES", "ModelConfig", "ModelSpec", "POLICIES", "PRESETS",
    "QueueFullError", "RequestRejected", "SamplingParams", "ServerThread", "SubmitResult", "SyncEventStream",
    "TokenEvent", "build_engine", "parse_injections", "serve", "start_server",
]


def start_server(
    config: "EngineConfig | None" = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    capture_dir: str | os.PathLike[str] | None = None,
    otlp_endpoint: str | None = None,
    trace_memory: bool = False,
    **overrides: Any,
) -> "ServerThread":
    """Build + load + start an engine and its HTTP server in background threads.

    Returns once the socket is bound (with ``lazy_load=True`` before the model is loaded:
    requests wait until it is, ``/health`` says ``loading``); ``port=0`` picks a free port (``.port``/``.url``).
    ``overrides`` are EngineConfig fields. Call ``.stop()`` to shut everything down.
    """
    from diag.bundled_engine.config import EngineConfig
    from diag.bundled_engine.engine import build_engine
    from diag.bundled_engine.server import ServerThread

    engine = build_engine(
        replace(config or EngineConfig(), **overrides),
        capture_dir=capture_dir,
        otlp_endpoint=otlp_endpoint,
        trace_memory=trace_memory,
    )
    try:
        return ServerThread(engine, host, port, own_engine=True).start()
    except BaseException:
        engine.shutdown()
        raise


def serve(
    config: "EngineConfig",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    capture_dir: str | os.PathLike[str] | None = None,
    otlp_endpoint: str | None = None,
    on_ready: "Callable[[ServerThread], None] | None" = None,
    stop_event: threading.Event | None = None,
    on_load_failed: "Callable[[BaseException], None] | None" = None,
) -> None:
    """Run the server until SIGINT/SIGTERM (main thread) or ``stop_event`` is set; then clean up.

    ``on_ready`` is called once the socket is bound (with ``lazy_load`` the model may still be
    loading). If a lazy load fails, ``on_load_failed(exc)`` is called once and the server keeps
    answering (503s, ``/health`` says why) until stopped; a dead step loop ends the run.
    """
    srv = start_server(config, host=host, port=port, capture_dir=capture_dir, otlp_endpoint=otlp_endpoint)
    stop = stop_event or threading.Event()
    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        if on_ready is not None:
            on_ready(srv)
        reported = False
        while not stop.wait(0.2):
            if srv.engine.load_error is not None:
                if not reported and on_load_failed is not None:
                    on_load_failed(srv.engine.load_error)
                reported = True
                continue
            if not srv.engine.running:
                break
    finally:
        srv.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
