"""The engine's grammar cache and compile pool: what vLLM's ``StructuredOutputManager`` and
xgrammar's compiler cache do for a request with a ``response_format``.

:meth:`GrammarCache.get` gives a request its :class:`GrammarTicket` at once:

- a **hit**: the compiled grammar is in the cache (an LRU of ``capacity`` grammars by key);
- a **join**: a compile of the same key is in flight; the request shares its result (not a hit);
- a **miss**: a compile is queued on the pool of ``workers`` threads.

``capacity=0`` keeps nothing and joins nothing: every request compiles its own grammar. A failed
compile is not kept; every request that shared it gets the error. Counted in the engine's metrics
(per request: ``grammar_cache_hits`` / ``grammar_cache_misses``; per compile:
``grammar_compile_time_seconds``, the ``grammar_compile_ms`` fault's delay included).

Threading: :meth:`get` may be called from any thread (``Engine.submit`` runs on tokenizer
threads); compiles run on the pool's threads (``ttft-grammar-*``); one lock guards the cache and
the table of compiles in flight. A compile stores its grammar before its future resolves, so a
request that arrives as it finishes is a hit.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from diag.bundled_engine.grammar import CompiledGrammar, TokenVocab, compile_grammar
from diag.bundled_engine.grammar_schema import GrammarSource
from diag.bundled_engine.metrics import EngineMetrics
from diag.bundled_engine.outputs import EngineStoppedError


@dataclass(frozen=True)
class GrammarTicket:
    """One request's grammar: its key, a future of the compiled grammar (done on a hit; raises
    GrammarError when the compile failed) and whether the cache held it."""

    key: str
    future: "Future[CompiledGrammar]"
    cache_hit: bool


class GrammarCache:
    """An LRU of compiled grammars by key, fed by a pool of compile threads (see the module doc)."""

    def __init__(self, capacity: int, workers: int, vocab: Callable[[], TokenVocab],
                 metrics: EngineMetrics | None = None, extra_delay_s: float = 0.0) -> None:
        """``vocab`` makes the vocabulary's token table (called once, on the first compile);
        ``extra_delay_s`` is added to every compile (the ``grammar_compile_ms`` fault)."""
        if capacity < 0 or workers < 1:
            raise ValueError(f"grammar cache size must be >= 0 and grammar workers >= 1, got {capacity} and {workers}")
        self.capacity = capacity
        self.workers = workers
        self._vocab_fn = vocab
        self._vocab: TokenVocab | None = None
        self._metrics = metrics
        self._extra_delay_s = extra_delay_s
        self._closed = False
        self._stopping = threading.Event()  # set by shutdown: ends the fault's delay at once
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._inflight: dict[str, Future[CompiledGrammar]] = {}
        self._pool: ThreadPoolExecutor | None = None  # made at the first miss
        self.num_compiles = 0  # compiles started (under _lock)

    def get(self, source: GrammarSource) -> GrammarTicket:
        """The ticket for ``source``: a hit, a join of a compile in flight, or a new compile."""
        with self._lock:
            compiled = self._cache.get(source.key)
            if compiled is not None:
                self._cache.move_to_end(source.key)
                self._count(hit=True)
                done: Future[CompiledGrammar] = Future()
                done.set_result(compiled)
                return GrammarTicket(source.key, done, True)
            if self._closed:
                raise EngineStoppedError("the grammar cache is shut down")
            self._count(hit=False)
            if self.capacity > 0:
                fut = self._inflight.get(source.key)
                if fut is not None:
                    return GrammarTicket(source.key, fut, False)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ttft-grammar")
            self.num_compiles += 1
            fut = self._pool.submit(self._compile, source)
            if self.capacity > 0:
                self._inflight[source.key] = fut
            return GrammarTicket(source.key, fut, False)

    def _count(self, hit: bool) -> None:
        if self._metrics is not None:
            (self._metrics.grammar_cache_hits if hit else self._metrics.grammar_cache_misses).inc()

    def vocab(self) -> TokenVocab:
        """The vocabulary's token table (made once)."""
        with self._lock:
            if self._vocab is None:
                self._vocab = self._vocab_fn()
            return self._vocab

    def _compile(self, source: GrammarSource) -> CompiledGrammar:
        """Compile on a pool thread; keep the result (LRU) before the future resolves."""
        t0 = time.perf_counter()
        try:
            if self._extra_delay_s > 0 and self._stopping.wait(self._extra_delay_s):
                raise EngineStoppedError("the engine shut down while a grammar compiled")
            compiled = compile_grammar(source, self.vocab())
        except BaseException:
            with self._lock:
                self._inflight.pop(source.key, None)
            raise
        if self._metrics is not None:
            self._metrics.grammar_compile_time.observe(time.perf_counter() - t0)
        with self._lock:
            self._inflight.pop(source.key, None)
            if self.capacity > 0:
                self._cache[source.key] = compiled
                self._cache.move_to_end(source.key)
                while len(self._cache) > self.capacity:
                    self._cache.popitem(last=False)
        return compiled

    def keys(self) -> list[str]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._cache)

    def shutdown(self) -> None:
        """Stop the compile threads; queued compiles are cancelled (their futures say so) and a
        compile in its injected delay ends at once."""
        self._stopping.set()
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
