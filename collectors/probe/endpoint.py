"""Where the probe sends: the OpenAI-compatible endpoint (:class:`Endpoint`), its discovery
(:func:`resolve_endpoint`), URL and header helpers, and the optional request elements a server
may refuse.

:func:`resolve_endpoint` is a coroutine with a session of its own; the rest are plain functions
and values, safe on any thread.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from collectors.probe.ready import NOT_SERVING_STATUSES, ReadyWait, not_serving_text

API_COMPLETIONS = "completions"
API_CHAT = "chat"
#: the path of each API under the base URL
API_PATHS = {API_COMPLETIONS: "/v1/completions", API_CHAT: "/v1/chat/completions"}


@dataclass
class Endpoint:
    """Where and how to send: ``url`` is the full POST URL."""

    base_url: str  # scheme://host:port (no /v1)
    api: str
    model: str | None
    detected: bool = False
    #: the first generation request the server answered (meta.json ``probe.first_contact``):
    #: ``{"request", "sent_ns" (Unix ns), "answer_s" (sent to last byte), "output_tokens"}``;
    #: a server still loading its model answers it late (cold start)
    first_contact: dict[str, Any] | None = None

    @property
    def url(self) -> str:
        return self.base_url + API_PATHS[self.api]


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The bearer-token header for ``api_key`` (none without one); the key is never recorded."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def split_url(url: str) -> tuple[str, str | None]:
    """``http://h:p[/v1[/chat]/completions]`` -> (base ``http://h:p[/prefix]``, api or None)."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"bad URL {url!r}: expected http(s)://HOST:PORT[/v1[/chat]/completions]")
    path = parts.path.rstrip("/")
    api: str | None = None
    for a, suffix in (("chat", "/v1/chat/completions"), ("completions", "/v1/completions")):
        if path.endswith(suffix):
            api, path = a, path[: -len(suffix)]
            break
    else:
        if path.endswith("/v1"):
            path = path[:-3]
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")), api


#: What the probe sends that a server may refuse, each with the probe flag that turns it off.
#: A server that validates ``X-Request-Id`` as a UUID, or rejects unknown body fields
#: (``min_tokens``/``ignore_eos`` are vLLM/SGLang extensions; ``stream_options`` is newer than
#: some servers), answers 4xx to every request; the compatibility check finds which one.
#: The compatibility check tries them in this order: ``traceparent`` last, because a retry
#: without it reaches a traced server as a request that joins no client trace (a server-only
#: failure in the capture), so it is sent only when dropping the others did not help.
OPTIONAL_ELEMENTS: dict[str, str] = {
    "x_request_id": "--no-request-id",
    "exact_output": "--no-exact-output",
    "stream_options": "--no-stream-options",
    "traceparent": "--no-traceparent",
}
#: How each optional element reads in a message to the user.
OPTIONAL_ELEMENT_TEXT: dict[str, str] = {
    "x_request_id": "the X-Request-Id header",
    "traceparent": "the W3C traceparent header",
    "exact_output": "min_tokens/ignore_eos in the body",
    "stream_options": "stream_options.include_usage in the body",
}


def request_id_header(trace_id_hex: str) -> str:
    """The ``X-Request-Id`` value: the request's trace id as a UUID (any server accepts a UUID,
    and the id then names the same request as its trace); a random UUID without a trace."""
    if len(trace_id_hex) == 32:
        try:
            return str(uuid.UUID(hex=trace_id_hex))
        except ValueError:
            pass
    return str(uuid.uuid4())


async def resolve_endpoint(
    url: str,
    api: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 10.0,
    ready: ReadyWait | None = None,
) -> tuple[Endpoint, list[str]]:
    """Find the API and model: URL path or ``api``; else try completions, then chat.

    Returns (endpoint, notes). The model comes from ``GET /v1/models`` when not given (the
    first listed). Detection requests are one-token and are not part of the results. With
    ``ready`` (the wait for a starting server), a detection answered 502/503/504 is sent again
    while that wait has time left.
    """
    base, api_from_url = split_url(url)
    notes: list[str] = []
    api = api or api_from_url
    headers = auth_headers(api_key)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        if model is None:
            try:
                async with session.get(base + "/v1/models") as r:
                    if r.status == 200:
                        doc = await r.json(content_type=None)
                        data = doc.get("data") if isinstance(doc, dict) else None
                        if data and isinstance(data[0], dict) and data[0].get("id"):
                            model = str(data[0]["id"])
                            notes.append(f"model {model!r} from GET /v1/models")
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                pass
            if model is None:
                notes.append("model unknown (GET /v1/models failed); requests carry no 'model' field")
        if api is not None:
            return Endpoint(base, api, model, detected=False), notes
        for candidate in (API_COMPLETIONS, API_CHAT):
            body: dict[str, Any] = {"max_tokens": 1, "stream": True}
            if model:
                body["model"] = model
            if candidate == API_CHAT:
                body["messages"] = [{"role": "user", "content": "hi"}]
            else:
                body["prompt"] = "hi"
            try:
                while True:
                    sent_ns = time.time_ns()
                    async with session.post(base + API_PATHS[candidate], json=body) as r:
                        raw = await r.read()
                    if r.status not in NOT_SERVING_STATUSES or ready is None or not await ready.again(
                            not_serving_text(r.status, raw, API_PATHS[candidate])):
                        break
                if r.status < 400:
                    notes.append(f"API detected: {candidate} ({API_PATHS[candidate]} answered {r.status})")
                    contact = {"request": "api_detection", "sent_ns": sent_ns,
                               "answer_s": (time.time_ns() - sent_ns) / 1e9, "output_tokens": 1}
                    return Endpoint(base, candidate, model, detected=True, first_contact=contact), notes
                notes.append(f"{API_PATHS[candidate]} answered {r.status}")
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                notes.append(f"{API_PATHS[candidate]}: {type(exc).__name__}")
                break  # the server is not reachable: do not try the other path
    notes.append("API not detected; using completions (pass --api to choose)")
    return Endpoint(base, API_COMPLETIONS, model, detected=False), notes
