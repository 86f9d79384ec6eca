"""The probe's event loop: uvloop when it is installed, the stdlib loop otherwise.

At 256 concurrent streams the client's cost per SSE chunk is mostly event-loop plumbing
(a wake-up, a transport read, a future resolved); uvloop does that in C. The probe's own
delay on TTFT is its budget (docs/design.md), so the faster loop is the default. Set
``TTFT_EVENT_LOOP=asyncio`` to force the stdlib loop (to compare the two, or to debug).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV_VAR = "TTFT_EVENT_LOOP"


def loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop :func:`run` will use."""
    if os.environ.get(ENV_VAR, "").strip().lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def being_cancelled() -> bool:
    """Whether the running task has a cancellation pending (Ctrl-C under ``asyncio.run`` cancels the
    main task): code that awaits a child it cancelled and swallows that child's CancelledError must
    re-raise when this is true, or the interrupt is lost. Loop thread only; False before 3.11."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if callable(cancelling) else False


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on the loop :func:`loop_name` names. Blocks the calling thread."""
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)
