"""The bundled engine's step loop: drain the inbox, schedule, forward, sample, emit; one thread.

:class:`StepLoop` is a base of :class:`~diag.bundled_engine.engine.Engine` and runs on its step-loop thread
only: it takes submitted requests and aborts from the inbox, promotes requests whose grammar compile
is done, loads the model first with ``lazy_load``, runs one :meth:`StepLoop._step` per iteration
(LoRA adapters put in slots before the forward), keeps the ``/metrics`` gauges current and records
one step span per iteration. Times are Unix ns.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from collectors.spans import TraceSink
from diag.ground import stages
from diag.bundled_engine.faults import sleep_ms
from diag.bundled_engine.grammar import GrammarMatcher
from diag.bundled_engine.lora import LoraError
from diag.bundled_engine.lora_manager import LoraLoad, LoraManager
from diag.bundled_engine.model import SeqInput
from diag.bundled_engine.outputs import TokenEvent
from diag.bundled_engine.request import EngineRequest, one_line
from diag.bundled_engine.request_outputs import RequestOutputs
from diag.bundled_engine.sampler import sample
from diag.bundled_engine.scheduler_types import StepPlan, WAIT_GRAMMAR, WAIT_HEAD_OF_LINE, WAIT_KV_BLOCKS, WAIT_LORA

log = logging.getLogger("diag.bundled_engine.engine")


def _pipeline_attrs(pipe: Any) -> dict[str, Any]:
    """A step's pipeline account (``diag.bundled_engine.pp.PipelineAccount``) as step-span attributes."""
    return {
        stages.ATTR_STEP_PP_SIZE: pipe.pp_size,
        stages.ATTR_STEP_PP_MICROBATCHES: pipe.microbatches,
        stages.ATTR_STEP_PP_COMPUTE_S: list(pipe.compute_s),
        stages.ATTR_STEP_PP_COMM_S: list(pipe.comm_s),
        stages.ATTR_STEP_PP_BUBBLE_S: list(pipe.bubble_s),
    }


class StepLoop(RequestOutputs):
    """The loop-thread half of the engine; :class:`~diag.bundled_engine.engine.Engine` adds lifecycle and submission."""

    # the engine's state, set by Engine.__init__ (diag.bundled_engine.engine)
    tracing: bool
    sink: TraceSink
    lora: LoraManager | None
    load_error: BaseException | None
    loop_error: BaseException | None
    _inbox: deque[tuple[str, Any]]
    _inbox_lock: threading.Lock
    _wake: threading.Event
    _stop: threading.Event
    _step_index: itertools.count[int]
    _num_inbox_adds: int
    _prefix_exported: tuple[int, int]
    load: Callable[[], None]
    num_waiting: Callable[[], int]
    unavailable_reason: Callable[[], str]
    _notify_state: Callable[[], None]

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._num_inbox_adds = 0
        for kind, payload in items:
            if kind == "add":
                req: EngineRequest = payload
                self._requests[req.seq.seq_id] = req
                self.scheduler.add(req.seq)
                self.metrics.prompt_tokens.inc(len(req.seq.prompt_ids))
                if req.seq.deferred:
                    self._grammar_waiting[req.seq.seq_id] = req
                elif req.grammar is not None:
                    req.matcher = GrammarMatcher(req.grammar.future.result())
            elif kind == "abort":
                rid, reason = payload
                r = self._requests.get(rid)
                if r is not None:
                    self.metrics.aborted.inc()
                    self._finish(r, "abort", time.time_ns(), error=reason)
                elif self.pd is not None and self.pd.abort(rid, reason):
                    self.metrics.aborted.inc()
        if self._grammar_waiting:
            self._promote_grammars()

    def _promote_grammars(self) -> None:
        """Deferred requests whose compile is done: ready ones become ordinary waiting requests
        (``ttft.grammar.wait_s``: queue entry -> compile done); a failed compile ends its request
        with a 400-style error. Loop thread."""
        for rid, r in list(self._grammar_waiting.items()):
            assert r.grammar is not None
            fut = r.grammar.future
            if not fut.done():
                continue
            del self._grammar_waiting[rid]
            now = time.time_ns()
            exc = None if fut.cancelled() else fut.exception()
            if fut.cancelled() or exc is not None:
                self.metrics.rejected("grammar")
                msg = one_line(exc) if exc is not None else "grammar compile cancelled (shutting down)"
                self._finish(r, "error", now, error="http_400" if exc is not None else "shutdown", message=msg,
                             error_status=400 if exc is not None else 503)
                continue
            compiled = fut.result()
            r.matcher = GrammarMatcher(compiled)
            r.seq.deferred = False
            if r.trace is not None:
                wait_s = max(0, compiled.ready_ns - r.queue_start_ns) / 1e9
                r.trace.set_attributes({stages.ATTR_GRAMMAR_WAIT_S: wait_s})

    def _lazy_load(self) -> bool:
        """Load the model on the loop thread (lazy load). False when it failed or was stopped.

        On failure the queued requests end with a one-line error (their spans with
        ``http_503``), :attr:`load_error` says why, and later submits are refused with it.
        """
        try:
            self.load()
        except BaseException as exc:
            stopped = self._stop.is_set()
            if not stopped:
                log.error("model failed to load: %s", one_line(exc))
                self.load_error = exc
            with self._inbox_lock:
                self._stop.set()  # no new submissions from here on
                items = list(self._inbox)
                self._inbox.clear()
                self._num_inbox_adds = 0
            msg = self.unavailable_reason() if not stopped else "server shut down while the model was loading"
            now = time.time_ns()
            for kind, payload in items:
                if kind != "add":
                    continue
                req: EngineRequest = payload
                self.metrics.rejected("load_failed" if not stopped else "stopped")
                if req.trace is not None:
                    req.trace.end(end_ns=now, error="http_503")
                seq = req.seq
                self._deliver(req, TokenEvent(seq.seq_id, "", None, len(seq.prompt_ids), 0, finished=True,
                                              finish_reason="error", error=msg))
            self.metrics.waiting.set(0)
            self._notify_state()
            return False
        if self._stop.is_set():
            return False
        self._notify_state()
        return True

    def _loop_main(self) -> None:
        if self.runner is None and not self._lazy_load():
            return
        try:
            while not self._stop.is_set():
                self._wake.clear()
                self._drain_inbox()
                if not self.scheduler.has_work():
                    self._update_gauges()
                    self._wake.wait(0.5)
                    continue
                self._step()
        except BaseException as exc:  # keep the process alive; fail every request loudly
            log.exception("engine loop died")
            self.loop_error = exc
            self._stop.set()
            now = time.time_ns()
            for rid in list(self._requests):
                self._finish(self._requests[rid], "error", now, error=f"engine_error: {exc}")

    def _update_gauges(self) -> None:
        m = self.metrics
        m.running.set(len(self.scheduler.running))
        m.kv_usage.set(self.blocks.usage_ratio())
        m.kv_free_blocks.set(self.blocks.num_free_blocks)
        waiting = self.num_waiting()
        sched = self.scheduler
        deferred = sched.num_deferred() + (sched.waiting_reasons.get(WAIT_LORA, 0) if sched.waiting else 0)
        m.waiting.set(waiting)
        m.set_waiting_by_reason(sched.waiting_reasons if sched.waiting else {}, max(0, waiting - deferred), deferred)
        if self.lora is not None:
            m.set_lora_info(self.lora.max_loras, list(sched.running_loras()),
                            sorted({q.lora for q in sched.waiting if q.lora is not None}))
        pc = self.blocks.prefix_cache
        if pc is not None and (pc.queries_tokens, pc.hits_tokens) != self._prefix_exported:
            q0, h0 = self._prefix_exported
            m.prefix_cache_queries.inc(pc.queries_tokens - q0)
            m.prefix_cache_hits.inc(pc.hits_tokens - h0)
            self._prefix_exported = (pc.queries_tokens, pc.hits_tokens)

    def _step(self) -> None:
        """One engine iteration: schedule, forward, sample, detokenize, emit."""
        assert self.runner is not None
        sleep_ms(self.faults.scheduler_stall_ms)
        tracing = self.tracing
        t_start = time.time_ns()
        plan: StepPlan = self.scheduler.schedule()
        for seq in plan.preempted:
            r = self._requests[seq.seq_id]
            r.requeue_ns = t_start  # text already emitted stays emitted; recompute continues
            self.metrics.preemptions.inc()
        loads: list[LoraLoad] = []
        if self.lora is not None:
            self._note_lora_waits(t_start)
            if plan.items:
                loads = self._load_loras(plan, t_start)
        if not plan.items:
            # nothing can run (e.g. waiting for blocks that only a finishing request frees)
            self._update_gauges()
            time.sleep(0.001)
            return
        inputs: list[SeqInput] = []
        for item in plan.items:
            seq = item.seq
            if item.is_prefill:
                r = self._requests[seq.seq_id]
                if r.first_sched_ns is None:
                    r.first_sched_ns = t_start
                    self.metrics.queue_time.observe((t_start - r.queue_start_ns) / 1e9)
                    if r.trace is not None:
                        r.trace.record_stage(stages.QUEUE, r.queue_start_ns, t_start,
                                             {stages.ATTR_PD_SIDE: stages.PD_SIDE_PREFILL} if self.pd is not None else None)
                elif r.requeue_ns is not None:
                    if r.trace is not None:
                        r.trace.record_stage(stages.QUEUE, r.requeue_ns, t_start, {
                            stages.ATTR_REQUEUE: True,
                            **({stages.ATTR_PD_SIDE: stages.PD_SIDE_PREFILL} if self.pd is not None else {})})
                    r.requeue_ns = None
            inputs.append(
                SeqInput(
                    seq.token_slice(item.start_pos, item.start_pos + item.num_new_tokens),
                    item.start_pos,
                    list(self.blocks.block_table(seq.seq_id)),
                    want_logits=item.completes,
                    lora_slot=self.lora.slot_of(seq.lora) if self.lora is not None and seq.lora is not None else None,
                )
            )
        logits, comm_s = self.runner.execute(inputs)
        t_fwd = time.time_ns()
        pipe = getattr(self.runner, "last_pipeline", None)  # a PipelineAccount when pp > 1
        completes = []
        for item in plan.items:
            self.scheduler.on_step_done(item)
            r = self._requests[item.seq.seq_id]
            if r.first_token_ns is None and item.is_prefill:
                r.prefill_comm_s += comm_s
                if pipe is not None:
                    r.prefill_bubble_s += pipe.mean_bubble_s
            if item.completes:
                completes.append((item, r))
        if completes:
            assert logits is not None
            t_s0 = time.time_ns()
            masks = [r.matcher.allowed() if r.matcher is not None else None for _, r in completes]
            tokens = sample(logits, [it.seq.sampler for it, _ in completes],
                            masks if any(m is not None for m in masks) else None)
            t_s1 = time.time_ns()
            for (item, r), tok in zip(completes, tokens):
                if self.pd is not None:
                    self._handoff(r, tok, t_fwd, t_s0, t_s1)
                else:
                    self._emit_token(r, tok, t_fwd, t_s0, t_s1, tracing)
        t_end = time.time_ns()
        m = self.metrics
        m.step_time.observe((t_end - t_start) / 1e9)
        if self.config.tp > 1 or self.config.pp > 1:
            m.step_comm.observe(comm_s)
            m.comm_total.inc(comm_s)
        self._update_gauges()
        if tracing:
            self.sink.record_step(
                t_start,
                t_end,
                {
                    stages.ATTR_STEP_INDEX: next(self._step_index),
                    stages.ATTR_STEP_PREFILL_TOKENS: plan.num_prefill_tokens,
                    stages.ATTR_STEP_PREFILL_SEQS: plan.num_prefill_seqs,
                    stages.ATTR_STEP_DECODE_SEQS: plan.num_decode_seqs,
                    stages.ATTR_STEP_KV_USAGE: self.blocks.usage_ratio(),
                    stages.ATTR_STEP_COMM_S: comm_s,
                    stages.ATTR_STEP_WAITING: len(self.scheduler.waiting),
                    stages.ATTR_STEP_RUNNING: len(self.scheduler.running),
                    stages.ATTR_STEP_PREEMPTED: len(plan.preempted),
                    stages.ATTR_STEP_WAITING_KV: self.scheduler.waiting_reasons.get(WAIT_KV_BLOCKS, 0),
                    stages.ATTR_STEP_WAITING_HOL: self.scheduler.waiting_reasons.get(WAIT_HEAD_OF_LINE, 0),
                    stages.ATTR_STEP_WAITING_GRAMMAR: self.scheduler.waiting_reasons.get(WAIT_GRAMMAR, 0),
                    **(_pipeline_attrs(pipe) if pipe is not None else {}),
                    **({stages.ATTR_STEP_PD_SIDE: stages.PD_SIDE_PREFILL} if self.pd is not None else {}),
                    **(self._lora_step_attrs(plan, loads) if self.lora is not None else {}),
                },
            )

    # -- LoRA adapters (loop thread) -----------------------------------------------------------

    def _note_lora_waits(self, t_plan: int) -> None:
        """After a plan at ``t_plan`` (Unix ns): start the slot wait of requests the plan passed over
        for a LoRA slot, end it for those it no longer does (admitted, or waiting for something else)."""
        blocked = self.scheduler.lora_waiting
        for rid, r in list(self._lora_waiting.items()):
            if rid not in blocked:
                assert r.lora_wait_since_ns is not None
                r.lora_wait_ns += t_plan - r.lora_wait_since_ns
                r.lora_wait_since_ns = None
                del self._lora_waiting[rid]
        for rid in blocked:
            r = self._requests.get(rid)
            if r is not None and r.lora_wait_since_ns is None:
                r.lora_wait_since_ns = t_plan
                self._lora_waiting[rid] = r

    def _load_loras(self, plan: StepPlan, t_plan: int) -> list[LoraLoad]:
        """Put the plan's adapters in slots before the forward; a prefill of a request whose adapter
        was loaded counts the load as its own (``ttft.lora.load_s``). An adapter whose file cannot be
        read ends the plan's requests for it with a 500-style error (taken out of the plan)."""
        assert self.lora is not None
        names = [it.seq.lora for it in plan.items if it.seq.lora is not None]
        if not names:
            return []
        try:
            loads = self.lora.activate(names, keep=self.scheduler.running_loras())
        except LoraError as exc:
            bad = next(n for n in dict.fromkeys(names) if n not in self.lora.in_slots())
            log.error("LoRA adapter %r failed to load: %s", bad, one_line(exc))
            for it in [it for it in plan.items if it.seq.lora == bad]:
                self._finish(self._requests[it.seq.seq_id], "error", t_plan, error="lora_load",
                             message=f"LoRA adapter {bad!r} failed to load: {one_line(exc)}", error_status=500)
            plan.items = [it for it in plan.items if it.seq.lora != bad]
            return self._load_loras(plan, t_plan) if plan.items else []
        by_name = {ld.name: ld.seconds for ld in loads}
        for it in plan.items:
            lora = it.seq.lora
            if it.is_prefill and lora in by_name:
                r = self._requests[it.seq.seq_id]
                if r.first_token_ns is None:
                    r.lora_load_s += by_name[lora]
        return loads

    def _lora_step_attrs(self, plan: StepPlan, loads: list[LoraLoad]) -> dict[str, Any]:
        return {
            stages.ATTR_STEP_WAITING_LORA: self.scheduler.waiting_reasons.get(WAIT_LORA, 0),
            stages.ATTR_STEP_LORAS: len({it.seq.lora for it in plan.items if it.seq.lora is not None}),
            stages.ATTR_STEP_LORA_LOAD_S: sum(ld.seconds for ld in loads),
        }
