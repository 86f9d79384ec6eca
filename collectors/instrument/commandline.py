"""What ``ttft instrument`` builds before it starts COMMAND: the environment and the command line.

Python engines get the bootstrap (:data:`collectors.instrument.BOOTSTRAP_DIR` first on
``PYTHONPATH``; our settings in ``TTFT_INSTRUMENT_*``). Engines that trace themselves get their
own switches pointed at an OTLP endpoint (our receiver, gRPC, unless the user gave ``--otlp``):

======  ===========================================================  ==================================
engine  recognised COMMAND                                           flags added (unless already given)
======  ===========================================================  ==================================
vllm    ``vllm serve …``, ``python -m vllm.entrypoints.openai.…``     ``--otlp-traces-endpoint URL
                                                                     --collect-detailed-traces all``
sglang  ``python -m sglang.launch_server …``                          ``--enable-trace
                                                                     --otlp-traces-endpoint HOST:PORT``
tgi     ``text-generation-launcher …``                               ``--otlp-endpoint URL``
======  ===========================================================  ==================================

These command lines are tested as built (no GPU in CI), not against running engines. Pure
functions; no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from collectors.instrument import BOOTSTRAP_DIR
from collectors.instrument import runtime

SELF_TRACING = ("vllm", "sglang", "tgi")


@dataclass(frozen=True)
class Plan:
    """COMMAND as it will run: argv, the environment changes, and whether it needs our receiver."""

    engine: str  # "transformers", "vllm", "sglang", "tgi" or "python" (bootstrap only)
    argv: list[str]
    env: dict[str, str]
    added_flags: list[str] = field(default_factory=list)
    needs_receiver: bool = False


def _python_module(argv: Sequence[str]) -> str | None:
    """``python -m MOD …`` -> MOD."""
    if argv and os.path.basename(argv[0]).startswith("python") and "-m" in argv[1:]:
        i = list(argv).index("-m")
        return argv[i + 1] if i + 1 < len(argv) else None
    return None


def detect_engine(argv: Sequence[str]) -> str:
    """Which engine COMMAND starts (by its executable / module name)."""
    if not argv:
        return "python"
    exe = os.path.basename(argv[0])
    module = _python_module(argv) or ""
    if (exe == "vllm" and "serve" in argv[1:2]) or module.startswith("vllm.entrypoints"):
        return "vllm"
    if module == "sglang.launch_server" or (exe == "sglang" and "serve" in argv[1:2]):
        return "sglang"
    if exe == "text-generation-launcher":
        return "tgi"
    if (exe == "transformers" and "serve" in argv[1:2]) or module == "transformers.cli.transformers":
        return "transformers"
    return "python"


def _has(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def engine_flags(engine: str, argv: Sequence[str], grpc_endpoint: str) -> list[str]:
    """The engine's own tracing flags for ``grpc_endpoint``, skipping any flag already given.

    ``grpc_endpoint`` is "host:port" (our receiver's OTLP/gRPC address; each engine gets the form
    it parses) or a URL the user gave, passed as written (SGLang gets its host:port).
    """
    host_port = grpc_endpoint.split("://", 1)[-1]
    has_scheme = "://" in grpc_endpoint
    wanted: list[tuple[str, str | None]]
    if engine == "vllm":
        url = grpc_endpoint if has_scheme else f"grpc://{grpc_endpoint}"
        wanted = [("--otlp-traces-endpoint", url), ("--collect-detailed-traces", "all")]
    elif engine == "sglang":
        wanted = [("--enable-trace", None), ("--otlp-traces-endpoint", host_port)]
    elif engine == "tgi":
        wanted = [("--otlp-endpoint", grpc_endpoint if has_scheme else f"http://{grpc_endpoint}")]
    else:
        return []
    out: list[str] = []
    for flag, value in wanted:
        if not _has(argv, flag):
            out += [flag] if value is None else [flag, value]
    return out


def build_env(base: Mapping[str, str], capture_dir: str | None, otlp_url: str | None,
              argv: Sequence[str], targets: str = "transformers", toggle_signal: str | None = None,
              paused: bool = False) -> dict[str, str]:
    """COMMAND's environment: the bootstrap first on PYTHONPATH (any existing entries kept after it).

    ``toggle_signal`` (a name such as ``USR2``) lets that signal pause and resume the hooks;
    ``paused`` starts them paused.
    """
    env = dict(base)
    old = env.get("PYTHONPATH", "")
    boot = str(BOOTSTRAP_DIR)
    env["PYTHONPATH"] = boot + (os.pathsep + old if old else "")
    env[runtime.ENV_BOOTSTRAP_DIR] = boot
    env[runtime.ENV_TARGETS] = targets
    env[runtime.ENV_COMMAND] = " ".join(argv)[:500]
    env.pop(runtime.ENV_CAPTURE, None)
    env.pop(runtime.ENV_OTLP, None)
    env.pop(runtime.ENV_TOGGLE_SIGNAL, None)
    env.pop(runtime.ENV_PAUSED, None)
    if toggle_signal:
        env[runtime.ENV_TOGGLE_SIGNAL] = toggle_signal
        if paused:
            env[runtime.ENV_PAUSED] = "1"
    if capture_dir is not None:
        env[runtime.ENV_CAPTURE] = os.path.abspath(capture_dir)
    if otlp_url is not None:
        env[runtime.ENV_OTLP] = otlp_url
    return env


def plan(argv: Sequence[str], base_env: Mapping[str, str], capture_dir: str | None = None,
         otlp_url: str | None = None, receiver_grpc: str | None = None, toggle_signal: str | None = None,
         paused: bool = False) -> Plan:
    """Build the Plan. For a self-tracing engine the flags point at ``otlp_url`` when given
    (as the user wrote it), else at ``receiver_grpc`` (our receiver, which then must run)."""
    engine = detect_engine(argv)
    env = build_env(base_env, capture_dir, otlp_url, argv, toggle_signal=toggle_signal, paused=paused)
    if engine not in SELF_TRACING:
        return Plan(engine, list(argv), env)
    endpoint = otlp_url or receiver_grpc or "127.0.0.1:4317"
    added = engine_flags(engine, argv, endpoint)
    if engine == "vllm" and not endpoint.startswith("https://"):
        env.setdefault("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")  # vLLM's gRPC exporter: plain text
    return Plan(engine, list(argv) + added, env, added, needs_receiver=otlp_url is None)
