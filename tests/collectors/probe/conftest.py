"""A real local aiohttp SSE server with known behaviours, for the probe tests.

The server runs on its own event loop in a background thread (so tests can call the
blocking ``run_probe``). Behaviour is chosen by a path prefix: ``{base}/{mode}/v1/...``.
Modes: ok, slow, http400, http503, malformed, empty, midclose, hang, json, nousage, short,
crlf, flaky (every 3rd request 503), cap2 (503 when more than 2 are in flight), and servers that
refuse one optional element as real ones do: uuid-rid (400, empty body, unless X-Request-Id is
a UUID), no-tp (400 on a traceparent header), strict (422 on min_tokens/ignore_eos, as
``transformers serve``), no-so (400 on stream_options), strict-all (all four at once); and servers
that load their model until ``FakeServer.loading_until`` (time.monotonic()) as llama.cpp's does:
loading (503 "Loading model" on every path, /v1/models too), loading-gen (older builds: /v1/models
answers, generation 503s); words2x (two tokens a word in usage), words2x-512 (and a 512-token context);
ctx-N (one token a word, a prefill that grows with the prompt, and an N-token context: longer
prompts get vLLM's 400 "maximum context length"); idleclose (a server that closes keep-alive
connections idle for ``FakeServer.idle_close_s``), dropall (closes every connection it is sent a
request on, without an answer).

idleclose makes the keep-alive race deterministic: a real server (uvicorn, cpp-httplib) closes an
idle connection when its timer fires, and a client that sends on it in the same instant has its
request cross the server's FIN on the wire: the connection ends with no answer. Here the server
decides a connection's fate when the next request arrives on it: idle for ``idle_close_s`` or
more, it is closed unanswered (logged in ``idle_closed_ns``), exactly what that client sees.
Every request is logged (headers, arrival time, first content send time).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from support.probe_timings import CTX_BASE_S, CTX_S_PER_TOKEN, FIRST_CONTENT_DELAY_S, SLOW_S  # noqa: E402


@dataclass
class Seen:
    mode: str
    headers: dict[str, str]
    body: dict[str, Any]
    recv_ns: int
    first_content_sent_ns: int | None = None


@dataclass
class FakeServer:
    base: str
    port: int
    log: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    counter: int = 0
    #: bumped by reset(): a request counts in ``in_flight`` only within the test it arrived in
    generation: int = 0
    #: time.monotonic() until which the loading modes answer 503 "Loading model"
    loading_until: float = 0.0
    #: idleclose: seconds of idleness after which a keep-alive connection is closed on its next request
    idle_close_s: float = 1.0
    #: idleclose: when each connection (its transport) last finished an answer (time.monotonic())
    conn_done: dict[Any, float] = field(default_factory=dict)
    #: idleclose/dropall: when a connection was closed unanswered (time.time_ns())
    idle_closed_ns: list[int] = field(default_factory=list)

    def loading(self, mode: str) -> bool:
        return mode in ("loading", "loading-gen") and time.monotonic() < self.loading_until

    def url(self, mode: str) -> str:
        return f"{self.base}/{mode}"

    def reset(self) -> None:
        """Start a test afresh; requests of earlier tests still running (hang mode) no longer count."""
        self.log.clear()
        self.in_flight = self.max_in_flight = self.counter = 0
        self.generation += 1
        self.loading_until = 0.0
        self.idle_close_s = 1.0
        self.conn_done.clear()
        self.idle_closed_ns.clear()

    def closes_unanswered(self, mode: str, transport: Any) -> bool:
        """idleclose: the connection was idle for ``idle_close_s`` or more; dropall: always."""
        last = self.conn_done.get(transport)
        return mode == "dropall" or (mode == "idleclose" and last is not None
                                     and time.monotonic() - last >= self.idle_close_s)


def context_of(mode: str) -> tuple[int, int | None]:
    """(usage tokens per prompt word, context limit in tokens or None) of a mode."""
    if mode.startswith("ctx-"):
        return 1, int(mode[4:])
    if mode.startswith("words2x"):
        return 2, 512 if mode == "words2x-512" else None
    return 0, None


def _chunk(chat: bool, text: str | None, role: bool = False, finish: str | None = None) -> bytes:
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        obj = {"id": "x", "object": "chat.completion.chunk", "choices": [choice]}
    else:
        obj = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "" if role else text,
                                                                     "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    obj = {"id": "x", "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                               "total_tokens": prompt_tokens + completion_tokens}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def loading_answer() -> web.Response:
    """llama.cpp's answer while it loads (its error body's shape)."""
    return web.json_response({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
                             status=503)


def make_app(state: FakeServer) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        if request.match_info["mode"] == "loading" and state.loading(request.match_info["mode"]):
            return loading_answer()
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="# nothing here\n")

    async def handle(request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        chat = request.path.endswith("/chat/completions")
        if state.closes_unanswered(mode, request.transport):
            state.idle_closed_ns.append(time.time_ns())
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError  # no answer: the handler ends with its connection
        body = await request.json()
        seen = Seen(mode, {k.lower(): v for k, v in request.headers.items()}, body, time.time_ns())
        state.log.append(seen)
        state.counter += 1
        n = state.counter
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        generation = state.generation
        released = False

        def release() -> None:
            # out of flight before the answer's last bytes leave: a closed-loop client that reads
            # them sends its next request while write_eof still awaits, and must not find this one
            nonlocal released
            if not released:
                released = True
                if state.generation == generation:  # a reset since its arrival zeroed the count already
                    state.in_flight -= 1

        try:
            return await _respond(request, mode, chat, body, seen, n, release)
        finally:
            release()
            if mode == "idleclose":
                state.conn_done[request.transport] = time.monotonic()

    def refusal(request: web.Request, mode: str, body: dict[str, Any]) -> web.Response | None:
        strict = mode == "strict-all"
        if mode == "uuid-rid" or strict:
            rid = request.headers.get("X-Request-Id")
            try:
                ok = rid is None or str(uuid.UUID(rid)) == rid.lower()
            except ValueError:
                ok = False
            if not ok or (strict and rid is not None):
                return web.Response(status=400)  # a middleware's answer: no body at all
        if (mode == "no-tp" or strict) and "traceparent" in request.headers:
            return web.json_response({"error": "traceparent not allowed"}, status=400)
        unexpected = {"min_tokens", "ignore_eos"} & set(body)
        if (mode == "strict" or strict) and unexpected:
            return web.json_response({"detail": f"Unexpected fields in the request: {sorted(unexpected)}"},
                                     status=422)
        if (mode == "no-so" or strict) and "stream_options" in body:
            return web.json_response({"error": {"message": "unknown field stream_options"}}, status=400)
        per_word, ctx = context_of(mode)
        prompt_tokens = per_word * len(str(body.get("prompt", "")).split())
        if ctx is not None and prompt_tokens + int(body.get("max_tokens") or 0) > ctx:
            out = int(body.get("max_tokens") or 0)
            # vLLM's OpenAI server's wording and shape (an "error" object, HTTP 400)
            msg = (f"This model's maximum context length is {ctx} tokens. However, you requested {prompt_tokens + out} "
                   f"tokens ({prompt_tokens} in the messages, {out} in the completion). Please reduce the length of "
                   "the messages or completion.")
            return web.json_response({"error": {"message": msg, "type": "BadRequestError", "param": None,
                                                "code": 400}}, status=400)
        return None

    async def _respond(request: web.Request, mode: str, chat: bool, body: dict[str, Any], seen: Seen,
                       n: int, release: Callable[[], None]) -> web.StreamResponse:
        max_tokens = int(body.get("max_tokens") or 4)
        if state.loading(mode):
            return loading_answer()
        refused = refusal(request, mode, body)
        if refused is not None:
            return refused
        if mode == "http400":
            return web.json_response({"error": {"message": "bad request: max_tokens too large"}}, status=400)
        if mode == "http503" or (mode == "flaky" and n % 3 == 0) or (mode == "cap2" and state.in_flight > 2):
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if mode == "hang":
            await asyncio.sleep(30)
        if mode == "json":
            return web.json_response({"choices": [{"text": "hello"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if mode == "empty":
            await resp.write_eof()
            return resp
        if mode == "malformed":
            await resp.write(b"data: {not json at all\n\n")
            await asyncio.sleep(0.01)
            await resp.write_eof()
            return resp
        sep = b"\r\n" if mode == "crlf" else b"\n"
        await resp.write(_chunk(chat, None, role=True).replace(b"\n", sep))
        if mode in ("slow", "cap2"):
            await asyncio.sleep(SLOW_S)
        elif mode.startswith("ctx-"):  # a prefill that grows with the prompt
            await asyncio.sleep(CTX_BASE_S + CTX_S_PER_TOKEN * len(str(body.get("prompt", "")).split()))
        elif mode == "flaky":
            await asyncio.sleep(0.005)
        else:
            await asyncio.sleep(FIRST_CONTENT_DELAY_S)
        produced = max(1, max_tokens // 2) if mode == "short" else max_tokens
        if mode == "crlf":
            await resp.write(b": a comment line\r\nevent: message\r\n")
        for i in range(produced):
            if i == 0:
                seen.first_content_sent_ns = time.time_ns()
            fin = ("length" if mode != "short" else "stop") if i == produced - 1 else None
            await resp.write(_chunk(chat, f" tok{i}", finish=fin).replace(b"\n", sep))
            if mode == "midclose" and i == 1:
                await asyncio.sleep(0.01)
                assert request.transport is not None
                request.transport.close()
                return resp
            await asyncio.sleep(0.002)
        release()
        per_word = context_of(mode)[0]
        if per_word:  # a tokenizer that makes per_word tokens of every word
            await resp.write(_usage(per_word * len(str(body.get("prompt", "")).split()), produced))
        elif mode != "nousage":
            await resp.write(_usage(17, produced))
        if mode == "idleclose":  # [DONE] and the end of the body in one write: the client always
            await resp.write_eof(b"data: [DONE]\n\n")  # reads both and pools the connection
            return resp
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/{mode}/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/{mode}/v1/completions", handle)
    app.router.add_post("/{mode}/v1/chat/completions", handle)
    return app


@pytest.fixture(scope="session")
def fake_server() -> Any:
    """The session's fake SSE server (reset its log per test with ``server`` below)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        state = FakeServer("", 0)
        runner = web.AppRunner(make_app(state), access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state.port, state.base = port, f"http://127.0.0.1:{port}"
        holder["state"], holder["runner"] = state, runner

    def thread_main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    t = threading.Thread(target=thread_main, daemon=True)
    t.start()
    started.wait(10)
    yield holder["state"]
    async def stop() -> None:
        await holder["runner"].cleanup()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    fut = asyncio.run_coroutine_threadsafe(stop(), loop)
    try:
        fut.result(5)
    except Exception:
        pass
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


@pytest.fixture
def server(fake_server: FakeServer) -> FakeServer:
    fake_server.reset()
    return fake_server


@contextmanager
def _listening_after(delay_s: float) -> Iterator[str]:
    """A port bound at once that listens (and serves the fake modes) only after ``delay_s``, as
    vLLM binds before it builds its engine: until then connections are refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    loop = asyncio.new_event_loop()
    holder: dict = {}

    async def serve() -> None:
        await asyncio.sleep(delay_s)
        runner = web.AppRunner(make_app(FakeServer(f"http://127.0.0.1:{port}", port)), access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        holder["runner"] = runner

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.create_task(serve())
        loop.run_forever()

    t = threading.Thread(target=main, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}/ok"
    finally:
        if "runner" in holder:
            asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        sock.close()


@pytest.fixture
def listening_after() -> Any:
    """``with listening_after(s) as url``: a server whose port refuses connections for ``s`` seconds."""
    return _listening_after


@pytest.fixture
def refused_url() -> str:
    """A URL on a port where nothing listens."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"
