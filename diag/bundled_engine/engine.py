"""The engine: model runner + paged KV cache + scheduler + sampler, stepped by one loop thread.

Threading contract:

- :meth:`Engine.submit` and :meth:`Engine.abort` may be called from any thread (the HTTP
  server calls ``submit`` from a tokenizer worker thread). ``submit`` tokenizes on the calling
  thread, validates, and hands the request to the loop through a locked inbox.
- Everything else (scheduler, block manager, model, sampler, detokenizers, per-request
  traces after submission) is touched only by the step-loop thread.
- Output events are delivered by calling the request's ``on_event`` callback **on the loop
  thread**; it must be quick and must not block (see :class:`AsyncEventStream`).
- A request with a grammar (``submit(grammar=...)``, a ``response_format``) gets its ticket from
  :class:`~diag.bundled_engine.grammar_cache.GrammarCache` in ``submit``; unless the cache held it, its
  sequence waits ``deferred`` in the scheduler's queue (passed over, never blocking others) while
  a grammar thread compiles, and the loop promotes it once the compile is done (the compile
  thread wakes the loop). Its ``queue`` span covers that wait, as vLLM's time in queue covers
  ``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR``; ``ttft.grammar.*`` on the request span say how long
  and whether it was a hit. Its tokens are sampled under the grammar's masks; a failed compile
  ends that request alone with a 400-style error event.
- A request for a LoRA adapter (``submit(lora=...)``, a ``model`` naming one of ``--lora-modules``)
  runs with it. The scheduler holds at most ``max_loras`` adapters in the running batch and passes
  a request for another over while they are taken; its ``queue`` span covers that wait, and
  ``ttft.lora.wait_s`` says how long it was (from the first plan that found it waiting for a slot to
  the first that did not, to the step). Before a step's forward the loop puts the step's adapters in
  slots (:class:`~diag.bundled_engine.lora_manager.LoraManager`: a copy from host memory, or a read from disk
  first); that load runs inside the step and the ``prefill`` of the requests whose admission needed
  it (``ttft.lora.load_s``).
- With ``pd`` (disaggregated prefill/decode, :mod:`diag.bundled_engine.pd`) this engine is the prefill
  side: once a request's first token is sampled, the loop copies its KV out, frees its blocks
  and hands it to the :class:`~diag.bundled_engine.pd.DecodeLink`, whose threads own it from then on
  (transfer, the decode worker's tokens, the request's end); an abort of a handed-off request
  goes to the link.
- With ``lazy_load`` the tokenizer loads in :meth:`Engine.start` and the model loads (and warms
  up) on the loop thread itself; requests submitted meanwhile wait in the inbox (they count as
  waiting and their ``queue`` span covers the wait) and run once the model is ready. State
  changes ("ready", "failed") are announced to :meth:`Engine.add_state_listener` callbacks.

Tracing goes only through the span helpers (``collectors.spans``); with tracing off
(``NULL_SINK``) the loop skips every span call. Times on spans are Unix ns (``time.time_ns``).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Sequence

from collectors.spans import NULL_SINK, RequestTrace, TraceSink, setup_tracing
from diag.ground import stages
from diag.bundled_engine.config import EngineConfig
from diag.bundled_engine.engine_load import EngineLoad
from diag.bundled_engine.faults import sleep_ms
from diag.bundled_engine.grammar_schema import GrammarSource
from diag.bundled_engine.grammar_cache import GrammarCache
from diag.bundled_engine.kv_cache import BlockManager, blocks_needed
from diag.bundled_engine.lora_manager import LoraManager
from diag.bundled_engine.metrics import EngineMetrics
from diag.bundled_engine.model_config import ModelConfig
from diag.bundled_engine.outputs import (EngineStoppedError, EventCallback, QueueFullError, SubmitResult, SyncEventStream,
                                 TokenEvent)
from diag.bundled_engine.pd import DecodeLink
from diag.bundled_engine.request import ENGINE_NAME, EngineRequest, new_request_id, one_line
from diag.bundled_engine.sampler import SamplerState, SamplingParams
from diag.bundled_engine.scheduler import Scheduler
from diag.bundled_engine.scheduler_types import RequestRejected, Sequence as Seq
from diag.bundled_engine.step_loop import StepLoop
from diag.bundled_engine.tokenizer import Tokenizer
from diag.bundled_engine.tp import ModelRunner

log = logging.getLogger(__name__)

__all__ = ["ENGINE_NAME", "Engine", "build_engine"]


class Engine(StepLoop, EngineLoad):
    """The bundled reference engine. Build with :func:`build_engine` (loads, warms up, starts).

    Lifecycle, submission (any thread) and introspection live here; the model load in
    :class:`~diag.bundled_engine.engine_load.EngineLoad`, the step loop in
    :class:`~diag.bundled_engine.step_loop.StepLoop` and the per-request output path in
    :class:`~diag.bundled_engine.request_outputs.RequestOutputs`.
    """

    def __init__(self, config: EngineConfig, trace_sink: TraceSink | None = None) -> None:
        config.validate()
        self.config = config
        self.sink: TraceSink = trace_sink or NULL_SINK
        self.faults = config.faults
        self.spec = config.model_spec()
        self.model_config: ModelConfig = self.spec.resolve_config()
        self.model_name = config.served_model_name or self.model_config.name
        self.metrics = EngineMetrics(self.model_name, pd=config.pd)
        self.tokenizer: Tokenizer | None = None
        self.runner: ModelRunner | None = None
        #: the decode worker and the link to it (``config.pd``), set by :meth:`load`
        self.pd: DecodeLink | None = None
        self.blocks = BlockManager(config.num_kv_blocks(), config.block_size, prefix_caching=config.prefix_caching)
        self._prefix_exported = (0, 0)  # (queries, hits) tokens already added to /metrics
        self.scheduler = Scheduler(config.scheduler_config(self.model_config.max_position), self.blocks)
        self.max_context_tokens = self.scheduler.cfg.max_context_tokens
        self._inbox: deque[tuple[str, Any]] = deque()
        self._inbox_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._requests: dict[str, EngineRequest] = {}
        self._step_index = itertools.count()
        self._seed_counter = itertools.count()
        self._num_inbox_adds = 0  # "add" items in the inbox (guarded by _inbox_lock)
        self.loop_error: BaseException | None = None
        #: why the model failed to load (lazy load); then every submit is refused with it
        self.load_error: BaseException | None = None
        self.cold_start_s: dict[str, float] = {}
        self._ready = threading.Event()  # set once the model is loaded and warmed up
        self._load_t0_ns: int | None = None
        self._state_listeners: list[Callable[[], None]] = []
        self.grammars = GrammarCache(config.grammar_cache_size, config.grammar_workers, self._grammar_vocab,
                                     self.metrics, extra_delay_s=self.faults.grammar_compile_ms / 1000.0)
        self._grammar_waiting: dict[str, EngineRequest] = {}  # deferred requests by id (loop thread)
        #: LoRA adapters (``config.lora_modules``); their slots are attached once the model is built
        self.lora: LoraManager | None = None
        if config.lora_modules:
            self.lora = LoraManager.from_modules(
                config.lora_modules, self.model_config, config.lora_slots(), config.lora_host_slots(),
                config.max_lora_rank, metrics=self.metrics, extra_delay_s=self.faults.lora_load_ms / 1000.0,
                stop=self._stop)
        self._lora_waiting: dict[str, EngineRequest] = {}  # requests whose slot wait is under way (loop thread)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def tracing(self) -> bool:
        return self.sink.enabled

    def set_trace_sink(self, sink: TraceSink | None) -> None:
        """Swap the sink (benchmarks). Only between requests; affects requests submitted after."""
        self.sink = sink or NULL_SINK

    def start(self) -> None:
        """Start the step-loop thread (loads first if :meth:`load` was not called).

        With ``config.lazy_load`` only the tokenizer loads here; the model loads on the loop
        thread and this returns at once (see :attr:`state`).
        """
        if self._thread is not None:
            return
        if self.config.lazy_load and self.runner is None:
            self._load_tokenizer()
        elif self.runner is None:
            self.load()
        self._thread = threading.Thread(target=self._loop_main, name="ttft-engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, shutdown_sink: bool = True) -> None:
        """Stop the loop, abort what is left, stop TP workers, flush the trace sink. Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._thread = None
        # the loop is gone: finish leftovers here
        self._drain_inbox()
        for rid in list(self._requests):
            self._finish(self._requests[rid], "abort", time.time_ns(), error="shutdown")
        self.grammars.shutdown()
        if self.lora is not None:
            self.lora.close()
        if self.pd is not None:
            self.pd.shutdown()
        if self.runner is not None:
            self.runner.shutdown()
        if shutdown_sink:
            self.sink.shutdown()

    def __enter__(self) -> "Engine":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def running(self) -> bool:
        """The loop thread is alive and accepting requests (true while a lazy load runs)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def ready(self) -> bool:
        """The model is loaded and warmed up."""
        return self._ready.is_set()

    @property
    def state(self) -> str:
        """``"loading"``, ``"ready"``, ``"failed"`` (model load failed) or ``"stopped"``."""
        if self.load_error is not None:
            return "failed"
        if not self.running:
            return "stopped"
        return "ready" if self._ready.is_set() else "loading"

    def add_state_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the model is ready or failed to load (now, if it already is).

        Called on the loop thread (or the caller's, if already settled): it must be quick and
        must not block; read :attr:`state` inside.
        """
        with self._inbox_lock:
            settled = self._ready.is_set() or self.load_error is not None
            if not settled:
                self._state_listeners.append(callback)
        if settled:
            callback()

    def _notify_state(self) -> None:
        with self._inbox_lock:
            listeners, self._state_listeners = self._state_listeners, []
        for cb in listeners:
            try:
                cb()
            except Exception:  # a listener must never take the loop down
                log.exception("engine state listener failed")

    # -- submission (any thread) -------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Encode ``text`` on the calling thread, with the ``tokenize_ms_per_token`` fault."""
        assert self.tokenizer is not None, "engine not loaded"
        ids = self.tokenizer.encode(text)
        sleep_ms(self.faults.tokenize_ms_per_token * len(ids))
        return ids

    def num_waiting(self) -> int:
        """Requests queued but not yet running (approximate when read off the loop thread)."""
        return self._num_inbox_adds + len(self.scheduler.waiting)

    def unavailable_reason(self) -> str:
        """One line: why requests are refused (a failed model load, or not running)."""
        if self.load_error is not None:
            return f"model failed to load: {one_line(self.load_error)}"
        return "engine is not running"

    def submit(
        self,
        on_event: EventCallback,
        params: SamplingParams,
        prompt: str | None = None,
        prompt_ids: Sequence[int] | None = None,
        messages: Sequence[dict[str, str]] | None = None,
        request_id: str | None = None,
        traceparent: str | None = None,
        arrival_ns: int | None = None,
        trace_attributes: dict[str, Any] | None = None,
        max_tokens_given: bool = True,
        grammar: GrammarSource | None = None,
        lora: str | None = None,
    ) -> SubmitResult:
        """Tokenize (on this thread) and queue one request; events go to ``on_event``.

        Exactly one of ``prompt`` (text), ``prompt_ids`` or ``messages`` (chat) is used.
        ``arrival_ns`` (Unix ns) is when the caller had the parsed request; the request span
        starts there. ``max_tokens_given`` False: ``params.max_tokens`` is the server's default, not
        the request's (``kv_admission="reserve"`` then reserves up to the context limit).
        ``grammar``: the output must follow it (:func:`diag.bundled_engine.grammar_schema.grammar_source`); its
        compile starts here unless the grammar cache holds it (``SubmitResult.grammar`` resolves
        once it is ready, or raises GrammarError). ``lora``: the name of one of ``--lora-modules`` to run
        with (None: the base model). Raises ValueError/RequestRejected (-> 400), QueueFullError (-> 503),
        EngineStoppedError (-> 503). Thread-safe.
        """
        if not self.running:
            raise EngineStoppedError(self.unavailable_reason())
        assert self.tokenizer is not None
        arrival_ns = arrival_ns or time.time_ns()
        rid = request_id or new_request_id()
        trace: RequestTrace | None = None
        if self.tracing:
            attrs: dict[str, Any] = {
                stages.ATTR_ENGINE: ENGINE_NAME,
                stages.ATTR_TP_SIZE: self.config.tp,
                stages.ATTR_PP_SIZE: self.config.pp,
                stages.GEN_AI_REQUEST_MAX_TOKENS: params.max_tokens,
                stages.GEN_AI_REQUEST_TEMPERATURE: float(params.temperature),
                stages.GEN_AI_REQUEST_TOP_P: float(params.top_p),
                stages.GEN_AI_REQUEST_TOP_K: int(params.top_k),
                stages.GEN_AI_RESPONSE_ID: rid,
            }
            if self.config.pd:
                attrs[stages.ATTR_PD_DISAGGREGATED] = True
            if lora is not None:
                attrs[stages.ATTR_LORA_NAME] = lora
            if trace_attributes:
                attrs.update(trace_attributes)
            trace = self.sink.start_request(rid, model=self.model_name, attributes=attrs, traceparent=traceparent, start_ns=arrival_ns)
        try:
            if prompt_ids is not None:
                ids = [int(i) for i in prompt_ids]
                vocab = self.model_config.vocab_size
                if any(i < 0 or i >= vocab for i in ids):
                    raise RequestRejected(f"prompt token ids must be in [0, {vocab})")
            elif trace is not None:
                with trace.stage(stages.TOKENIZE):
                    ids = self._tokenize_request(prompt, messages)
            else:
                ids = self._tokenize_request(prompt, messages)
            if trace is not None:
                trace.set_attributes({stages.GEN_AI_USAGE_INPUT_TOKENS: len(ids)})
            params.validate()
            if lora is not None and (self.lora is None or lora not in self.lora.adapters):
                raise RequestRejected(f"LoRA adapter {lora!r} not found"
                                      + (f"; this server serves {', '.join(self.lora.names)}" if self.lora else
                                         "; this server serves none (--lora-modules)"))
            self.scheduler.check_admissible(len(ids), params.max_tokens)
            if self.config.pd:
                self._check_decode_side(len(ids), params.max_tokens, grammar)
            seq = Seq(
                seq_id=rid,
                prompt_ids=ids,
                params=params,
                sampler=SamplerState(params, default_seed=self.config.seed * 1_000_003 + next(self._seed_counter)),
                max_tokens_given=max_tokens_given,
                lora=lora,
            )
            req = EngineRequest(
                seq=seq,
                on_event=on_event,
                trace=trace,
                detok=self.tokenizer.detokenizer(ids),
                arrival_ns=arrival_ns,
                queue_start_ns=0,
            )
            with self._inbox_lock:
                if not self.running:
                    raise EngineStoppedError(self.unavailable_reason())
                if self.num_waiting() >= self.config.max_waiting:
                    raise QueueFullError(
                        f"server overloaded: {self.config.max_waiting} requests already waiting (max_waiting)"
                    )
                if grammar is not None:
                    self._attach_grammar(req, grammar)
                req.queue_start_ns = time.time_ns()
                self._inbox.append(("add", req))
                self._num_inbox_adds += 1
            if not self._ready.is_set():  # the loop is busy loading: keep /metrics current
                self.metrics.waiting.set(self.num_waiting())
            self._wake.set()
        except QueueFullError:
            self.metrics.rejected("queue_full")
            if trace is not None:
                trace.end(error="http_503")
            raise
        except (ValueError, EngineStoppedError) as exc:
            self.metrics.rejected("invalid" if isinstance(exc, ValueError) else "stopped")
            if trace is not None:
                trace.end(error="http_400" if isinstance(exc, ValueError) else "http_503")
            raise
        return SubmitResult(rid, len(ids), trace.trace_id_hex if trace is not None else "",
                            req.grammar.future if req.grammar is not None else None)

    def _check_decode_side(self, prompt_tokens: int, max_tokens: int, grammar: GrammarSource | None) -> None:
        """``--pd``: RequestRejected when the decode worker could never take the request."""
        if grammar is not None:
            raise RequestRejected("response_format is not supported with --pd (the decode worker has no grammar)")
        cfg = self.config
        need = blocks_needed(prompt_tokens + max_tokens, cfg.block_size)
        if need > cfg.pd_decode_blocks():
            raise RequestRejected(
                f"request needs {need} KV-cache blocks ({prompt_tokens} + {max_tokens} tokens) but the decode "
                f"worker's cache holds {cfg.pd_decode_blocks()}")

    def _attach_grammar(self, req: EngineRequest, source: GrammarSource) -> None:
        """Take the request's grammar ticket (its compile starts unless cached); defer its sequence
        until the grammar is ready. Submitting thread, before the request reaches the inbox."""
        ticket = self.grammars.get(source)
        req.grammar = ticket
        req.seq.deferred = not ticket.cache_hit
        if req.trace is not None:
            attrs: dict[str, Any] = {stages.ATTR_GRAMMAR_KEY: ticket.key, stages.ATTR_GRAMMAR_CACHE_HIT: ticket.cache_hit}
            if ticket.cache_hit:
                attrs[stages.ATTR_GRAMMAR_WAIT_S] = 0.0
            req.trace.set_attributes(attrs)
        if not ticket.cache_hit:
            ticket.future.add_done_callback(lambda _f: self._wake.set())  # on the compile thread

    def _tokenize_request(self, prompt: str | None, messages: Sequence[dict[str, str]] | None) -> list[int]:
        assert self.tokenizer is not None
        if messages is not None:
            prompt = self.tokenizer.apply_chat_template(messages)
        if prompt is None:
            raise RequestRejected("no prompt given")
        return self.tokenize(prompt)

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Abort a request (thread-safe): its blocks are freed on the loop's next turn.

        ``reason`` (e.g. ``"disconnect"``) becomes the request span's error kind.
        """
        with self._inbox_lock:
            self._inbox.append(("abort", (request_id, reason)))
        self._wake.set()

    def generate(self, prompt: str | Sequence[int], params: SamplingParams, timeout_s: float = 120.0) -> tuple[str, list[TokenEvent]]:
        """Blocking helper: submit, wait for the end, return (text, events)."""
        stream = SyncEventStream()
        if isinstance(prompt, str):
            self.submit(stream.push, params, prompt=prompt)
        else:
            self.submit(stream.push, params, prompt_ids=prompt)
        events: list[TokenEvent] = []
        while True:
            ev = stream.get(timeout_s)
            events.append(ev)
            if ev.finished:
                return "".join(e.text for e in events), events

    # -- the loop (loop thread only) -----------------------------------------------------------

    # -- introspection -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """A snapshot for tests and /health (approximate off the loop thread)."""
        return {
            "running": len(self.scheduler.running),
            "waiting": self.num_waiting(),
            "kv_free_blocks": self.blocks.num_free_blocks,
            "kv_total_blocks": self.blocks.num_blocks,
            "preemptions": self.scheduler.num_preemptions_total,
            "requests": len(self._requests),
            "waiting_grammar": self.scheduler.num_deferred(),
            **(self._lora_stats() if self.lora is not None else {}),
            **(self._pd_stats() if self.pd is not None else {}),
        }

    def _lora_stats(self) -> dict[str, Any]:
        assert self.lora is not None
        return {"waiting_lora": len(self.scheduler.lora_waiting), "lora_slots": self.lora.max_loras,
                "lora_in_slots": self.lora.in_slots(), "lora_in_host": self.lora.in_host(),
                "lora_loads": dict(self.lora.num_loads)}

    def _pd_stats(self) -> dict[str, Any]:
        assert self.pd is not None
        waiting, running, free, _ = self.pd.state
        return {"pd_decode_waiting": waiting, "pd_decode_running": running, "pd_decode_kv_free_blocks": free,
                "pd_decode_kv_total_blocks": self.pd.settings.num_blocks, "pd_in_flight": self.pd.num_in_flight(),
                "pd_decode_pid": self.pd.pid}


def build_engine(
    config: EngineConfig | None = None,
    *,
    capture_dir: str | os.PathLike[str] | None = None,
    otlp_endpoint: str | None = None,
    trace_memory: bool = False,
    trace_sink: TraceSink | None = None,
    start: bool = True,
    **overrides: Any,
) -> Engine:
    """Build, load (cold start), warm up and start an engine.

    With ``lazy_load=True`` it returns once the loop runs; the model loads on the loop thread.

    ``overrides`` are EngineConfig fields (``build_engine(model="tiny", policy="chunked")``).
    Tracing: pass ``trace_sink``, or ``capture_dir``/``otlp_endpoint``/``trace_memory`` to make
    one (``collectors.spans.setup_tracing``); none of these -> tracing off.
    """
    config = replace(config or EngineConfig(), **overrides)
    config.validate()
    if trace_sink is None:
        trace_sink = setup_tracing(
            service_name="ttft-engine",
            capture_dir=capture_dir,
            otlp_endpoint=otlp_endpoint,
            memory=trace_memory,
            provider_name="ttft-diag",
        )
    engine = Engine(config, trace_sink)
    if start:
        try:
            engine.start()
        except BaseException:
            engine.shutdown()
            raise
    return engine
