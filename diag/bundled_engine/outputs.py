"""What an engine gives back: :class:`SubmitResult` when a request is queued, then
:class:`TokenEvent` s on the request's callback, **called on the engine's loop thread** (quick,
never blocking); :class:`AsyncEventStream` and :class:`SyncEventStream` carry them to a consumer's
event loop or thread. The errors :meth:`Engine.submit` raises are here too."""

from __future__ import annotations

import asyncio
import queue
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_waiting``; maps to HTTP 503."""


class EngineStoppedError(RuntimeError):
    """The engine is not running (not started, shut down, or its loop died)."""


@dataclass(frozen=True)
class TokenEvent:
    """One output event: a token's text delta, or the end of the request.

    ``finish_reason`` is ``"stop"``, ``"length"``, ``"abort"`` or ``"error"`` on the last event;
    ``error_status`` the HTTP status an error maps to (400: the request's grammar failed to
    compile; None: the server's default).
    """

    request_id: str
    text: str
    token_id: int | None
    num_prompt_tokens: int
    num_output_tokens: int
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    error_status: int | None = None


EventCallback = Callable[[TokenEvent], None]


class AsyncEventStream:
    """Bridges loop-thread events into an asyncio queue of the loop it was created on.

    Create it on the event loop that will consume it; pass :meth:`push` as ``on_event``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

    def push(self, event: TokenEvent) -> None:
        """Called on the engine loop thread; never blocks."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the consumer's loop is closed: nobody listens any more
            pass

    async def get(self) -> TokenEvent:
        return await self._queue.get()

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        while True:
            ev = await self._queue.get()
            yield ev
            if ev.finished:
                return


class SyncEventStream:
    """A thread-safe blocking stream of events (tests, benchmarks, scripts)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[TokenEvent] = queue.Queue()

    def push(self, event: TokenEvent) -> None:
        self._queue.put_nowait(event)

    def get(self, timeout_s: float | None = None) -> TokenEvent:
        return self._queue.get(timeout=timeout_s)

    def __iter__(self) -> Iterator[TokenEvent]:
        while True:
            ev = self._queue.get()
            yield ev
            if ev.finished:
                return


@dataclass(frozen=True)
class SubmitResult:
    """What :meth:`Engine.submit` returns once the request is queued; ``grammar`` resolves to the
    compiled grammar once it is ready (raises GrammarError if its compile failed; None: no
    response_format)."""

    request_id: str
    num_prompt_tokens: int
    trace_id: str
    grammar: "Future[Any] | None" = None
