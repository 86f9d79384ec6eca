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
  :class:`~diag.engine.grammar_cache.GrammarCache` in ``submit``; unless the cache held it, its
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
  slots (:class:`~diag.engine.lora_manager.LoraManager`: a copy from host memory, or a read from disk
  first); that load runs inside the step and the ``prefill`` of the requests whose admission needed
  it (``ttft.lora.load_s``).
- With ``pd`` (disaggregated prefill/decode, :mod:`diag.engine.pd`) this engine is the prefill
  side: once a request's first token is sampled, the loop copies its KV out, frees its blocks
  and hands it to the :class:`~diag.engine.pd.DecodeLink`, whose threads own it from then on
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
import uuid
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from collectors.spans import NULL_SINK, RequestTrace, TraceSink, setup_tracing
from diag import stages
from diag.engine.config import EngineConfig
from diag.engine.faults import sleep_ms
from diag.engine.grammar import GrammarMatcher, GrammarSource, TokenVocab
from diag.engine.grammar_cache import GrammarCache, GrammarTicket
from diag.engine.kv_cache import BlockManager, blocks_needed, position_slots
from diag.engine.lora import LoraError
from diag.engine.lora_manager import LoraLoad, LoraManager
from diag.engine.lora_slots import LoraSlots
from diag.engine.metrics import EngineMetrics
from diag.engine.outputs import (EngineStoppedError, EventCallback, QueueFullError, SubmitResult, SyncEventStream,
                                 TokenEvent)
from diag.engine.model import ModelConfig, SeqInput
from diag.engine.pd import DecodeLink, HandOff
from diag.engine.pd_wire import kv_meta
from diag.engine.pd_worker import DecodeSettings
from diag.engine.sampler import SamplerState, SamplingParams, sample, stop_reason
from diag.engine.scheduler import (
    RequestRejected,
    Scheduler,
    Sequence as Seq,
    StepPlan,
    WAIT_GRAMMAR,
    WAIT_HEAD_OF_LINE,
    WAIT_KV_BLOCKS,
    WAIT_LORA,
)
from diag.engine.tokenizer import IncrementalDetokenizer, Tokenizer
from diag.engine.tp import CacheSpec, ModelRunner, make_runner

log = logging.getLogger(__name__)

ENGINE_NAME = "bundled"


# --- per-request state (loop thread only) ---------------------------------------------------


@dataclass
class _Request:
    seq: Seq
    on_event: EventCallback
    trace: RequestTrace | None
    detok: IncrementalDetokenizer
    arrival_ns: int
    queue_start_ns: int
    first_sched_ns: int | None = None
    requeue_ns: int | None = None
    prefill_comm_s: float = 0.0
    prefill_bubble_s: float = 0.0  # pipeline idle seconds of its prefill steps (pp > 1)
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    grammar: GrammarTicket | None = None  # a response_format's grammar (None: unconstrained)
    matcher: GrammarMatcher | None = None  # set once the grammar is ready
    lora_wait_ns: int = 0  # waits for a LoRA slot that ended (ns)
    lora_wait_since_ns: int | None = None  # the plan that found it waiting for a slot (a wait under way)
    lora_load_s: float = 0.0  # its adapter's loads in the steps that admitted it


def _pipeline_attrs(pipe: Any) -> dict[str, Any]:
    """A step's pipeline account (``diag.engine.pp.PipelineAccount``) as step-span attributes."""
    return {
        stages.ATTR_STEP_PP_SIZE: pipe.pp_size,
        stages.ATTR_STEP_PP_MICROBATCHES: pipe.microbatches,
        stages.ATTR_STEP_PP_COMPUTE_S: list(pipe.compute_s),
        stages.ATTR_STEP_PP_COMM_S: list(pipe.comm_s),
        stages.ATTR_STEP_PP_BUBBLE_S: list(pipe.bubble_s),
    }


def _new_request_id() -> str:
    return uuid.uuid4().hex[:24]


def _one_line(exc: BaseException) -> str:
    """``exc`` as one line: its message (or type name), newlines folded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


class Engine:
    """The bundled reference engine. Build with :func:`build_engine` (loads, warms up, starts)."""

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
        self._requests: dict[str, _Request] = {}
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
        self._grammar_waiting: dict[str, _Request] = {}  # deferred requests by id (loop thread)
        #: LoRA adapters (``config.lora_modules``); their slots are attached once the model is built
        self.lora: LoraManager | None = None
        if config.lora_modules:
            self.lora = LoraManager.from_modules(
                config.lora_modules, self.model_config, config.lora_slots(), config.lora_host_slots(),
                config.max_lora_rank, metrics=self.metrics, extra_delay_s=self.faults.lora_load_ms / 1000.0,
                stop=self._stop)
        self._lora_waiting: dict[str, _Request] = {}  # requests whose slot wait is under way (loop thread)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def tracing(self) -> bool:
        return self.sink.enabled

    def set_trace_sink(self, sink: TraceSink | None) -> None:
        """Swap the sink (benchmarks). Only between requests; affects requests submitted after."""
        self.sink = sink or NULL_SINK

    def _load_tokenizer(self) -> None:
        """Load the tokenizer (tens of ms); the ``load`` cold-start span starts here."""
        if self._load_t0_ns is None:
            self._load_t0_ns = time.time_ns()
        if self.tokenizer is None:
            if self.spec.is_preset():
                self.tokenizer = Tokenizer.bundled()
            else:
                self.tokenizer = Tokenizer.from_checkpoint(self.spec.model, self.model_config.eos_token_ids)

    def _grammar_vocab(self) -> TokenVocab:
        """The vocabulary as grammar masks read it (called once, on the first compile's thread)."""
        assert self.tokenizer is not None
        return TokenVocab.build(self.tokenizer.token_bytes(), self.model_config.vocab_size, self.tokenizer.eos_token_ids)

    def load(self) -> None:
        """Load tokenizer and weights (+ ``load_delay_s``), build the runner, warm up.

        Records ``cold_start`` spans (phase load / warmup). Call once, before :meth:`start`
        (with ``lazy_load`` the loop thread calls it). The ``load_delay_s`` wait ends early
        (EngineStoppedError) when the engine is shut down meanwhile.
        """
        cfg = self.config
        self._load_tokenizer()
        assert self._load_t0_ns is not None
        t0 = self._load_t0_ns
        if self.faults.load_delay_s > 0 and self._stop.wait(self.faults.load_delay_s):
            raise EngineStoppedError("shut down while loading the model")
        threads = cfg.num_threads
        if cfg.pd:  # two processes share the cores: half each unless told
            threads = threads or max(1, (os.cpu_count() or 1) // 2)
            self.pd = self._start_decode_link(threads)
        self.runner = make_runner(
            self.spec,
            CacheSpec(self.blocks.num_blocks, self.blocks.block_size),
            cfg.tp,
            threads,
            self.faults.collective_latency_ms,
            pp_size=cfg.pp,
            pp_microbatches=cfg.pp_microbatches,
        )
        if self.pd is not None:
            self.pd.connect()
        if self.lora is not None:
            model = self.runner.model
            model.lora = LoraSlots(self.model_config, cfg.lora_slots(), cfg.max_lora_rank, model.device,
                                   self.model_config.torch_dtype)
            self.lora.attach(model.lora)
        t1 = time.time_ns()
        self.cold_start_s["load"] = (t1 - t0) / 1e9
        if self.tracing:
            self.sink.record_cold_start(t0, t1, phase="load", attributes={stages.GEN_AI_REQUEST_MODEL: self.model_name})
        if cfg.warmup:
            self._warmup()
            t2 = time.time_ns()
            self.cold_start_s["warmup"] = (t2 - t1) / 1e9
            if self.tracing:
                self.sink.record_cold_start(t1, t2, phase="warmup", attributes={stages.GEN_AI_REQUEST_MODEL: self.model_name})
        m = self.metrics
        m.kv_bytes_per_token.set(self.model_config.kv_bytes_per_token())
        m.kv_total_blocks.set(self.blocks.num_blocks)
        m.kv_free_blocks.set(self.blocks.num_free_blocks)
        m.kv_block_size.set(self.blocks.block_size)
        m.tp_size.set(cfg.tp)
        if m.decode is not None:
            m.decode.kv_bytes_per_token.set(self.model_config.kv_bytes_per_token())
        if self.tracing:
            self.sink.set_meta(
                engine=ENGINE_NAME,
                engine_config=cfg.as_meta(),
                faults_injected=self.faults.active(),
                model=self.model_name,
                kv_bytes_per_token=self.model_config.kv_bytes_per_token(),
                cold_start_s=dict(self.cold_start_s),
            )
        self._ready.set()

    def _start_decode_link(self, threads: int) -> DecodeLink:
        """Spawn the decode worker (``--pd``); :meth:`DecodeLink.connect` once this side's model is built."""
        cfg = self.config
        assert self.tokenizer is not None
        settings = DecodeSettings(
            num_blocks=cfg.pd_decode_blocks(),
            block_size=cfg.block_size,
            max_running=cfg.pd_decode_max_running or cfg.max_running,
            max_context_tokens=self.max_context_tokens,
            eos_token_ids=frozenset(self.tokenizer.eos_token_ids),
            num_threads=threads,
        )
        f = self.faults
        return DecodeLink(self.spec, settings, self.metrics, self.sink, f.kv_transfer_latency_ms,
                          f.kv_transfer_ms_per_mb, f.detokenize_ms_per_token)

    def _warmup(self) -> None:
        """One prefill and one decode through the real path, then free the blocks."""
        assert self.runner is not None
        wid = "__warmup__"
        n = min(32, self.max_context_tokens - 1)
        bt = list(self.blocks.allocate(wid, n + 1))
        try:
            self.runner.execute([SeqInput(list(range(1, n + 1)), 0, bt)])
            self.runner.execute([SeqInput([1], n, bt)])
        finally:
            self.blocks.free(wid)

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
            return f"model failed to load: {_one_line(self.load_error)}"
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
        ``grammar``: the output must follow it (:func:`diag.engine.grammar.grammar_source`); its
        compile starts here unless the grammar cache holds it (``SubmitResult.grammar`` resolves
        once it is ready, or raises GrammarError). ``lora``: the name of one of ``--lora-modules`` to run
        with (None: the base model). Raises ValueError/RequestRejected (-> 400), QueueFullError (-> 503),
        EngineStoppedError (-> 503). Thread-safe.
        """
        if not self.running:
            raise EngineStoppedError(self.unavailable_reason())
        assert self.tokenizer is not None
        arrival_ns = arrival_ns or time.time_ns()
        rid = request_id or _new_request_id()
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
            req = _Request(
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

    def _attach_grammar(self, req: _Request, source: GrammarSource) -> None:
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

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._num_inbox_adds = 0
        for kind, payload in items:
            if kind == "add":
                req: _Request = payload
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
                msg = _one_line(exc) if exc is not None else "grammar compile cancelled (shutting down)"
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
                log.error("model failed to load: %s", _one_line(exc))
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
                req: _Request = payload
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
            log.error("LoRA adapter %r failed to load: %s", bad, _one_line(exc))
            for it in [it for it in plan.items if it.seq.lora == bad]:
                self._finish(self._requests[it.seq.seq_id], "error", t_plan, error="lora_load",
                             message=f"LoRA adapter {bad!r} failed to load: {_one_line(exc)}", error_status=500)
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

    def _handoff(self, r: _Request, tok: int, t_fwd: int, t_s0: int, t_s1: int) -> None:
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

    def _emit_token(self, r: _Request, tok: int, t_fwd: int, t_s0: int, t_s1: int, tracing: bool) -> None:
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
                if self.config.pp > 1:  # pipeline idle inside its prefill steps (diag.engine.pp)
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

    def _deliver(self, r: _Request, ev: TokenEvent) -> None:
        try:
            r.on_event(ev)
        except Exception:  # a consumer must never take the loop down
            log.exception("on_event callback failed for %s", r.seq.seq_id)

    def _finish(
        self,
        r: _Request,
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
