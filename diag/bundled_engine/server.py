"""OpenAI-compatible HTTP server over an :class:`~diag.bundled_engine.engine.Engine` (aiohttp).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE streaming or not;
``usage`` in a last chunk when ``stream_options.include_usage`` is set), ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus text, the engine's own registry).

Binds 127.0.0.1 by default; bodies are capped (``max_body_bytes``); malformed requests get a
4xx with a one-line JSON error; a full waiting queue gets 503. An incoming W3C ``traceparent``
header makes the request span join the caller's trace. When a client goes away (mid-stream or
while queued) its request is aborted and its KV blocks are freed.

Lazy load (``EngineConfig.lazy_load``): the server answers while the model loads; requests are
submitted (tokenized, queued) at once and their handlers wait, without sending headers, until
the engine is ready, then run normally; if loading fails they get a 503 naming the cause.
``/health`` is 503 ``{"status": "loading"}`` until ready, then 200 ``{"status": "ok", ...}``.

Structured output: ``response_format`` on both routes, ``{"type": "text"}`` (none),
``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name": ..., "schema":
{...}}}`` (:mod:`diag.bundled_engine.grammar_schema`: a malformed one or a schema outside the supported subset
gets a 400 at once). The handler holds the response (no headers yet) until the request's
grammar is ready, so a grammar that fails to compile is a 400 too; the schema's text is never
logged or recorded (the request span has its key only).

LoRA adapters (``EngineConfig.lora_modules``): ``/v1/models`` lists each adapter after the base
model (``parent``: the base model, ``root``: its directory, as vLLM lists them); a request whose
``model`` names one runs with it (``Engine.submit(lora=...)``) and its responses carry that name
as their ``model``. Any other unknown ``model`` is a 404, as without adapters.

Fault ``network_delay_ms``: every SSE write (headers, each chunk) and each non-streamed response
goes to the client that long after it is ready, pipelined (see :class:`DelayedWriter`), so it
adds to the client's TTFT but not to its inter-token gaps, and never touches the step loop.

Front end (:mod:`diag.bundled_engine.frontend`): each request holds one of ``EngineConfig.http_workers``
HTTP workers (unbounded by default) from its parsed body to the end of its response, and runs
``Engine.submit`` (tokenize, validate, enqueue) on one of ``tokenizer_workers`` threads (one by
default). Requests beyond them wait before the engine sees them; that wait is on the request span
(``stages.ATTR_FRONTEND_*``) and in ``/metrics``; a full ``http_backlog`` gets 503. The fault
``frontend_workers=N`` shrinks both pools.

Request parsing and the error body are in :mod:`diag.bundled_engine.openai_protocol`.

Threading: handlers run on the server's asyncio loop; tokenization runs on the front end's
tokenizer threads (``Engine.submit``); engine events come back through ``AsyncEventStream``.
:class:`ServerThread` runs the whole server on its own loop in a background thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

from aiohttp import web

from diag.ground import stages
from diag.bundled_engine.delayed_writer import DelayedWriter
from diag.bundled_engine.engine import Engine
from diag.bundled_engine.frontend import FrontEnd, FrontEndFull, FrontEndWait, effective_sizes
from diag.bundled_engine.grammar_schema import GrammarError
from diag.bundled_engine.openai_protocol import (DEFAULT_MAX_BODY_BYTES, ERROR_TYPES, BadRequest, ParsedRequest, error_response,
                                         parse_request)
from diag.bundled_engine.outputs import AsyncEventStream, EngineStoppedError, QueueFullError, TokenEvent


# --- the server ---------------------------------------------------------------------------------


class EngineServer:
    """The aiohttp application around one started engine. Use on one asyncio loop."""

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        tokenizer_threads: int | None = None,
    ) -> None:
        """``tokenizer_threads`` overrides ``engine.config.tokenizer_workers`` (the fault still shrinks it)."""
        self.engine = engine
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        cfg = engine.config
        self.frontend = FrontEnd(
            effective_sizes(cfg.http_workers, cfg.http_backlog, tokenizer_threads or cfg.tokenizer_workers,
                            engine.faults.frontend_workers),
            engine.metrics,
        )
        self._runner: web.AppRunner | None = None
        self._engine_settled: asyncio.Event | None = None  # ready or failed (lazy load)
        self.network_delay_s = engine.faults.network_delay_ms / 1000.0
        names = {engine.model_name, engine.config.model}
        self.served_names: tuple[str, ...] = (engine.model_name, *sorted(names - {engine.model_name}))
        self.adapters: tuple[str, ...] = engine.lora.names if engine.lora is not None else ()
        self.app = web.Application(client_max_size=max_body_bytes)
        self.app.add_routes(
            [
                web.post("/v1/completions", self._completions),
                web.post("/v1/chat/completions", self._chat),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.get("/metrics", self._metrics),
            ]
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve; ``port=0`` picks a free port (read it from :attr:`port`)."""
        loop = asyncio.get_running_loop()
        settled = asyncio.Event()
        self._engine_settled = settled

        def on_state() -> None:  # loop thread of the engine -> this server's loop
            try:
                loop.call_soon_threadsafe(settled.set)
            except RuntimeError:  # our loop is closed already
                pass

        self.engine.add_state_listener(on_state)
        # keepalive_timeout reaches aiohttp's RequestHandler through AppRunner -> Server: an idle
        # connection (waiting for its next request) is closed that many seconds after its last
        # response; unset, aiohttp's own default holds (3630 s) (aio-libs/aiohttp@495e778360d1924da63e16dba0f0d76baf56a56a,
        # aiohttp/web_protocol.py RequestHandler.__init__ and _process_keepalive; web_runner.py AppRunner)
        keepalive = self.engine.config.http_keepalive_s
        extra: dict[str, Any] = {} if keepalive is None else {"keepalive_timeout": float(keepalive)}
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0,
                                     **extra)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server  # the asyncio Server: read the real port back
        if server is not None and server.sockets:  # type: ignore[union-attr]
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Stop accepting, close connections (streams see a disconnect). The engine is not stopped."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.frontend.shutdown()

    # -- handlers ------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        engine = self.engine
        state = engine.state
        if state == "ready":
            return web.json_response({"status": "ok", **engine.stats()})
        if state == "loading":
            return web.json_response({"status": "loading", "waiting": engine.num_waiting()}, status=503)
        if state == "failed":
            return web.json_response({"status": "failed", "error": engine.unavailable_reason()}, status=503)
        return error_response("engine is not running", 503)

    async def _wait_engine_ready(self) -> str | None:
        """Wait (lazy load) until the engine is ready; the one-line reason when it never will be."""
        if self.engine.ready:
            return None
        if self._engine_settled is not None:
            await self._engine_settled.wait()
        if self.engine.ready:
            return None
        return self.engine.unavailable_reason()

    async def _models(self, request: web.Request) -> web.Response:
        engine = self.engine
        created = int(time.time())
        base = {"id": engine.model_name, "object": "model", "created": created, "owned_by": "ttft-diag",
                "root": engine.config.model, "parent": None, "max_model_len": engine.max_context_tokens}
        adapters = [{**base, "id": name, "root": str(info.path), "parent": engine.model_name}
                    for name, info in (engine.lora.adapters.items() if engine.lora is not None else ())]
        return web.json_response({"object": "list", "data": [base, *adapters]})

    async def _metrics(self, request: web.Request) -> web.Response:
        body, ctype = self.engine.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=True)

    async def _read_json(self, request: web.Request) -> Any:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BadRequest(f"request body is larger than {self.max_body_bytes} bytes", status=413) from None
        if not raw:
            raise BadRequest("request body is empty; expected a JSON object")
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"invalid JSON body: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        except UnicodeDecodeError:
            raise BadRequest("invalid JSON body: not UTF-8") from None

    async def _handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        engine = self.engine
        try:
            body = await self._read_json(request)
            arrival_ns = time.time_ns()  # the request span starts with the parsed body
            parsed = parse_request(body, chat, self.served_names, self.adapters)
        except BadRequest as exc:
            engine.metrics.rejected("invalid")
            return error_response(str(exc), exc.status, exc.param)
        wait = FrontEndWait()
        try:
            async with self.frontend.worker(wait):
                return await self._serve(request, parsed, chat, arrival_ns, wait)
        except FrontEndFull as exc:
            return error_response(str(exc), 503)

    async def _serve(self, request: web.Request, parsed: ParsedRequest, chat: bool, arrival_ns: int,
                     wait: FrontEndWait) -> web.StreamResponse:
        """One request on its HTTP worker: submit on a tokenizer thread, then stream or collect."""
        engine = self.engine
        rid = uuid.uuid4().hex[:24]
        stream = AsyncEventStream()
        fut = self.frontend.tokenize(
            lambda: engine.submit(
                stream.push,
                parsed.params,
                prompt=parsed.prompt,
                prompt_ids=parsed.prompt_ids,
                messages=parsed.messages,
                request_id=rid,
                traceparent=request.headers.get("traceparent"),
                arrival_ns=arrival_ns,
                trace_attributes={
                    "gen_ai.operation.name": "chat" if chat else "text_completion",
                    stages.ATTR_FRONTEND_WAIT_S: wait.wait_s,
                    stages.ATTR_FRONTEND_HTTP_WAIT_S: wait.http_wait_s,
                    stages.ATTR_FRONTEND_TOKENIZER_WAIT_S: wait.tokenizer_wait_s,
                },
                max_tokens_given=parsed.max_tokens_given,
                grammar=parsed.grammar,
                lora=parsed.lora,
            ),
            wait,
        )
        try:
            submitted = await asyncio.shield(fut)
        except asyncio.CancelledError:
            # client left while we tokenized: abort once (if) the submission lands
            fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() else engine.abort(rid, "disconnect"))
            raise
        except QueueFullError as exc:
            return error_response(str(exc), 503)
        except EngineStoppedError as exc:
            return error_response(str(exc), 503)
        except ValueError as exc:  # RequestRejected, bad sampling params, bad token ids
            return error_response(str(exc), 400)
        finished = False
        try:
            if not engine.ready:  # lazy load: hold the response (no headers yet) until ready
                why = await self._wait_engine_ready()
                if why is not None:
                    finished = True
                    return error_response(why, 503)
            if submitted.grammar is not None:  # hold the response until the grammar is ready
                try:  # shielded: a client that leaves must not cancel a compile others share
                    await asyncio.shield(asyncio.wrap_future(submitted.grammar))
                except GrammarError as exc:
                    finished = True  # the engine ended the request itself
                    return error_response(str(exc), 400, "response_format")
                except EngineStoppedError as exc:
                    return error_response(str(exc), 503)
                except asyncio.CancelledError:
                    if not submitted.grammar.cancelled():
                        raise  # this handler was cancelled (client gone)
                    # the compile was cancelled (shutdown): the stream's last event says why
            if parsed.stream:
                resp = await self._stream(request, parsed, rid, submitted.num_prompt_tokens, stream)
            else:
                resp = await self._collect(parsed, rid, submitted.num_prompt_tokens, stream)
            finished = True
            return resp
        finally:
            if not finished:
                engine.abort(rid, "disconnect")

    def _chunk(self, parsed: ParsedRequest, rid: str, created: int, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if parsed.chat:
            delta: dict[str, Any] = {}
            if role:
                delta = {"role": "assistant", "content": ""}
            elif text:
                delta = {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
            cid = f"chatcmpl-{rid}"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
            cid = f"cmpl-{rid}"
        chunk: dict[str, Any] = {"id": cid, "object": obj, "created": created, "model": parsed.lora or self.engine.model_name, "choices": [choice]}
        if parsed.include_usage:
            chunk["usage"] = None
        return chunk

    async def _stream(
        self, request: web.Request, parsed: ParsedRequest, rid: str, prompt_tokens: int, stream: AsyncEventStream
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Request-Id": rid},
        )
        created = int(time.time())
        delayed: DelayedWriter | None = None
        if self.network_delay_s > 0:
            delayed = DelayedWriter(resp, request, self.network_delay_s)

            async def send(obj: dict[str, Any]) -> None:
                assert delayed is not None
                delayed.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")
        else:
            await resp.prepare(request)

            async def send(obj: dict[str, Any]) -> None:
                await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

        try:
            return await self._stream_events(resp, parsed, rid, created, stream, send, delayed)
        finally:
            if delayed is not None:
                delayed.cancel()  # no-op once closed; stops the writer if the handler failed

    async def _stream_events(
        self,
        resp: web.StreamResponse,
        parsed: ParsedRequest,
        rid: str,
        created: int,
        stream: AsyncEventStream,
        send: Any,
        delayed: "DelayedWriter | None",
    ) -> web.StreamResponse:
        if parsed.chat:
            await send(self._chunk(parsed, rid, created, None, None, role=True))
        last: TokenEvent | None = None
        async for ev in stream:
            last = ev
            if ev.finished:
                if ev.finish_reason == "error":
                    code = ev.error_status or 500
                    await send({"error": {"message": ev.error or "engine error",
                                          "type": ERROR_TYPES.get(code, "InternalServerError"), "code": code}})
                    break
                await send(self._chunk(parsed, rid, created, ev.text, ev.finish_reason))
            elif ev.text:
                await send(self._chunk(parsed, rid, created, ev.text, None))
        if parsed.include_usage and last is not None:
            usage = {
                "prompt_tokens": last.num_prompt_tokens,
                "completion_tokens": last.num_output_tokens,
                "total_tokens": last.num_prompt_tokens + last.num_output_tokens,
            }
            cid = f"chatcmpl-{rid}" if parsed.chat else f"cmpl-{rid}"
            obj = "chat.completion.chunk" if parsed.chat else "text_completion"
            await send({"id": cid, "object": obj, "created": created, "model": parsed.lora or self.engine.model_name, "choices": [], "usage": usage})
        if delayed is not None:
            delayed.write(b"data: [DONE]\n\n")
            await delayed.close()
            return resp
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _collect(self, parsed: ParsedRequest, rid: str, prompt_tokens: int, stream: AsyncEventStream) -> web.Response:
        parts: list[str] = []
        last: TokenEvent | None = None
        async for ev in stream:
            parts.append(ev.text)
            last = ev
        assert last is not None
        if last.finish_reason == "error":
            return error_response(last.error or "engine error", last.error_status or 500)
        text = "".join(parts)
        usage = {
            "prompt_tokens": last.num_prompt_tokens,
            "completion_tokens": last.num_output_tokens,
            "total_tokens": last.num_prompt_tokens + last.num_output_tokens,
        }
        created = int(time.time())
        if self.network_delay_s > 0:  # fault: the whole response reaches the client late
            await asyncio.sleep(self.network_delay_s)
        if parsed.chat:
            body = {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion",
                "created": created,
                "model": parsed.lora or self.engine.model_name,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": last.finish_reason}
                ],
                "usage": usage,
            }
        else:
            body = {
                "id": f"cmpl-{rid}",
                "object": "text_completion",
                "created": created,
                "model": parsed.lora or self.engine.model_name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason}],
                "usage": usage,
            }
        return web.json_response(body, headers={"X-Request-Id": rid})


class ServerThread:
    """An :class:`EngineServer` on its own asyncio loop in a daemon thread (tests, probe, scenarios).

    ``start()`` returns once the socket is bound (read :attr:`port` / :attr:`url`); ``stop()``
    closes the server and, if ``own_engine``, shuts the engine down (flushing its trace sink).
    Both may be called from any thread.
    """

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, own_engine: bool = True, **server_kwargs: Any) -> None:
        self.engine = engine
        self.own_engine = own_engine
        self.server = EngineServer(engine, host, port, **server_kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def start(self, timeout_s: float = 30.0) -> "ServerThread":
        self._thread = threading.Thread(target=self._main, name="ttft-engine-http", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError("engine HTTP server did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self.server.stop())
            loop.close()
            self._stopped.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving; shut the engine down too when this thread owns it. Idempotent."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
        if self.own_engine:
            self.engine.shutdown()

    def __enter__(self) -> "ServerThread":
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
