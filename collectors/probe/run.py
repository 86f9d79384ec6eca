"""The probe's front door: :func:`run_probe` (one probe) and :func:`run_sweep` (one segment per
sweep point), each one :class:`~collectors.probe.session.ProbeSession` into one capture.

Threading: the blocking forms run their own event loop (:func:`.eventloop.run`, uvloop when
installed) and must not be called from a running loop; the ``*_async`` forms run on the caller's.
"""

from __future__ import annotations

from pathlib import Path

from collectors.probe import context_limit, eventloop
from collectors.probe.session import ProbeSession
from collectors.probe.session_types import ProbeConfig, ProbeResult
from collectors.probe.sweep import SweepSpec, label, point_load, stop_reason
from collectors.probe.workload import LengthSpec
from diag.ground.capture import CaptureWriter


async def run_probe_async(config: ProbeConfig, writer: CaptureWriter | None = None) -> ProbeResult:
    """One probe on the running loop: warm-up, measured load, capture (see :func:`run_probe`)."""
    session = ProbeSession(config, writer)
    async with session:
        await session.phase(config.load, segment=config.segment)
        overall = session.overall_metrics()
        session.record_summary(overall, None)
    assert session.endpoint is not None
    return ProbeResult(session.endpoint, overall, session.client_health(), session.results, [],
                       Path(session.writer.path) if session.writer else None, session.notes)


def run_probe(config: ProbeConfig, writer: CaptureWriter | None = None) -> ProbeResult:
    """Probe ``config.url`` with ``config.load`` and ``config.workload``; write the capture to
    ``config.output`` (or into ``writer``). Blocks until done; must not be called from a
    running event loop (use :func:`run_probe_async` there). ``config.cpus`` pins this whole
    process first (every thread; the workers it starts inherit or get their own CPU)."""
    _pin(config)
    return eventloop.run(run_probe_async(config, writer))


def _pin(config: ProbeConfig) -> None:
    if config.cpus:
        from collectors.probe.affinity import pin_process

        pin_process(config.cpus)


async def run_sweep_async(config: ProbeConfig, sweep: SweepSpec, writer: CaptureWriter | None = None) -> ProbeResult:
    """A sweep on the running loop: one segment per point in one capture."""
    values = sweep.point_values()
    pool = max([config.load.concurrency] + [int(v) for v in values if sweep.kind == "concurrency"]
               + ([config.load.concurrency if config.concurrency_set else 256] if sweep.kind == "rate" else []))
    session = ProbeSession(config, writer, pool_size=pool)
    stopped: str | None = None
    ran: list[float] = []
    async with session:
        for v in values:
            seg = label(sweep.kind, v)
            load = point_load(sweep, v, config.load, config.concurrency_set)
            wl = session.workload.with_input(LengthSpec("fixed", int(v))) if sweep.kind == "prompt" else None
            if sweep.kind == "lora":  # the first v adapters of --lora
                wl = session.workload.with_design(session.workload.spec.response_format,
                                                  session.workload.spec.lora_adapters[: int(v)])
            if sweep.kind == "long_every":  # the control without long prompts, then every v-th prompt long
                wl = session.workload.with_long_every(int(v))
            outcome = await session.phase(load, wl, seg)
            m = session.metrics(outcome)
            session.segments.append((seg, m))
            too_long = None
            if sweep.kind == "prompt":
                refusal = context_limit.refusal_of(outcome.results)
                if refusal is not None:
                    # the longest earlier point with an answer (segments and ran line up; this point is not in ran)
                    accepted = max((x for x, (_, mx) in zip(ran, session.segments) if mx["requests"]["ok"]), default=None)
                    too_long = context_limit.describe(session.record_context_limit(context_limit.record(
                        refusal, seg, v, accepted, "ttft probe --sweep prompt: the first point refused as too long")))
                    session.segments[-1] = (seg, session.metrics(outcome))  # its refusals apart, not errors
            ran.append(v)
            stopped = stop_reason(sweep, v, m, too_long)
            if stopped:
                break
        overall = session.overall_metrics()
        info = {**sweep.describe(), "points_run": [label(sweep.kind, v) for v in ran], "stopped": stopped,
                "context_limit": session.context_limit}
        session.record_summary(overall, info)
    assert session.endpoint is not None
    return ProbeResult(session.endpoint, overall, session.client_health(), session.results, session.segments,
                       Path(session.writer.path) if session.writer else None, session.notes, info)


def run_sweep(config: ProbeConfig, sweep: SweepSpec, writer: CaptureWriter | None = None) -> ProbeResult:
    """Run a sweep (prompt | concurrency | rate) into one capture; blocks until done."""
    _pin(config)
    return eventloop.run(run_sweep_async(config, sweep, writer))


__all__ = ["run_probe", "run_probe_async", "run_sweep", "run_sweep_async"]
