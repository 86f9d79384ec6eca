"""``ttft probe``: drive a designed load at any OpenAI-compatible streaming endpoint, measure
what users experience, and write a capture the rules can diagnose.

Front door (everything a caller needs)::

    from collectors.probe import ProbeConfig, LoadSpec, WorkloadSpec, LengthSpec, SweepSpec
    cfg = ProbeConfig("http://127.0.0.1:8000", load=LoadSpec(concurrency=4, requests=50),
                      workload=WorkloadSpec(LengthSpec.parse("fixed:512")), output="cli")
    result = run_probe(cfg)                                   # one probe -> ProbeResult
    result = run_sweep(cfg, SweepSpec("prompt", max_value=2048))  # segments prompt=64, ...

Workers behind it: :mod:`.run` (the front door), :mod:`.session` (one client, one capture,
several phases; its types in :mod:`.session_types`), :mod:`.client` (streaming client),
:mod:`.workload` (prompts), :mod:`.load` (load shapes, worker processes), :mod:`.sweep`,
:mod:`.metrics`, :mod:`.health` (client saturation), :mod:`.alongside` (/metrics and NVML hooks).
"""

from collectors.probe.client import StreamingClient
from collectors.probe.endpoint import Endpoint, resolve_endpoint
from collectors.probe.results import ERROR_KINDS, RequestResult
from collectors.probe.health import HealthMonitor, summarize as summarize_health
from collectors.probe.load import LoadSpec, PhaseOutcome, run_phase
from collectors.probe.metrics import DEFINITIONS, compute_metrics, format_metrics, format_sweep_table
from collectors.probe.run import run_probe, run_probe_async, run_sweep, run_sweep_async
from collectors.probe.session import ProbeSession
from collectors.probe.session_types import ProbeConfig, ProbeResult
from collectors.probe.sweep import SWEEP_KINDS, SweepError, SweepSpec
from collectors.probe.workload import LengthSpec, TokenCounter, Workload, WorkloadError, WorkloadSpec

__all__ = [
    "DEFINITIONS", "ERROR_KINDS", "Endpoint", "HealthMonitor", "LengthSpec", "LoadSpec", "PhaseOutcome",
    "ProbeConfig", "ProbeResult", "ProbeSession", "RequestResult", "SWEEP_KINDS", "StreamingClient",
    "SweepError", "SweepSpec", "TokenCounter", "Workload", "WorkloadError", "WorkloadSpec", "compute_metrics",
    "format_metrics", "format_sweep_table", "resolve_endpoint", "run_phase", "run_probe", "run_probe_async",
    "run_sweep", "run_sweep_async", "summarize_health",
]
