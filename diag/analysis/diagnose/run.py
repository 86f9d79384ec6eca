"""Runs the adaptive plan against a server: one probe session, one capture, a verdict after
every step, and a stop as soon as the verdict is confident, the design has run, the budget is
spent, requests burst into errors, or the user presses Ctrl-C.

Each step is a catalog :class:`~diag.analysis.scenarios.catalog.ProbeStep` turned into probe loads by the
scenario runner's :func:`~diag.analysis.scenarios.runner.step_chunks` (the demo's translation) and run as
phases of one :class:`collectors.probe.ProbeSession` (compatibility check, prompt-length
calibration, ``--metrics`` scraped alongside). After each step the capture so far is diagnosed
as ``ttft analyze`` would (:func:`diag.analysis.analyze_paths`, joined with any server capture).

Threading: :func:`run_diagnose` blocks the calling thread and runs everything on one event loop
(:mod:`collectors.probe.eventloop`); ``on_event`` is called on that loop's thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collectors.probe import (LengthSpec, LoadSpec, ProbeConfig, ProbeSession, SweepSpec, WorkloadSpec,
                              compute_metrics, eventloop)
from collectors.probe.context_limit import record as context_limit_record
from collectors.probe.context_limit import refusal_of as context_limit_refusal
from collectors.probe.eventloop import being_cancelled
from collectors.probe.health import HealthMonitor
from collectors.probe.schemas import parse_response_format
from collectors.probe.sweep import stop_reason
from diag.analysis import Analysis, analyze_paths
from diag.ground.capture import CaptureError, CaptureWriter
from diag.analysis.diagnose.limits import context_limit
from diag.analysis.diagnose.plan import Decision, PlanConfig, Step, confident_stop, next_step, segment_of
from diag.analysis.diagnose.points import Point, point_from_metrics
from diag.analysis.diagnose.result import DiagnoseResult, StepRecord, named_of, startup_of, time_to_verdict, verdict_of
from diag.analysis.diagnose.users_workload import UsersWorkload
from diag.analysis.scenarios.runner import step_chunks

#: Events for live progress: ("note", text), ("wait", text) (the server is not serving yet: worth
#: saying at once even without progress), ("step", StepRecord), ("point", StepRecord),
#: ("verdict", StepRecord), ("stopped", text); progress of requests goes to ``progress``.
OnEvent = Callable[[str, Any], None]
#: Warm-up requests before the baseline (excluded from the results; the start-up shows in them).
WARMUP_REQUESTS = 2
#: how a limit the prompt ladder met is recorded (meta.json ``probe.context_limit.how``)
LADDER_LIMIT_HOW = "ttft diagnose: prompt ladder"


class DiagnoseError(CaptureError):
    """A run that cannot start (server unreachable, bad option): one line, exit code 2."""


@dataclass
class DiagnoseConfig:
    """Everything one ``ttft diagnose`` run needs. ``join`` are server captures (``ttft serve
    --capture``, ``ttft instrument``, ``ttft receive``) joined into every verdict."""

    url: str
    output: Path
    plan: PlanConfig = field(default_factory=PlanConfig)
    api: str | None = None
    model: str | None = None
    api_key: str | None = None
    slo: dict[str, float] | None = None
    #: one /metrics URL, or ``--metrics`` values (``prefill=URL``, ``decode=URL``: collectors.prometheus.metrics_targets)
    metrics_url: str | tuple[str, ...] | None = None
    join: list[str] = field(default_factory=list)
    rules_file: str | None = None
    tokenizer_path: str | None = None
    exact_output: bool = True
    dropped: frozenset[str] = frozenset()
    timeout_s: float = 30.0
    seed: int = 0
    #: seconds to wait for a server that is not serving yet (refused, 503 loading), reported as start-up
    wait_ready_s: float = 60.0
    #: what the users send (lengths only): findings that hold for some prompts are judged for theirs
    workload: UsersWorkload | None = None
    #: worker processes each step's load is split over (``--workers``), as Ray actors with ``ray_address``
    workers: int = 1
    #: run the workers as Ray actors on this cluster (``--ray``: local, auto, ray://HOST:PORT)
    ray_address: str | None = None


class _Run:
    """One run's state on the event loop."""

    def __init__(self, cfg: DiagnoseConfig, on_event: OnEvent | None, progress: Any) -> None:
        self.cfg = cfg
        self.emit: OnEvent = on_event or (lambda kind, payload: None)
        self.progress = progress
        self.records: list[StepRecord] = []
        self.notes: list[str] = []
        self.t0 = 0.0
        self.sent = 0
        self.analysis: Analysis | None = None
        self.plan = cfg.plan
        self.stopped = ""
        self.interrupted = False
        self.startup: dict[str, Any] = {}
        self.endpoint: Any = None
        self.contact_unix_s = time.time()
        self.final: Analysis | None = None
        self.result: DiagnoseResult | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def analyze(self) -> Analysis | None:
        try:
            return analyze_paths([self.cfg.output, *self.cfg.join], rules_file=self.cfg.rules_file, slo=self.cfg.slo)
        except CaptureError as exc:
            self.notes.append(f"analysis failed: {exc}")
            return None

    async def main(self) -> None:
        cfg = self.cfg
        if cfg.output.exists() and (not cfg.output.is_dir() or any(cfg.output.iterdir())):
            raise DiagnoseError(f"{cfg.output}: exists and is not empty (a capture holds one run: choose another -o)")
        self.contact_unix_s = time.time()
        itl = [v for k, v in (cfg.slo or {}).items() if k.startswith("itl_")]
        if itl and self.plan.itl_target_s is None:
            self.plan = replace(self.plan, itl_target_s=min(itl))
        if cfg.workload is not None and cfg.workload.shared_prefix_tokens is not None:
            self.plan = replace(self.plan, users_shared_prefix_tokens=cfg.workload.shared_prefix_tokens)
        if cfg.workload is not None:
            self.plan = replace(self.plan, users_response_format=cfg.workload.response_format,
                                users_lora=cfg.workload.lora)
        pc = self.plan
        probe = ProbeConfig(
            cfg.url, api=cfg.api, model=cfg.model, api_key=cfg.api_key,
            load=LoadSpec(concurrency=pc.max_concurrency, requests=1),
            workload=WorkloadSpec(LengthSpec("fixed", pc.input_tokens), LengthSpec("fixed", pc.output_tokens),
                                  exact_output=cfg.exact_output, seed=cfg.seed),
            tokenizer_path=cfg.tokenizer_path, timeout_s=cfg.timeout_s, slo=cfg.slo, metrics_url=cfg.metrics_url,
            progress=self.progress, dropped=cfg.dropped, concurrency_set=True,
            wait_ready_s=cfg.wait_ready_s, on_wait=self.waiting, workers=cfg.workers, ray_address=cfg.ray_address)
        meta: dict[str, Any] = {"kind": "diagnose"}  # known to the rules from the first step
        if cfg.workload is not None:
            meta["users_workload"] = cfg.workload.to_meta()
        writer = CaptureWriter(cfg.output, meta=meta)
        if cfg.workload is not None:
            self.note(f"your users' workload (--workload): {cfg.workload.describe()}; the baseline and the load ramp "
                      f"send {pc.input_tokens}-token prompts")
        self.t0 = time.monotonic()
        task = asyncio.current_task()
        try:
            session = ProbeSession(probe, writer, pool_size=pc.max_concurrency)
            async with session:
                self.endpoint = session.endpoint
                for n in session.notes:
                    self.note(n)
                first_error = session.compat.get("first_error")
                if first_error in ("connect_refused", "connect_error", "timeout"):
                    waited = f" in {session.ready.waited_s:.0f} s (--wait-ready)" if session.ready else ""
                    raise DiagnoseError(f"{cfg.url}: the server did not answer ({first_error}){waited}")
                limit, how = await context_limit(cfg.url, cfg.model, cfg.api_key)
                self.note(how)
                if limit:
                    self.plan = replace(self.plan, context_limit_tokens=limit)
                try:
                    await self._steps(session)
                except asyncio.CancelledError:
                    self.interrupted = True
                    self.stopped = "interrupted (Ctrl-C): the capture holds every request that finished"
                    if task is not None:
                        task.uncancel()
            self.final = self.analyze() if any(r.point is not None and r.point.ok for r in self.records) \
                else self.analysis
            if self.final is not None:
                self.startup = startup_of(self.final, [r.point for r in self.records if r.point is not None],
                                        self.contact_unix_s)
            if session.ready is not None and session.ready.not_serving_s > 0:
                self.startup.update(not_serving_s=session.ready.not_serving_s, not_serving=list(session.ready.seen))
            self.result = self._result()
            writer.update_meta(kind="diagnose", diagnose=self.result.to_dict(with_analysis=False))
        finally:
            writer.close()

    def _result(self) -> DiagnoseResult:
        verdict, conf = verdict_of(self.final)
        records = self.records
        if records and verdict is not None and records[-1].verdict != verdict:
            records[-1].verdict, records[-1].confidence = verdict, conf
        ep = self.endpoint
        probing = (records[-1].ended_s or self.elapsed()) if records else 0.0
        return DiagnoseResult(self.cfg.output, ep.url if ep else self.cfg.url, ep.api if ep else self.cfg.api,
                              ep.model if ep else self.cfg.model, records, self.stopped, self.interrupted, self.final,
                              probing, time_to_verdict(records, verdict), self.sent, self.notes, self.startup,
                              self.plan.context_limit_tokens)

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.emit("note", text)

    def waiting(self, text: str) -> None:
        """The probe waits for a server that is not serving yet: a note, and a "wait" event."""
        self.notes.append(text)
        self.emit("wait", text)

    async def _steps(self, session: ProbeSession) -> None:
        while True:
            if being_cancelled():  # an interrupt some await swallowed: stop here all the same
                raise asyncio.CancelledError
            verdict, conf = verdict_of(self.analysis)
            points = [r.point for r in self.records if r.point is not None]
            running = self.analysis.diagnosis if self.analysis is not None else None
            stop = (confident_stop(verdict, conf, points, self.plan, running is not None and running.verdict.black_box)
                    if verdict is not None and conf is not None else None)
            if stop:
                self.stopped = stop
                return
            d: Decision = next_step(self.plan, points, self.elapsed(), confident=False, requests_sent=self.sent,
                                    leading=named_of(self.analysis))
            if d.learned.get("context_limit_tokens"):
                self.plan = replace(self.plan, context_limit_tokens=int(d.learned["context_limit_tokens"]))
            if d.step is None:
                self.stopped = d.done or "the design ran"
                return
            rec = StepRecord(len(self.records) + 1, d.step, self.elapsed())
            self.records.append(rec)
            self.emit("step", rec)
            rec.point = await self._run_step(session, d.step)
            rec.ended_s = self.elapsed()
            self.emit("point", rec)
            await self._between_steps(session)
            rec.verdict, rec.confidence = verdict_of(self.analysis)
            self.emit("verdict", rec)

    async def _between_steps(self, session: ProbeSession) -> None:
        """Diagnose the capture so far. The client-health monitor pauses meanwhile: the analysis
        holds this loop for a while with no request in flight, which is not the load generator
        lagging behind a request (the monitor's samples measure the probing only)."""
        mon = session.monitor
        if mon is not None:
            session.health_samples.append(await mon.stop())
            session.monitor = None
        try:
            self.analysis = self.analyze()
        finally:
            if mon is not None:
                session.monitor = HealthMonitor()
                session.monitor.start()

    async def _run_step(self, session: ProbeSession, step: Step) -> Point:
        """Run one step as probe phases; a rung sends its requests one at a time and ends at the first
        refused as longer than the server's context (:mod:`collectors.probe.context_limit`), so that
        finding the context limit costs one request, not a rung of them; that refusal is recorded as
        the experiment's limit (``ProbeSession.record_context_limit``) and counted apart in the
        point (``over_context``), not as a failure. A follow-up's prompts of a length the design
        chose (:meth:`Step.chosen_prompt_tokens`: the long ramp's, the mixed follow-up's long ones)
        are the same: refused as too long, they are the experiment's limit. Another 4xx, and any
        refusal of the users' own length (the baseline, the ramp), is a failure like any other."""
        pc = self.plan
        seg = segment_of(step.kind, step.value)
        ps = step.probe_step(pc)
        ((load, inp, label),) = step_chunks(ps, seg)
        left_s = max(1.0, pc.budget_s - self.elapsed())
        load = replace(load, duration_s=left_s, concurrency=min(load.concurrency, pc.max_concurrency),
                       warmup_requests=WARMUP_REQUESTS if step.kind == "baseline" else 0, seed=self.cfg.seed)
        if ps.shared_prefix[0]:  # the prefix follow-up: groups of a fresh prefix, its repeats and a control
            workload = session.workload.with_prefix(LengthSpec.parse(ps.input_tokens), *ps.shared_prefix)
        elif ps.inject_long[1]:  # the mixed follow-up: every EVERY-th prompt long
            workload = session.workload.with_long(LengthSpec.parse(ps.input_tokens), *ps.inject_long,
                                                  output_tokens=LengthSpec.parse(ps.output_tokens))
        else:
            # a ladder rung's length (a sweep point), else the step's own (the long ramp's); the step's answers
            workload = session.workload.with_input(inp or LengthSpec.parse(ps.input_tokens),
                                                   LengthSpec.parse(ps.output_tokens))
        if ps.response_format or ps.lora:  # the grammar and LoRA follow-ups: the same prompts, their design
            workload = workload.with_design(
                parse_response_format(ps.response_format, ps.schema_properties, ps.schema_file)
                if ps.response_format else None, ps.lora)
        loads = [load]
        if step.kind == "prompt" and load.requests and load.requests > 1:
            loads = [replace(load, requests=1)] * load.requests  # one at a time: a refusal ends the rung
        t = time.monotonic()
        results: list[Any] = []
        dur = 0.0
        over: list[str] = []
        refusal: dict[str, Any] | None = None
        chosen = step.chosen_prompt_tokens(pc)  # a length the design chose: its refusals are the design's limit
        for one in loads:
            outcome = await session.phase(one, workload, label)
            results.extend(outcome.results)
            dur += outcome.duration_s
            self.sent += len(outcome.results)
            refusal = context_limit_refusal(outcome.results) if chosen is not None else None
            if refusal is not None:
                # refused as longer than the server's context: the experiment's limit, recorded as such
                how = LADDER_LIMIT_HOW if step.kind == "prompt" else f"ttft diagnose: {step.kind} follow-up"
                session.record_context_limit(context_limit_record(refusal, label, chosen,
                                                                  self._longest_accepted(), how))
                over = [label]
                break  # longer prompts of this rung would be refused too
        wall = time.monotonic() - t
        metrics = compute_metrics(results, dur, self.cfg.slo, over_context=over)
        stop = None
        if step.kind in ("concurrency", "rate"):
            stop = stop_reason(SweepSpec(step.kind, [step.value]), step.value, metrics)
        point = point_from_metrics(step.kind, step.value, label, metrics, wall, stop)
        if over and refusal is not None and refusal.get("message"):
            point = replace(point, error_example=str(refusal["message"])[:200])
        if step.kind == "baseline":
            self._recalibrate(session, point)
        return point

    def _longest_accepted(self) -> float | None:
        """The longest prompt answered so far (tokens): the ladder's rungs, else the baseline's."""
        pts = [r.point for r in self.records if r.point is not None and r.point.ok]
        rungs = [p.value for p in pts if p.kind == "prompt"]
        if rungs:
            return max(rungs)
        return float(self.plan.input_tokens) if any(p.kind == "baseline" for p in pts) else None

    def _recalibrate(self, session: ProbeSession, base: Point) -> None:
        """When the probe's calibration got no usage (its long calibration prompts refused, or no
        usage at all) but the baseline's answers carry usage.prompt_tokens, size the prompts from
        those: the ladder's lengths are then what they say."""
        w = session.workload
        if session.tokenizer is not None or w.calibration or not base.input_tokens_mean:
            return
        ratio = base.input_tokens_mean / self.plan.input_tokens
        if abs(ratio - 1.0) <= 0.1:
            return
        w.calibrate(ratio / w.words_per_token, "from the baseline's usage.prompt_tokens")
        if w.calibration:
            self.note(f"prompt lengths: {w.calibration} (the probe's calibration got no usage)")


def run_diagnose(cfg: DiagnoseConfig, on_event: OnEvent | None = None, progress: Any = None) -> DiagnoseResult:
    """Run ``ttft diagnose`` against ``cfg.url`` into ``cfg.output``; blocks until done (or Ctrl-C,
    which still returns a result over a valid capture)."""
    run = _Run(cfg, on_event, progress)
    eventloop.run(run.main())
    run.emit("stopped", run.stopped)
    assert run.result is not None
    return run.result


__all__ = ["DiagnoseConfig", "DiagnoseError", "DiagnoseResult", "StepRecord", "run_diagnose"]
