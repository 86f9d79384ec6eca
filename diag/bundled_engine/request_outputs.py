"""The bundled engine's output path: a sampled token becomes text, metrics, stages and an event.

:class:`RequestOutputs` is a base of :class:`~diag.bundled_engine.engine.Engine`: a token is detokenized and
delivered (or, with ``pd``, the request is handed to the decode worker), and a request's end frees
its blocks, closes its trace and sends its last event. Step-loop thread only (and
:meth:`Engine.shutdown` once the loop is gone); events go to each request's ``on_event`` on that
thread. Times are Unix ns.
"""

from __future__ import annotations

import logging
import time

from diag.ground import stages
from diag.bundled_engine.config import EngineConfig
from diag.bundled_engine.faults import FaultConfig, sleep_ms
from diag.bundled_engine.kv_cache import BlockManager, position_slots
from diag.bundled_engine.metrics import EngineMetrics
from diag.bundled_engine.outputs import TokenEvent
from diag.bundled_engine.pd import DecodeLink, HandOff
from diag.bundled_engine.pd_wire import kv_meta
from diag.bundled_engine.request import EngineRequest
from diag.bundled_engine.sampler import stop_reason
from diag.bundled_engine.scheduler import Scheduler
from diag.bundled_engine.tokenizer import Tokenizer
from diag.bundled_engine.tp import ModelRunner

log = logging.getLogger("diag.bundled_engine.engine")


class RequestOutputs:
    """Per-request output and end, on the step-loop thread."""

    # the engine's state, set by Engine.__init__ (diag.bundled_engine.engine)
    tracing: bool
    config: EngineConfig
    faults: FaultConfig
    metrics: EngineMetrics
    scheduler: Scheduler
    blocks: BlockManager
    runner: ModelRunner | None
    tokenizer: Tokenizer | None
    pd: DecodeLink | None
    max_context_tokens: int
    _requests: dict[str, EngineRequest]
    _grammar_waiting: dict[str, EngineRequest]
    _lora_waiting: dict[str, EngineRequest]

    def _handoff(self, r: EngineRequest, tok: int, t_fwd: int, t_s0: int, t_s1: int) -> None:
        """``--pd``: the prefill side is done with ``r`` once its first token ``tok`` is sampled: record
        its prefill-side stages and TTFT, copy its KV out, free its blocks, give it to the link."""
        assert self.pd is not None and self.runner is not None
        seq = r.seq
        m = self.metrics
        first_sched = r.first_sched_ns if r.first_sched_ns is not None else t_fwd
        prefill_ttft_s = (t_s1 - r.arrival_ns) / 1e9
        m.ttft.observe(prefill_ttft_s)
        m.prefill_time.observe((t_fwd - first_sched) / 1e9)
        if r.trace is not None:
            cached = {stages.GEN_AI_USAGE_CACHED_TOKENS: seq.num_cached_tokens} if self.config.prefix_caching else None
            r.trace.record_stage(stages.PREFILL, first_sched, t_fwd, cached)
            r.trace.record_stage(stages.SAMPLE, t_s0, t_s1)
            r.trace.set_attributes({stages.ATTR_PD_PREFILL_TTFT_S: prefill_ttft_s})
        n = len(seq.prompt_ids)
        slots = position_slots(self.blocks.block_table(seq.seq_id), n, self.blocks.block_size)
        kv = self.runner.cache.export_slots(slots)
        meta = kv_meta(seq.seq_id, seq.prompt_ids, seq.params, seq.sampler.default_seed,
                       seq.sampler.generator_if_started(), tok, kv)
        self._requests.pop(seq.seq_id, None)
        self.scheduler.remove(seq)
        self.pd.handoff(HandOff(meta, kv, kv.numel() * kv.element_size(), r.on_event, r.trace, r.detok,
                                r.arrival_ns, t_s1))

    def _emit_token(self, r: EngineRequest, tok: int, t_fwd: int, t_s0: int, t_s1: int, tracing: bool) -> None:
        seq = r.seq
        seq.output_ids.append(tok)
        if r.matcher is not None:
            r.matcher.advance(tok)
        t_d0 = time.time_ns()
        text = r.detok.add(tok)
        sleep_ms(self.faults.detokenize_ms_per_token)
        reason = stop_reason(
            tok, len(seq.output_ids), seq.num_tokens, seq.params, self.tokenizer.eos_token_ids if self.tokenizer else frozenset(), self.max_context_tokens
        )
        if reason is None and r.matcher is not None and r.matcher.complete:
            reason = "stop"  # the grammar's output is whole and nothing may follow
        if reason is not None:
            text += r.detok.flush()
        t_d1 = time.time_ns()
        m = self.metrics
        m.generation_tokens.inc()
        if r.first_token_ns is None:
            r.first_token_ns = t_d1
            first_sched = r.first_sched_ns if r.first_sched_ns is not None else t_fwd
            m.ttft.observe((t_d1 - r.arrival_ns) / 1e9)
            m.prefill_time.observe((t_fwd - first_sched) / 1e9)
            if r.trace is not None:
                tr = r.trace
                cached = {stages.GEN_AI_USAGE_CACHED_TOKENS: seq.num_cached_tokens} if self.config.prefix_caching else None
                if self.config.pp > 1:  # pipeline idle inside its prefill steps (diag.bundled_engine.pp)
                    cached = {**(cached or {}), stages.ATTR_PP_BUBBLE_S: r.prefill_bubble_s}
                tr.record_stage(stages.PREFILL, first_sched, t_fwd, cached)
                if self.config.tp > 1 or self.config.pp > 1:
                    comm_ns = int(r.prefill_comm_s * 1e9)
                    tr.record_stage(stages.COMM, first_sched, first_sched + comm_ns, {stages.ATTR_DURATION_S: r.prefill_comm_s})
                tr.record_stage(stages.SAMPLE, t_s0, t_s1)
                tr.record_stage(stages.DETOKENIZE, t_d0, t_d1)
        else:
            m.itl.observe((t_d1 - (r.last_token_ns or t_d1)) / 1e9)
        r.last_token_ns = t_d1
        if r.trace is not None:
            r.trace.add_token_time(t_d1)
        if reason is not None:
            self._finish(r, reason, t_d1, last_text=text, last_token=tok)
        else:
            self._deliver(r, TokenEvent(seq.seq_id, text, tok, len(seq.prompt_ids), len(seq.output_ids)))

    def _deliver(self, r: EngineRequest, ev: TokenEvent) -> None:
        try:
            r.on_event(ev)
        except Exception:  # a consumer must never take the loop down
            log.exception("on_event callback failed for %s", r.seq.seq_id)

    def _finish(
        self,
        r: EngineRequest,
        reason: str,
        end_ns: int,
        error: str | None = None,
        last_text: str = "",
        last_token: int | None = None,
        message: str | None = None,
        error_status: int | None = None,
    ) -> None:
        """End a request: free its blocks, close its trace, record metrics, send the last event.

        ``error`` is the span's error kind and, unless ``message`` is given, the event's error;
        ``error_status`` the HTTP status the event asks for (None: the server's default)."""
        seq = r.seq
        self._requests.pop(seq.seq_id, None)
        self._grammar_waiting.pop(seq.seq_id, None)
        if self._lora_waiting.pop(seq.seq_id, None) is not None and r.lora_wait_since_ns is not None:
            r.lora_wait_ns += max(0, end_ns - r.lora_wait_since_ns)
            r.lora_wait_since_ns = None
        self.scheduler.remove(seq)
        seq.finish_reason = reason
        if reason in ("stop", "length"):
            m = self.metrics
            m.success(reason)
            m.e2e.observe((end_ns - r.arrival_ns) / 1e9)
            if r.first_token_ns is not None:
                m.decode_time.observe((end_ns - r.first_token_ns) / 1e9)
        if r.trace is not None:
            tr = r.trace
            if r.first_token_ns is not None and r.last_token_ns is not None and len(seq.output_ids) > 1:
                tr.record_stage(stages.DECODE, r.first_token_ns, r.last_token_ns)
            tr.set_attributes(
                {
                    stages.GEN_AI_USAGE_INPUT_TOKENS: len(seq.prompt_ids),
                    stages.GEN_AI_USAGE_OUTPUT_TOKENS: len(seq.output_ids),
                    stages.ATTR_PREEMPTIONS: seq.preemptions,
                    stages.GEN_AI_RESPONSE_FINISH_REASONS: [reason],
                }
            )
            if self.config.prefix_caching:
                tr.set_attributes({stages.GEN_AI_USAGE_CACHED_TOKENS: seq.num_cached_tokens})
            if seq.lora is not None:
                tr.set_attributes({stages.ATTR_LORA_WAIT_S: r.lora_wait_ns / 1e9, stages.ATTR_LORA_LOAD_S: r.lora_load_s})
            tr.end(end_ns=end_ns, error=error)
        self._deliver(
            r,
            TokenEvent(
                seq.seq_id,
                last_text,
                last_token,
                len(seq.prompt_ids),
                len(seq.output_ids),
                finished=True,
                finish_reason=reason,
                error=message if message is not None else error,
                error_status=error_status,
            ),
        )
