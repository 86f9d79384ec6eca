"""The ``network_delay_ms`` fault of the bundled engine's HTTP server: responses sent late, pipelined.

Server event loop only.
"""

from __future__ import annotations

import asyncio

from aiohttp import web


class DelayedWriter:
    """The ``network_delay_ms`` fault for one SSE response: a link with latency, not a slow one.

    :meth:`write` (server loop, never blocks) stamps each chunk's ready time; one writer task
    sends the headers and then each chunk at ``ready + delay_s`` (loop clock, s), in order.
    Chunks do not wait for each other's delay, so gaps between chunks stay as they were.
    A write error (client gone) is raised from the next :meth:`write` or :meth:`close`.
    """

    def __init__(self, resp: web.StreamResponse, request: web.Request, delay_s: float) -> None:
        self._resp = resp
        self._request = request
        self._delay_s = delay_s
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        self._prepare_due = self._loop.time() + delay_s  # the headers are ready now
        self._task = asyncio.ensure_future(self._run())

    def _check(self) -> None:
        if self._task.done() and not self._task.cancelled() and self._task.exception() is not None:
            raise self._task.exception()  # type: ignore[misc]

    def write(self, data: bytes) -> None:
        """Queue ``data`` for ``now + delay_s``."""
        self._check()
        self._queue.put_nowait((self._loop.time() + self._delay_s, data))

    async def close(self) -> None:
        """Queue the end of the stream and wait until everything is written (or raise)."""
        self._check()
        self._queue.put_nowait((self._loop.time() + self._delay_s, None))
        await asyncio.shield(self._task)

    def cancel(self) -> None:
        if not self._task.done():
            self._task.cancel()

    async def _sleep_until(self, due: float) -> None:
        wait = due - self._loop.time()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _run(self) -> None:
        await self._sleep_until(self._prepare_due)
        await self._resp.prepare(self._request)
        while True:
            due, data = await self._queue.get()
            await self._sleep_until(due)
            if data is None:
                await self._resp.write_eof()
                return
            await self._resp.write(data)
