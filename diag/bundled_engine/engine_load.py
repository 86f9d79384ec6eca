"""The bundled engine's model load: tokenizer, weights, the TP/PP runner, the decode worker, warm-up.

:class:`EngineLoad` is a base of :class:`~diag.bundled_engine.engine.Engine`. :meth:`EngineLoad.load` runs
on the thread that calls :meth:`Engine.start` (on the step-loop thread with ``lazy_load``) and
records the ``cold_start`` spans (phase load / warmup; Unix ns) and ``cold_start_s`` (seconds).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from collectors.spans import TraceSink
from diag.ground import stages
from diag.bundled_engine.config import EngineConfig
from diag.bundled_engine.faults import FaultConfig
from diag.bundled_engine.grammar import TokenVocab
from diag.bundled_engine.kv_cache import BlockManager
from diag.bundled_engine.lora_manager import LoraManager
from diag.bundled_engine.lora_slots import LoraSlots
from diag.bundled_engine.metrics import EngineMetrics
from diag.bundled_engine.model import SeqInput
from diag.bundled_engine.model_config import ModelConfig
from diag.bundled_engine.outputs import EngineStoppedError
from diag.bundled_engine.pd import DecodeLink
from diag.bundled_engine.pd_worker import DecodeSettings
from diag.bundled_engine.request import ENGINE_NAME
from diag.bundled_engine.tokenizer import Tokenizer
from diag.bundled_engine.tp import CacheSpec, ModelRunner, make_runner


class EngineLoad:
    """Loading and warming up the engine's model (once, before the loop steps)."""

    # the engine's state, set by Engine.__init__ (diag.bundled_engine.engine)
    tracing: bool
    config: EngineConfig
    faults: FaultConfig
    spec: Any
    model_config: ModelConfig
    model_name: str
    metrics: EngineMetrics
    sink: TraceSink
    blocks: BlockManager
    runner: ModelRunner | None
    tokenizer: Tokenizer | None
    pd: DecodeLink | None
    lora: LoraManager | None
    max_context_tokens: int
    cold_start_s: dict[str, float]
    _load_t0_ns: int | None
    _stop: threading.Event
    _ready: threading.Event

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
