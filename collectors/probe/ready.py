"""Waiting, bounded, for a server that is still starting, before the probe's first request.

What the servers we observe do while they load, from their source:

- vLLM binds its port before it builds the engine and listens only once uvicorn serves
  (``vllm/entrypoints/openai/api_server.py`` @0001948bc76939369ca855c90b36d81256477e85:
  ``setup_server`` binds, ``run_server_worker`` builds the engine, then ``build_and_serve``):
  connections are **refused** for the whole load.
- llama.cpp's server answers every path, ``/v1/models`` included, **HTTP 503**
  ``{"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}`` until
  the model is loaded (``tools/server/server-http.cpp`` @00dd0816129a5210351c78bb90e0828f8eb69f99,
  ``middleware_server_state``; older builds let ``/v1/models`` through and 503 the rest).
- ``transformers serve`` and the bundled engine's ``--lazy-load`` accept requests at once and
  **hold** them until the model is loaded: nothing to wait for here; the probe's first request
  answers late, and that is a cold start (meta.json ``probe.first_contact``).

So "not serving yet" is: the connection refused or reset, or an HTTP 502/503/504 (a proxy in
front of a starting server answers 502/504). Anything else — 200, 401, 404 — is a server that
serves. The wait polls ``GET /v1/models`` (cheap on every stack) every ``poll_s`` until the
deadline; a poll the server holds open counts as serving once it answers. What was seen is
kept for meta.json ``probe.ready`` and reported apart as start-up, never as TTFT.

Threading: coroutines for the caller's event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

#: statuses of a server (or the proxy in front of it) that is not serving yet
NOT_SERVING_STATUSES = frozenset({502, 503, 504})
#: seconds between polls of a server that is not serving yet
POLL_S = 0.5


@dataclass
class ReadyWait:
    """How long the server was not serving at first contact (Unix ns, seconds)."""

    since_ns: int
    wait_s: float
    #: time.monotonic() of the first poll (the deadline is ``wait_s`` after it)
    t0_mono: float = field(default_factory=time.monotonic)
    #: seconds from the first poll until the server served (or the wait gave up)
    waited_s: float = 0.0
    ready: bool = False
    polls: int = 0
    #: what the polls saw before the server served, in order, each once ("connection refused", "HTTP 503: Loading model")
    seen: list[str] = field(default_factory=list)

    def saw(self, what: str) -> None:
        if what not in self.seen:
            self.seen.append(what)

    @property
    def left_s(self) -> float:
        """Seconds left of the wait (<= 0 once it is over)."""
        return self.t0_mono + self.wait_s - time.monotonic()

    async def again(self, what: str, poll_s: float = POLL_S) -> bool:
        """The server was seen not serving (``what``: a poll, or a request after the polls, e.g.
        llama.cpp builds that answer /v1/models but 503 generation while loading): noted, then
        True after a pause when the wait has time left (try again), False when it has not."""
        self.saw(what)
        left = self.left_s
        if left <= 0:
            return False
        await asyncio.sleep(min(poll_s, left))
        self.waited_s = time.monotonic() - self.t0_mono
        return True

    @property
    def not_serving_s(self) -> float:
        """Seconds the server was seen not serving (0 when it served at the first poll)."""
        return self.waited_s if self.seen else 0.0

    def to_meta(self) -> dict[str, Any]:
        """meta.json ``probe.ready``."""
        return {"since_ns": self.since_ns, "wait_s": self.wait_s, "waited_s": round(self.waited_s, 6),
                "not_serving_s": round(self.not_serving_s, 6), "ready": self.ready, "polls": self.polls,
                "seen": list(self.seen)}

    def line(self) -> str:
        """One line for the user: what the server did and for how long."""
        what = ", then ".join(self.seen)
        if not self.seen:
            return "the server served at first contact"
        if self.ready:
            return f"the server was not serving for {self.waited_s:.1f} s at first contact ({what}); start-up, reported apart"
        return f"the server was still not serving after {self.waited_s:.1f} s ({what}; --wait-ready {self.wait_s:g})"


async def _poll(session: aiohttp.ClientSession, url: str, timeout_s: float) -> str | None:
    """None when the server serves; else what it did instead."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=max(0.05, timeout_s))) as r:
            if r.status not in NOT_SERVING_STATUSES:
                return None
            return not_serving_text(r.status, await r.content.read(512))
    except aiohttp.ClientConnectorError as exc:
        os_err = getattr(exc, "os_error", None)
        return "connection refused" if isinstance(os_err, ConnectionRefusedError) else "cannot connect"
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError):
        return "connection closed"
    except asyncio.TimeoutError:
        return "no answer"
    except aiohttp.ClientError as exc:
        return type(exc).__name__


def not_serving_text(status: int, body: bytes, where: str = "") -> str:
    """How a not-serving answer reads in ``ReadyWait.seen``: "HTTP 503 [to PATH]: Loading model"."""
    why = loading_message(body[:512].decode("utf-8", "replace"))
    return f"HTTP {status}" + (f" to {where}" if where else "") + (f": {why}" if why else "")


def loading_message(body: str) -> str:
    """The server's own word for why it does not serve (llama.cpp's "Loading model"), or ''."""
    try:
        doc = json.loads(body)
    except ValueError:
        return ""
    if isinstance(doc, dict):
        err = doc.get("error")
        msg = err.get("message") if isinstance(err, dict) else (err if isinstance(err, str) else doc.get("status"))
        if isinstance(msg, str):
            return msg[:80]
    return ""


async def wait_until_serving(base_url: str, wait_s: float, headers: dict[str, str] | None = None,
                             say: Callable[[str], None] | None = None, poll_s: float = POLL_S) -> ReadyWait:
    """Poll ``base_url/v1/models`` until the server serves or ``wait_s`` has passed.

    ``say`` gets one line when the first poll finds the server not serving (what it saw, how
    long the wait may last). With ``wait_s`` <= 0 it polls once and does not wait.
    """
    res = ReadyWait(since_ns=time.time_ns(), wait_s=max(0.0, wait_s))
    async with aiohttp.ClientSession(headers=headers or {}) as session:
        while True:
            res.polls += 1
            seen = await _poll(session, base_url + "/v1/models", max(poll_s, res.left_s))
            res.waited_s = time.monotonic() - res.t0_mono
            if seen is None:
                res.ready = True
                return res
            if not res.seen and say is not None and res.wait_s > 0:
                say(f"the server is not serving yet ({seen}); waiting up to {res.wait_s:g} s for it "
                    "(--wait-ready 0 does not wait)")
            if not await res.again(seen, poll_s):
                return res


__all__ = ["NOT_SERVING_STATUSES", "POLL_S", "ReadyWait", "loading_message", "not_serving_text", "wait_until_serving"]
