"""The decode worker of disaggregated prefill/decode: a spawned process with its own model copy,
paged KV cache, admission queue and step loop.

It receives each request's KV (and first token) from the prefill side (:mod:`diag.bundled_engine.pd_wire`),
keeps it in host memory until it is admitted, admits requests first come first served when its
cache holds the prompt plus ``max_tokens`` (every block a request will need is taken at
admission, so a running request never waits for blocks) and fewer than ``max_running`` run,
copies the KV into the blocks it took, and then decodes every running request one token per
step. What it reports goes to the engine process over its pipe, as tuples:

* ``("received", request_id, unix_ns, kv_bytes)``: the request's KV has arrived;
* ``("first", request_id, unix_ns, finish_reason | None, state)``: admitted, its first token
  (sampled on the prefill side) goes out now; a reason when that token already ends it;
* ``("step", start_ns, end_ns, attributes, [(request_id, token, finish_reason | None), ...], state)``:
  one decode step and the token it gave each running request;
* ``("state", state)``: the queue changed without a step; ``state`` is
  ``(waiting, running, free_blocks, {wait reason: requests})``.

The engine process sends ``("abort", request_id)`` (a client left) and ``("stop", None)``.

Threads: the step loop on the process's main thread owns the queues, the block manager, the
model and the cache; a receiver thread blocks in ``recv`` on the process group; a control
thread reads the pipe. Both hand their items to the loop through a locked inbox. Sends on the
pipe are serialised by a lock (the receiver thread and the loop both send).
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any

import torch

from diag.ground import stages
from diag.bundled_engine.kv_cache import BlockManager, PagedKVCache, position_slots
from diag.bundled_engine.model import LlamaModel, ModelSpec, SeqInput
from diag.bundled_engine.pd_wire import KIND_PING, KIND_STOP, KVMeta, recv_kv, restore_generator
from diag.bundled_engine.sampler import SamplerState, sample, stop_reason
from diag.bundled_engine.scheduler_types import WAIT_KV_BLOCKS, WAIT_MAX_RUNNING
from diag.bundled_engine.tp import CacheSpec, connect_store, make_cache, make_process_group, rank_device

PREFILL_RANK = 0
DECODE_RANK = 1
_RECEIVER_JOIN_S = 5.0


@dataclass(frozen=True)
class DecodeSettings:
    """The decode worker's limits: its KV cache (blocks of ``block_size`` tokens), its running cap,
    the served context (tokens), the EOS ids, and its torch threads."""

    num_blocks: int
    block_size: int
    max_running: int
    max_context_tokens: int
    eos_token_ids: frozenset[int]
    num_threads: int


@dataclass
class _Seq:
    """One request on the decode side (loop thread only)."""

    meta: KVMeta
    kv: torch.Tensor | None  # host copy until admitted
    sampler: SamplerState
    output_ids: list[int] = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return self.meta.request_id

    @property
    def num_tokens(self) -> int:
        return self.meta.num_prompt_tokens + len(self.output_ids)

    @property
    def total_tokens(self) -> int:
        """Positions it may hold: prompt + max_tokens, at most the served context."""
        return self.meta.num_prompt_tokens + self.meta.params.max_tokens


class DecodeWorker:
    """The decode side's loop (see the module docstring)."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, settings: DecodeSettings, pg: Any, conn: Connection) -> None:
        self.model = model
        self.cache = cache
        self.cfg = settings
        self.pg = pg
        self.conn = conn
        self.blocks = BlockManager(settings.num_blocks, settings.block_size)
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.wait_reasons: dict[str, int] = {}
        self._aborted: set[str] = set()  # aborted before their KV arrived
        self._inbox: deque[tuple[str, Any]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._send_lock = threading.Lock()
        self._stop = False
        self._step_index = 0
        self._last_state: tuple[Any, ...] | None = None

    # -- threads that feed the loop ------------------------------------------------------------

    def _push(self, item: tuple[str, Any]) -> None:
        with self._lock:
            self._inbox.append(item)
        self._wake.set()

    def send(self, msg: tuple[Any, ...]) -> None:
        """Send a message to the engine process (any thread of this process)."""
        with self._send_lock:
            self.conn.send(msg)

    def _receive_main(self) -> None:
        device = self.model.device
        try:
            while True:
                kind, meta, kv = recv_kv(self.pg, PREFILL_RANK, device)
                if kind == KIND_STOP:
                    return
                if kind == KIND_PING or meta is None or kv is None:
                    continue
                now = time.time_ns()
                self.send(("received", meta.request_id, now, kv.numel() * kv.element_size()))
                self._push(("kv", (meta, kv)))
        except Exception:  # the link is gone (the engine process stopped or died)
            if not self._stop:
                traceback.print_exc()
            self._push(("stop", None))

    def _control_main(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self._push(("stop", None))
                return
            self._push(msg)
            if msg[0] == "stop":
                return

    # -- the loop (main thread) ----------------------------------------------------------------

    def warmup(self) -> None:
        """One prefill and one decode through the real path (first-call costs), then free the blocks."""
        n = min(32, self.cfg.max_context_tokens - 1, self.blocks.num_blocks * self.blocks.block_size - 1)
        if n < 1:
            return
        bt = list(self.blocks.allocate("__warmup__", n + 1))
        try:
            self.model.forward([SeqInput(list(range(1, n + 1)), 0, bt)], self.cache)
            self.model.forward([SeqInput([1], n, bt)], self.cache)
        finally:
            self.blocks.free("__warmup__")

    def run(self) -> None:
        """Serve until "stop" (or the pipe closes); then wait (5 s) for the receiver to take the
        stop header, so the process never exits with a thread inside the process group."""
        receiver = threading.Thread(target=self._receive_main, name="ttft-pd-recv", daemon=True)
        receiver.start()
        threading.Thread(target=self._control_main, name="ttft-pd-ctl", daemon=True).start()
        try:
            self._loop()
        finally:
            self._stop = True
            receiver.join(_RECEIVER_JOIN_S)
        if receiver.is_alive():  # no stop header came (the engine process is gone): leave at once
            os._exit(0)

    def _loop(self) -> None:
        while not self._stop:
            self._wake.clear()
            self._drain()
            if self._stop:
                break
            self._admit()
            if self.running:
                self._step()
                continue
            self._report_state()
            self._wake.wait(0.5)

    def _drain(self) -> None:
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
        for kind, payload in items:
            if kind == "kv":
                meta, kv = payload
                if meta.request_id in self._aborted:
                    self._aborted.discard(meta.request_id)
                    continue
                sampler = SamplerState.resume(meta.params, meta.default_seed, restore_generator(meta.generator_state))
                self.waiting.append(_Seq(meta, kv, sampler, [meta.first_token]))
            elif kind == "abort":
                self._abort(payload)
            elif kind == "stop":
                self._stop = True

    def _abort(self, rid: str) -> None:
        for q in (self.waiting, self.running):
            for s in q:
                if s.request_id == rid:
                    q.remove(s)
                    self.blocks.free(rid)
                    return
        self._aborted.add(rid)  # its KV has not arrived yet: drop it when it does

    def _state(self) -> tuple[int, int, int, dict[str, int]]:
        return len(self.waiting), len(self.running), self.blocks.num_free_blocks, dict(self.wait_reasons)

    def _report_state(self) -> None:
        state = self._state()
        if state != self._last_state:
            self._last_state = state
            self.send(("state", state))

    def _admit(self) -> None:
        """First come first served: the head waits (and those behind it) until blocks and a running
        place are free; its KV is copied into the blocks it takes."""
        cfg = self.cfg
        reason: str | None = None
        while self.waiting:
            s = self.waiting[0]
            if len(self.running) >= cfg.max_running:
                reason = WAIT_MAX_RUNNING
                break
            total = min(s.total_tokens, cfg.max_context_tokens)
            if not self.blocks.can_grow(s.request_id, total):
                reason = WAIT_KV_BLOCKS
                break
            self.waiting.popleft()
            table = self.blocks.allocate(s.request_id, total)
            assert s.kv is not None
            self.cache.import_slots(position_slots(table, s.meta.num_prompt_tokens, cfg.block_size), s.kv)
            s.kv = None
            now = time.time_ns()
            first = s.output_ids[0]
            why = stop_reason(first, 1, s.num_tokens, s.meta.params, cfg.eos_token_ids, cfg.max_context_tokens)
            if why is None:
                self.running.append(s)
            else:
                self.blocks.free(s.request_id)
            self.send(("first", s.request_id, now, why, self._state()))
        self.wait_reasons = {reason: len(self.waiting)} if reason and self.waiting else {}

    def _step(self) -> None:
        """One decode step over every running request: a token each; finished ones free their blocks."""
        cfg = self.cfg
        t0 = time.time_ns()
        batch = list(self.running)
        inputs = [SeqInput([s.output_ids[-1]], s.num_tokens - 1, list(self.blocks.block_table(s.request_id)))
                  for s in batch]
        logits = self.model.forward(inputs, self.cache)
        assert logits is not None
        tokens = sample(logits, [s.sampler for s in batch])
        out: list[tuple[str, int, str | None]] = []
        for s, tok in zip(batch, tokens):
            s.output_ids.append(tok)
            why = stop_reason(tok, len(s.output_ids), s.num_tokens, s.meta.params, cfg.eos_token_ids,
                              cfg.max_context_tokens)
            out.append((s.request_id, tok, why))
            if why is not None:
                self.running.remove(s)
                self.blocks.free(s.request_id)
        t1 = time.time_ns()
        attrs = {
            stages.ATTR_STEP_INDEX: self._step_index,
            stages.ATTR_STEP_PD_SIDE: stages.PD_SIDE_DECODE,
            stages.ATTR_STEP_PREFILL_TOKENS: 0,
            stages.ATTR_STEP_PREFILL_SEQS: 0,
            stages.ATTR_STEP_DECODE_SEQS: len(batch),
            stages.ATTR_STEP_KV_USAGE: self.blocks.usage_ratio(),
            stages.ATTR_STEP_COMM_S: 0.0,
            stages.ATTR_STEP_WAITING: len(self.waiting),
            stages.ATTR_STEP_RUNNING: len(self.running),
            stages.ATTR_STEP_PREEMPTED: 0,
            stages.ATTR_STEP_WAITING_KV: self.wait_reasons.get(WAIT_KV_BLOCKS, 0),
            stages.ATTR_STEP_WAITING_HOL: 0,
        }
        self._step_index += 1
        state = self._state()
        self._last_state = state
        self.send(("step", t0, t1, attrs, out, state))


def decode_worker_main(rank: int, world: int, store_port: int, spec: ModelSpec, settings: DecodeSettings,
                       conn: Connection) -> None:
    """Entry point of the decode worker (rank 1) in its own process. Ignores SIGINT (the engine
    process stops it with "stop", or it stops when its pipe closes)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        torch.set_num_threads(max(1, settings.num_threads))
        store = connect_store(store_port, world)
        rank_spec = replace(spec, device=rank_device(spec, rank))
        pg = make_process_group(store, rank, world, rank_spec.device)
        model = rank_spec.build()
        cache = make_cache(model, CacheSpec(settings.num_blocks, settings.block_size))
        worker = DecodeWorker(model, cache, settings, pg, conn)
        worker.warmup()
        conn.send(("ready", None))
    except Exception as exc:  # report start-up failures to the engine process in one line
        conn.send(("error", f"P/D decode worker failed to start: {exc}"))
        return
    try:
        worker.run()
    except Exception:
        traceback.print_exc()
        try:
            worker.send(("error", "P/D decode worker failed: see its traceback on stderr"))
        except (OSError, ValueError):
            pass
