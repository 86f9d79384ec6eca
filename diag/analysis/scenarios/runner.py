"""Run a scenario: engine processes + the probe, into one client capture and server captures.

Layout of a scenario run directory::

    OUT/client/      the probe's capture (client spans, client health, the scenario in meta.json)
    OUT/server-N/    the engine's capture for phase N (server spans, engine steps, cold start)
    OUT/prompts.jsonl  the mixed workload, when the scenario uses one

:func:`step_load`, :func:`step_sweep` and :func:`step_chunks` turn a catalog
:class:`~diag.analysis.scenarios.catalog.ProbeStep` into the probe's loads, for this runner and for the
demo's live phases alike.

The probe steps run in this process by default; :class:`ProbeWorkers` spreads them over worker
processes or Ray actors as ``ttft probe --workers N [--ray ADDRESS]`` does (``ttft scenarios check
--ray local --workers 2``), each step's requests and client spans merged into the one client capture.

Threading: everything runs on the calling thread except the engine (its own process) and,
for the loadgen scenario, a CPU-hog thread in this process that starves the probe on purpose
(only a probe in this process: spread workers are not starved by it).
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, SweepSpec, WorkloadSpec, run_probe, run_sweep
from collectors.probe.sweep import label, point_load
from collectors.probe.schemas import parse_response_format
from diag.ground.capture import CaptureWriter
from diag.analysis.scenarios.calibrate import Calibration
from diag.analysis.scenarios.catalog import Phase, ProbeStep, Scenario
from diag.analysis.scenarios.engine_process import EngineProcess


@dataclass(frozen=True)
class ProbeWorkers:
    """Where the probe steps run: in this process (the default), in ``workers`` processes of this
    machine, or with ``ray_address`` (``local``, ``auto``, ``ray://HOST:PORT``, ``HOST:PORT``) in
    that many Ray actors; the fields of :class:`~collectors.probe.ProbeConfig` of the same names."""

    workers: int = 1
    ray_address: str | None = None

    @property
    def spread(self) -> bool:
        """Whether the probe runs outside this process (a CPU hog here does not starve it)."""
        return self.workers > 1 or self.ray_address is not None

    def to_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "ray_address": self.ray_address}


IN_PROCESS = ProbeWorkers()


@dataclass
class ScenarioRun:
    """Where a scenario's captures are, and what was planned."""

    scenario: Scenario
    out_dir: Path
    client: Path
    servers: list[Path] = field(default_factory=list)
    slo: str | None = None
    wall_s: float = 0.0

    @property
    def all_captures(self) -> list[Path]:
        return [self.client, *self.servers]


def _prompt_text(tokens: int, rng: random.Random) -> str:
    """Text of about ``tokens`` tokens for the bundled tokenizer (trimmed to the exact count)."""
    from diag.bundled_engine.tokenizer import Tokenizer

    tok = Tokenizer.bundled()
    words = ["data", "model", "token", "river", "cloud", "paper", "light", "stone", "green", "quick", "table", "music"]
    text = f"{rng.randrange(10**6)} " + " ".join(rng.choice(words) for _ in range(tokens * 2))
    ids = tok.encode(text)[:tokens]
    return tok.decode(ids)


def write_prompts(path: Path, prompts: tuple[tuple[int, int], ...], seed: int = 0) -> Path:
    """A JSONL mixed workload: one line per (input tokens, max tokens), cycled by the probe."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for inp, out in prompts:
            fh.write(json.dumps({"prompt": _prompt_text(inp, rng), "max_tokens": out}) + "\n")
    return path


class _ClientHog:
    """Starves this process's event loop: a busy thread and a long GIL switch interval."""

    def __init__(self, switch_interval_s: float = 0.05) -> None:
        self._stop = threading.Event()
        self._interval = switch_interval_s
        self._old = sys.getswitchinterval()
        self._thread = threading.Thread(target=self._spin, name="ttft-client-hog", daemon=True)

    def _spin(self) -> None:
        x = 0
        while not self._stop.is_set():
            for i in range(20000):
                x ^= i

    def __enter__(self) -> "_ClientHog":
        sys.setswitchinterval(self._interval)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        sys.setswitchinterval(self._old)


def step_load(step: ProbeStep, **fields: Any) -> LoadSpec:
    """The step's load: its concurrency, request count and open-loop rate, plus ``fields``
    (the scenario runner adds the warm-up, the demo a duration for a step without a count)."""
    return LoadSpec(concurrency=step.concurrency, requests=step.requests, rate_rps=step.rate_rps, **fields)


def step_sweep(step: ProbeStep) -> SweepSpec | None:
    """The step's sweep (None when it is a single probe)."""
    if not step.sweep:
        return None
    return SweepSpec(step.sweep, values=[float(v) for v in step.sweep_values] or None,
                     requests_per_point=step.requests_per_point)


def step_chunks(step: ProbeStep, default_segment: str) -> list[tuple[LoadSpec, LengthSpec | None, str]]:
    """A step as short probe chunks (the demo's live phases): (LoadSpec, input LengthSpec or
    None, segment). A sweep becomes one chunk per point, labelled as ``ttft probe --sweep``
    labels them; a step without a request count runs 4 s."""
    base = step_load(step, duration_s=None if step.requests else 4.0)
    spec = step_sweep(step)
    if spec is None:
        return [(base, None, step.segment or default_segment)]
    out = []
    for v in spec.point_values():
        load = point_load(spec, v, base, user_set_concurrency=False)
        inp = LengthSpec("fixed", int(v)) if step.sweep == "prompt" else None
        out.append((load, inp, label(step.sweep, v)))
    return out


def _run_step(url: str, model: str, step: ProbeStep, writer: CaptureWriter, prompts_file: Path | None,
              slo: dict[str, float] | None, where: ProbeWorkers = IN_PROCESS) -> Any:
    load = step_load(step, warmup_requests=step.warmup)
    workload = WorkloadSpec(LengthSpec.parse(step.input_tokens), LengthSpec.parse(step.output_tokens),
                            prompts_file=str(prompts_file) if prompts_file else None,
                            shared_prefix_tokens=step.shared_prefix[0], shared_prefix_repeats=step.shared_prefix[1],
                            inject_long_tokens=step.inject_long[0], inject_long_every=step.inject_long[1],
                            omit_max_tokens=step.omit_max_tokens,
                            response_format=(parse_response_format(step.response_format, step.schema_properties)
                                             if step.response_format else None),
                            lora_adapters=step.lora)
    # the engine's own tokenizer sizes the prompts exactly (and no calibration requests go first)
    from diag.bundled_engine.tokenizer import BUNDLED_TOKENIZER_PATH
    # api and model given: no detection request reaches the engine before the measured ones; nor
    # a compatibility check (the bundled engine takes every optional element, and a request
    # sent first would meet an injected cold start in the users' place)
    cfg = ProbeConfig(url, api="completions", model=model or None, load=load, workload=workload, output=None,
                      segment=step.segment, slo=slo, timeout_s=120, compat_check=False,
                      tokenizer_path=str(BUNDLED_TOKENIZER_PATH),
                      workers=where.workers, ray_address=where.ray_address)
    spec = step_sweep(step)
    if spec is None and len(step.lora) > 1:  # as ttft probe --lora: one adapter, then all of them
        spec = SweepSpec("lora", max_value=float(len(step.lora)), requests_per_point=step.requests)
    elif spec is None and step.inject_long[1]:  # as ttft probe --inject-long: no long prompt, then every EVERY-th
        spec = SweepSpec("long_every", max_value=float(step.inject_long[1]), requests_per_point=step.requests)
    if spec is not None:
        return run_sweep(cfg, spec, writer)
    return run_probe(cfg, writer)


def run_scenario(scenario: Scenario, out_dir: str | Path, cal: Calibration,
                 log: Callable[[str], None] | None = None, where: ProbeWorkers = IN_PROCESS) -> ScenarioRun:
    """Run every phase of ``scenario`` into ``out_dir`` (replaced if it exists), the probe steps
    where ``where`` says (each step a probe session of its own: with Ray, keep the actors around a
    run of scenarios, :func:`collectors.probe.ray_workers.kept`, or each step places its own after
    its engine started, seconds a cold start's first requests must not wait)."""
    from diag.ground.slo import parse_slo

    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    plan = scenario.build(cal)
    slo = parse_slo(plan.slo) if plan.slo else None
    meta: dict[str, Any] = {"scenario": {"name": scenario.name, "expected_category": scenario.category,
                                         "cause": scenario.cause, "injected": plan.injected, "calibration": cal.to_dict()}}
    if plan.slo:
        meta["slo"] = plan.slo  # the targets its users hold; analyze applies them unless --slo overrides
    if where.spread:
        meta["scenario"]["probe_workers"] = where.to_dict()
    run = ScenarioRun(scenario, out, out / "client", slo=plan.slo)
    writer = CaptureWriter(run.client, meta=meta)
    t0 = time.monotonic()
    try:
        for i, phase in enumerate(plan.phases):
            server_dir = out / f"server-{i}"
            run.servers.append(server_dir)
            prompts = None
            if any(s.prompts for s in phase.steps):
                prompts = write_prompts(out / f"prompts-{i}.jsonl", next(s.prompts for s in phase.steps if s.prompts))
            _run_phase(phase, server_dir, writer, prompts, slo, log, where)
    finally:
        writer.close()
    run.wall_s = time.monotonic() - t0
    for server_dir in run.servers:
        if server_dir.exists():
            _merge_meta(server_dir, meta)
    return run


def _run_phase(phase: Phase, server_dir: Path, writer: CaptureWriter, prompts: Path | None,
               slo: dict[str, float] | None, log: Callable[[str], None] | None, where: ProbeWorkers) -> None:
    eng = EngineProcess(phase.serve_args, capture_dir=server_dir).start()
    try:
        if log:
            log(f"  engine {' '.join(phase.serve_args) or '(defaults)'} at {eng.url}")
        for step in phase.steps:
            if step.starve_client:
                if log and where.spread:
                    log("  note: the CPU hog runs in this process; the spread probe workers are not starved by it")
                with _ClientHog():
                    _run_step(eng.url, eng.model, step, writer, prompts, slo, where)
            else:
                _run_step(eng.url, eng.model, step, writer, prompts, slo, where)
    finally:
        eng.stop()


def _merge_meta(capture: Path, fields: dict[str, Any]) -> None:
    path = capture / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        meta = {}
    meta.update(fields)
    path.write_text(json.dumps(meta, indent=2, default=str, sort_keys=True))
