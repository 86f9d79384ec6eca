"""The bundled server's front end: a bounded pool of HTTP request workers and the tokenizer threads.

A real serving stack does work before its engine sees a request, and that work has its own
limits: llama.cpp serves each connection on one of ``--threads-http`` threads (fewer threads
than slots stalls a load test at the thread count, ggml-org/llama.cpp#5827); SGLang's
TokenizerManager is one process unless tokenizer workers are added (sgl-project/sglang#6553);
vLLM's API server is one process per ``--api-server-count``. :class:`FrontEnd` reproduces both
limits in the bundled server:

- **HTTP workers** (``EngineConfig.http_workers``; ``None`` = unbounded, today's behaviour): a
  request holds a worker from its parsed body until its response ends (a stream holds it for
  the whole stream, as a blocking HTTP thread does). Requests beyond the pool wait for a worker;
  when ``http_backlog`` requests already wait, the next is refused at once (:class:`FrontEndFull`,
  HTTP 503): the shed connections of an overloaded front end.
- **Tokenizer threads** (``EngineConfig.tokenizer_workers``, default 1): ``Engine.submit``
  (tokenize, validate, enqueue) runs on one of them; requests beyond them wait for a thread.

Both waits come *before* the engine's queue: the engine's ``num_requests_waiting`` does not
count them. They are recorded on the request span (``stages.ATTR_FRONTEND_*``: inside server
TTFT, before the ``tokenize`` span; no stage span covers them) and in ``/metrics``
(``frontend_requests_waiting``, ``frontend_requests_active``, ``frontend_wait_seconds``).

The fault ``frontend_workers=N`` shrinks both pools to at most N (see :func:`effective_sizes`).

Threading: :meth:`FrontEnd.worker` and :meth:`FrontEnd.tokenize` are called on the server's
asyncio loop only; the callable given to :meth:`FrontEnd.tokenize` runs on a tokenizer thread.
Counters shared with those threads are guarded by a lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

from diag.bundled_engine.metrics import EngineMetrics

T = TypeVar("T")

DEFAULT_HTTP_BACKLOG = 256


class FrontEndFull(RuntimeError):
    """Every HTTP worker is busy and ``http_backlog`` requests already wait; maps to HTTP 503."""


@dataclass(frozen=True)
class FrontEndSizes:
    """The pools as they run. ``http_workers`` None = unbounded (no backlog either)."""

    http_workers: int | None
    http_backlog: int
    tokenizer_workers: int


def effective_sizes(http_workers: int | None, http_backlog: int, tokenizer_workers: int,
                    fault_workers: float = 0.0) -> FrontEndSizes:
    """The configured sizes, each shrunk to at most ``fault_workers`` when that fault is on (> 0)."""
    n = int(fault_workers)
    if n > 0:
        http_workers = n if http_workers is None else min(http_workers, n)
        tokenizer_workers = min(tokenizer_workers, n)
    return FrontEndSizes(http_workers, http_backlog, tokenizer_workers)


@dataclass
class FrontEndWait:
    """One request's time before the engine saw it (seconds)."""

    http_wait_s: float = 0.0  # parsed body -> an HTTP worker
    tokenizer_wait_s: float = 0.0  # an HTTP worker -> a tokenizer thread starts its submit

    @property
    def wait_s(self) -> float:
        return self.http_wait_s + self.tokenizer_wait_s


class FrontEnd:
    """The HTTP-worker semaphore and the tokenizer thread pool of one server (see the module doc)."""

    def __init__(self, sizes: FrontEndSizes, metrics: EngineMetrics) -> None:
        self.sizes = sizes
        self._metrics = metrics
        self._sem: asyncio.Semaphore | None = None  # made on the loop, at first use
        self._http_waiting = 0  # loop thread only
        self._lock = threading.Lock()
        self._tok_waiting = 0  # under _lock
        self._active = 0  # loop thread only
        self._pool = concurrent.futures.ThreadPoolExecutor(sizes.tokenizer_workers, thread_name_prefix="ttft-tokenize")
        metrics.frontend_http_workers.set(sizes.http_workers or 0)
        metrics.frontend_tokenizer_workers.set(sizes.tokenizer_workers)

    def _publish(self) -> None:
        with self._lock:
            waiting = self._http_waiting + self._tok_waiting
        self._metrics.frontend_waiting.set(waiting)
        self._metrics.frontend_active.set(self._active)

    @contextlib.asynccontextmanager
    async def worker(self, wait: FrontEndWait) -> AsyncIterator[None]:
        """Hold an HTTP worker for the body of the ``async with``; sets ``wait.http_wait_s``.

        Raises :class:`FrontEndFull` at once when the pool is busy and the backlog is full.
        A cancelled wait (client gone) gives nothing back and leaves no worker taken.
        """
        t0 = time.perf_counter()
        if self.sizes.http_workers is not None:
            if self._sem is None:
                self._sem = asyncio.Semaphore(self.sizes.http_workers)
            if self._sem.locked() and self._http_waiting >= self.sizes.http_backlog:
                self._metrics.rejected("frontend_full")
                raise FrontEndFull(f"front end overloaded: all {self.sizes.http_workers} HTTP workers busy and "
                                   f"{self._http_waiting} requests waiting for one (http_backlog)")
            self._http_waiting += 1
            self._publish()
            try:
                await self._sem.acquire()
            finally:
                self._http_waiting -= 1
                self._publish()  # also when the wait was cancelled (client gone)
        wait.http_wait_s = time.perf_counter() - t0
        self._active += 1
        self._publish()
        try:
            yield
        finally:
            self._active -= 1
            if self._sem is not None:
                self._sem.release()
            self._publish()

    def tokenize(self, fn: Callable[[], T], wait: FrontEndWait) -> "asyncio.Future[T]":
        """Run ``fn`` (the engine's submit) on a tokenizer thread; ``wait.tokenizer_wait_s`` is set
        on that thread just before ``fn`` starts, so ``fn`` may read it."""
        t0 = time.perf_counter()
        with self._lock:
            self._tok_waiting += 1
        self._publish()

        def run() -> T:
            wait.tokenizer_wait_s = time.perf_counter() - t0
            with self._lock:
                self._tok_waiting -= 1
            self._publish()
            self._metrics.frontend_wait.observe(wait.wait_s)
            return fn()

        return asyncio.get_running_loop().run_in_executor(self._pool, run)

    def shutdown(self) -> None:
        """Stop the tokenizer threads (queued submissions are cancelled)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
