"""The probe of a live session (``ttft watch``, ``ttft demo``) on its own thread and event loop.

:class:`ProbeThread` runs a :class:`collectors.probe.ProbeSession` in short load chunks, asking
its plan before every chunk what to send (:data:`PlanFn`); finished requests' spans are written
into the session's capture every ``flush_s`` seconds (so a failing server shows within a
refresh, not at the end of a chunk). A session that cannot open is retried every ``retry_s``
seconds until ``stop`` (a server that is down still opens: its requests fail as refused).
:func:`steady_plan` is ``ttft watch``'s plan: a constant low rate.

Threading: ``start``/``stop`` from the owner thread; the session runs on the probe's daemon
thread; ``check`` and the counters may be read from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collectors import probe as probe_client
from diag.ground.capture import CaptureWriter

#: what the probe should send now: (load, workload-or-None, segment); None = stop
PlanFn = Callable[[Any], "tuple[Any, Any, str | None] | None"]


@dataclass
class ProbePlan:
    """A steady low-rate probe: ``rate_rps`` requests/s in chunks of ``chunk_s`` seconds
    (spans are written after each chunk), prompts of ``input_tokens``, ``output_tokens`` out."""

    rate_rps: float = 0.5
    chunk_s: float = 5.0
    input_tokens: int = 64
    output_tokens: int = 16
    concurrency: int = 4
    segment: str = "watch"


class ProbeThread:
    """Runs a :class:`collectors.probe.ProbeSession` on its own event loop; ``plan(session)``
    is called before every chunk and returns (LoadSpec, Workload or None, segment) or None."""

    def __init__(self, url: str, writer: CaptureWriter, plan: PlanFn, input_tokens: int = 64,
                 output_tokens: int = 16, concurrency: int = 4, model: str | None = None,
                 timeout_s: float = 60.0, flush_s: float = 1.0, retry_s: float = 1.0) -> None:
        self.url = url
        self.writer = writer
        self.plan = plan
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.concurrency = concurrency
        self.model = model
        self.timeout_s = float(timeout_s)
        self.flush_s = float(flush_s)
        self.retry_s = float(retry_s)
        self.error = ""
        #: why the session could not open last time ("" once it is open); shown while retrying
        self.open_error = ""
        self.opens = 0
        self.finished = False  # the plan ended the probe (not an error)
        self.chunks = 0
        self.requests = 0
        self.errors = 0
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, name="ttft-live-probe", daemon=True)
        self.started = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._task = loop.create_task(self._run())
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # shown on screen by the monitor
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _run(self) -> None:
        session = await self._open()
        if session is None:  # stopped before the session opened
            return
        flusher = asyncio.get_running_loop().create_task(self._flush_loop(session))
        try:
            while not self._stop.is_set():
                step = self.plan(session)
                if step is None:
                    self.finished = True
                    break
                load, workload, segment = step
                outcome = await session.phase(load, workload, segment)
                self.chunks += 1
                res = list(getattr(outcome, "results", []) or [])
                self.requests += len(res)
                self.errors += sum(1 for r in res if getattr(r, "error", None))
        finally:  # an error here (a plan's bug) stops the probe and is shown by check()
            flusher.cancel()
            await session.close()

    async def _open(self) -> Any:
        """Open the probe session, retrying every ``retry_s`` while it cannot (None once stopped).
        A server that is down still opens (its requests fail, one by one, as refused)."""
        pc = probe_client
        cfg = pc.ProbeConfig(self.url, model=self.model, load=pc.LoadSpec(concurrency=self.concurrency, requests=1),
                             workload=pc.WorkloadSpec(pc.LengthSpec("fixed", self.input_tokens),
                                                      pc.LengthSpec("fixed", self.output_tokens)),
                             timeout_s=self.timeout_s)
        while not self._stop.is_set():
            session = pc.ProbeSession(cfg, self.writer, pool_size=64)
            try:
                await session.__aenter__()
            except Exception as exc:  # say why on screen, and retry
                self.open_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                with contextlib.suppress(Exception):
                    await session.close()
                await asyncio.sleep(self.retry_s)
                continue
            self.opens += 1
            self.open_error = ""
            self.started.set()
            return session
        return None

    async def _flush_loop(self, session: Any) -> None:
        """Write finished requests' spans every ``flush_s`` (on the probe's loop, between requests)."""
        while True:
            await asyncio.sleep(self.flush_s)
            session.flush_spans()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after cancelling the chunk in flight (its spans are flushed on close)."""
        self._stop.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not task.done():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass
        self._thread.join(timeout_s)

    def check(self) -> str | None:
        """None while probing; a reason once the probe thread ended with an error."""
        if self.error:
            return f"probe stopped: {self.error}"
        if self.open_error and not self._stop.is_set():
            return f"probe cannot reach {self.url} (retrying every {self.retry_s:g} s): {self.open_error}"
        if self.started.is_set() and not self.alive() and not self._stop.is_set() and not self.finished:
            return "probe stopped"
        return None


def steady_plan(p: ProbePlan) -> PlanFn:
    """A plan that probes at a constant low rate forever (``ttft watch``)."""

    def plan(session: Any) -> tuple[Any, Any, str | None]:
        return probe_client.LoadSpec(concurrency=p.concurrency, rate_rps=p.rate_rps, duration_s=p.chunk_s), None, p.segment

    return plan
