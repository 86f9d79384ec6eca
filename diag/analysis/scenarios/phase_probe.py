"""The probe process of one ``ttft demo`` phase: its own interpreter, spawned per phase.

:func:`probe_child` is the process's entry point (``multiprocessing`` spawn context): it waits
for the phase's engine URL, runs the phase's probe steps pass after pass and sends everything
it would write into a capture (spans, series, meta) back to the demo as messages on a queue
(:class:`QueueWriter`), where :class:`diag.analysis.scenarios.director.Director` writes them into the
one live capture. Its own interpreter, so the dashboard, the OTLP receiver and the scraper
never delay the probe's event loop.

Threading: everything here runs on the child's event-loop thread.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, ProbeSession, WorkloadSpec, eventloop
from diag.analysis.scenarios.runner import step_chunks

if TYPE_CHECKING:  # the plan's type only; the director imports this module
    from diag.analysis.scenarios.director import PhasePlan

#: a phase that has not finished one pass of its steps stops anyway after this x its length
MAX_OVERRUN = 3.0


class QueueWriter:
    """The probe child's stand-in for the capture writer: everything it would write goes to
    the demo process as messages on ``queue`` (spans, series, meta), where the director
    writes it into the one live capture. Used on the child's event-loop thread only."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.path = Path(".")

    def append_span_lines(self, lines: Any) -> None:
        lines = list(lines)
        if lines:
            self.queue.put(("spans", lines))

    def write_series(self, source: str, frame: Any) -> Path:
        self.queue.put(("series", source, frame))
        return Path(f"{source}.parquet")

    def append_series(self, source: str, frame: Any) -> Path:
        return self.write_series(source, frame)  # the director appends: one file per phase

    def update_meta(self, **fields: Any) -> None:
        self.queue.put(("meta", fields))

    def close(self) -> None:
        return None


def probe_child(plan: PhasePlan, phase_s: float, inbox: Any, outbox: Any, stop: Any) -> None:
    """Entry point of the probe process of one phase (spawned): waits for the engine's URL on
    ``inbox``, runs the phase's steps and reports on ``outbox``. Its own interpreter, so the
    dashboard, the OTLP receiver and the scraper never delay its event loop."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nothing may scribble over the dashboard
    os.dup2(devnull, 2)
    try:
        url = inbox.get()
        if url is None:
            return
        eventloop.run(_drive(url, plan, phase_s, outbox, stop))
    except BaseException as exc:  # reported to the demo, shown on screen
        outbox.put(("error", f"probe: {type(exc).__name__}: {exc}"))
    finally:
        outbox.put(("exit",))


async def _drive(url: str, plan: PhasePlan, phase_s: float, outbox: Any, stop: Any) -> None:
    """Run the phase's steps against ``url``, pass after pass, for ``phase_s`` seconds
    (finishing the first pass: a sweep's verdict needs all its points)."""
    first = plan.steps[0]
    chunks = [(step, c) for step in plan.steps for c in step_chunks(step, plan.name)]
    pool = max(c[0].concurrency for _, c in chunks)
    cfg = ProbeConfig(url, load=LoadSpec(concurrency=pool, requests=1),
                      workload=WorkloadSpec(LengthSpec.parse(first.input_tokens), LengthSpec.parse(first.output_tokens)),
                      timeout_s=60.0, slo=plan.slo)
    async with ProbeSession(cfg, QueueWriter(outbox), pool_size=pool) as session:  # type: ignore[arg-type]
        workloads: dict[int, Any] = {}
        for step in plan.steps:
            w = session.workload.with_input(LengthSpec.parse(step.input_tokens))
            w.spec = replace(w.spec, output_tokens=LengthSpec.parse(step.output_tokens))
            workloads[id(step)] = w
        # warm-up before the phase's clock starts: the engine's first requests, and the
        # probe's own first span flush (it imports the OTLP encoder: a ~100 ms loop stall
        # that the load-generator rule would otherwise see)
        for step in plan.steps:
            if step.warmup and not stop.is_set():
                load0, inp0, seg0 = step_chunks(step, plan.name)[0]
                warm_load = replace(load0, requests=step.warmup, duration_s=None, warmup_requests=0, rate_rps=None)
                w = workloads[id(step)]
                await session.phase(warm_load, w.with_input(inp0) if inp0 is not None else w, "warmup")
        gc.collect()
        gc.freeze()  # what exists now is never collected again: shorter GC pauses on the loop
        t0 = time.time()
        outbox.put(("started", t0))
        passes = 0
        while not stop.is_set():
            for step, (load, inp, segment) in chunks:
                elapsed = time.time() - t0
                if stop.is_set() or elapsed >= MAX_OVERRUN * phase_s or (passes and elapsed >= phase_s):
                    break
                w = workloads[id(step)]
                await session.phase(load, w.with_input(inp) if inp is not None else w, segment)
            else:
                passes += 1
                if time.time() - t0 < phase_s:
                    continue
            break
        outbox.put(("done", time.time(), passes, len(session.results)))
