"""Which requests a probe worker has in flight, and what the driver writes for a worker it lost.

Worker side: :class:`InFlightTracker` wraps one :class:`~.client.StreamingClient` (its
``request`` coroutine and its span sink, no change to the client itself): a request is in flight
from the call until its result is back, and each finished result waits in a queue until
:meth:`InFlightTracker.take` hands it on with a snapshot of what is still in flight.

Driver side: a request the driver knew in flight and never got a result for is recorded as
failed with the error kind :data:`WORKER_LOST` (:func:`lost_result`), never dropped; and the
client spans of a lost worker's requests (its spans never came back) are written by the driver
from their results (:func:`stand_in_span_lines`), in the request's own trace.

Threading: the tracker's wrapper runs on the worker's event loop; :meth:`InFlightTracker.take`
may run on any other thread (a deque and a dict copy: atomic under the GIL).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collectors.probe.client import StreamingClient
from collectors.probe.results import ATTR_CLIENT_API, RequestResult, record_result_on_span
from diag.ground import stages

#: the error kind of a request whose worker was lost while it was in flight
WORKER_LOST = "worker_lost"


@dataclass(frozen=True, slots=True)
class InFlight:
    """A request sent and not yet answered, as the driver keeps it: Unix ns on the driver's clock
    (the worker applies its offset), its trace and client span ids (hex; "" without tracing)."""

    request_id: str
    segment: str | None
    warmup: bool
    scheduled_ns: int
    start_ns: int
    trace_id: str = ""
    span_id: str = ""


class _Entry:
    __slots__ = ("request_id", "segment", "warmup", "scheduled_ns", "start_ns", "trace")

    def __init__(self, request_id: str, segment: str | None, warmup: bool, scheduled_ns: int, start_ns: int) -> None:
        self.request_id = request_id
        self.segment = segment
        self.warmup = warmup
        self.scheduled_ns = scheduled_ns
        self.start_ns = start_ns
        self.trace: Any = None

    def ids(self) -> tuple[str, str]:
        ctx = self.trace.root_context() if self.trace is not None else None
        return ("", "") if ctx is None else (format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"))

    def snapshot(self) -> InFlight:
        return InFlight(self.request_id, self.segment, self.warmup, self.scheduled_ns, self.start_ns, *self.ids())


class _TrackingSink:
    """The client's span sink, noting each request's trace on its in-flight entry."""

    def __init__(self, sink: Any, inflight: dict[str, _Entry]) -> None:
        self._sink = sink
        self._inflight = inflight

    @property
    def enabled(self) -> bool:
        return bool(self._sink.enabled)

    def start_request(self, request_id: str, *args: Any, **kwargs: Any) -> Any:
        trace = self._sink.start_request(request_id, *args, **kwargs)
        entry = self._inflight.get(request_id)
        if entry is not None:
            entry.trace = trace
        return trace

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


class InFlightTracker:
    """What one worker's client has in flight and has finished since the last :meth:`take`."""

    def __init__(self) -> None:
        self._inflight: dict[str, _Entry] = {}
        #: (result, client span id hex) of finished requests not yet taken
        self._done: deque[tuple[RequestResult, str]] = deque()
        #: requests whose call ended without a result (cancelled, the loop torn down)
        self._aborted: list[_Entry] = []

    def install(self, client: StreamingClient) -> None:
        """Wrap ``client.request`` and its sink (call before the client sends anything)."""
        inner = client.request
        inflight, done, aborted = self._inflight, self._done, self._aborted

        async def request(item: Any, request_id: str, *args: Any, **kwargs: Any) -> RequestResult:
            segment = args[0] if args else kwargs.get("segment")
            warmup = bool(args[1] if len(args) > 1 else kwargs.get("warmup", False))
            sched = kwargs.get("scheduled_perf_ns")
            sched = args[2] if len(args) > 2 else sched
            now = client.unix_ns(time.perf_counter_ns())
            entry = _Entry(request_id, segment, warmup, client.unix_ns(sched) if sched is not None else now, now)
            inflight[request_id] = entry
            try:
                res = await inner(item, request_id, *args, **kwargs)
            except BaseException:
                aborted.append(entry)
                inflight.pop(request_id, None)
                raise
            done.append((res, entry.ids()[1]))
            inflight.pop(request_id, None)
            return res

        client.request = request  # type: ignore[method-assign]
        if client.sink is not None:
            client.sink = _TrackingSink(client.sink, inflight)  # type: ignore[assignment]

    def take(self) -> tuple[list[tuple[RequestResult, str]], list[InFlight]]:
        """Finished (result, span id) pairs since the last call, and a snapshot of the requests in
        flight (taken first: a request finishing meanwhile is in both, never in neither)."""
        entries = list(self._inflight.copy().values()) + list(self._aborted)
        snapshot = [e.snapshot() for e in entries]
        out = []
        while True:
            try:
                out.append(self._done.popleft())
            except IndexError:
                break
        return out, snapshot


def lost_result(entry: InFlight, detail: str) -> RequestResult:
    """The record of a request in flight on a worker that was lost: failed as :data:`WORKER_LOST`,
    at its own send time, ``detail`` saying which worker and why."""
    return RequestResult(request_id=entry.request_id, segment=entry.segment, warmup=entry.warmup,
                         scheduled_ns=entry.scheduled_ns or entry.start_ns, start_ns=entry.start_ns,
                         error=WORKER_LOST, error_detail=detail, trace_id=entry.trace_id)


def stand_in_span_lines(results: Sequence[tuple[RequestResult, str]], api: str, model: str | None) -> list[str]:
    """OTLP JSON lines of the client spans for ``(result, its lost client span id)`` pairs whose
    worker's spans never came back, built from the results as the worker would have (a
    :data:`WORKER_LOST` one ends now). Each joins its request's trace (``traceparent`` naming the
    lost span as its parent, so the server's side of the request still joins); no prompt text."""
    if not results:
        return []
    from collectors.probe.load import PROBE_PROVIDER
    from collectors.probe.spans_io import drain_span_lines
    from collectors.spans import setup_tracing

    sink = setup_tracing(service_name="ttft-probe", memory=True, provider_name=PROBE_PROVIDER)
    try:
        for res, span_id in results:
            attrs: dict[str, Any] = {ATTR_CLIENT_API: api}
            if res.segment is not None:
                attrs[stages.ATTR_SEGMENT] = res.segment
            if res.warmup:
                attrs[stages.ATTR_WARMUP] = True
            tp = None
            if len(res.trace_id) == 32:
                tp = f"00-{res.trace_id}-{span_id or format(random.getrandbits(64) | 1, '016x')}-01"
            span = sink.start_request(res.request_id, model=model, attributes=attrs, traceparent=tp,
                                      start_ns=res.start_ns, side="client")
            record_result_on_span(span, res)
        return drain_span_lines(sink)
    finally:
        sink.shutdown()


__all__ = ["WORKER_LOST", "InFlight", "InFlightTracker", "lost_result", "stand_in_span_lines"]
