"""A tiny OpenAI-compatible streaming server that answers instantly, for client benchmarks.

``POST /v1/completions`` and ``/v1/chat/completions`` stream a fixed answer: a role-only (or
empty-text) chunk and the first content chunk at once, then ``--chunks - 1`` more content
chunks ``--itl-ms`` apart, a usage chunk and ``[DONE]``. Per request (keyed by the
``X-Request-ID`` header) it records, in Unix ns (``time.time_ns()``):

* ``recv_ns``: the handler got the parsed request (the earliest server-side moment);
* ``first_sent_ns``: just before the first content chunk was written to the socket.

``GET /records`` returns them as JSON and clears them. ``GET /v1/models`` lists one model.

Run: ``python benchmarks/instant_server.py [--port 0] [--port-file F]``; it prints the port.
Threading: one event loop; handlers only append to a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from aiohttp import web


def _chunk(chat: bool, text: str, role: bool = False, finish: str | None = None) -> bytes:
    if chat:
        delta = {"role": "assistant", "content": ""} if role else {"content": text}
        obj = {"id": "i", "object": "chat.completion.chunk", "model": "instant",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    else:
        obj = {"id": "i", "object": "text_completion", "model": "instant",
               "choices": [{"index": 0, "text": "" if role else text, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def make_app(chunks: int, itl_s: float) -> web.Application:
    records: dict[str, tuple[int, int]] = {}
    pre = {chat: (_chunk(chat, "", role=True), [_chunk(chat, f" w{i}", finish="length" if i == chunks - 1 else None)
                                                  for i in range(chunks)]) for chat in (False, True)}
    tail = (b'data: {"id":"i","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}\n\n'
            % (chunks, chunks + 8)) + b"data: [DONE]\n\n"

    async def completions(request: web.Request) -> web.StreamResponse:
        recv_ns = time.time_ns()
        await request.read()
        chat = request.path.endswith("/chat/completions")
        role, content = pre[chat]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(role)
        first_sent_ns = time.time_ns()
        await resp.write(content[0])
        rid = request.headers.get("X-Request-ID")
        if rid:
            records[rid] = (recv_ns, first_sent_ns)
        for c in content[1:]:
            if itl_s:
                await asyncio.sleep(itl_s)
            await resp.write(c)
        await resp.write(tail)
        await resp.write_eof()
        return resp

    async def get_records(request: web.Request) -> web.Response:
        out = {k: list(v) for k, v in records.items()}
        records.clear()
        return web.json_response(out)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "instant", "object": "model"}]})

    app = web.Application(client_max_size=1 << 20)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/records", get_records)
    app.router.add_get("/v1/models", models)
    return app


async def serve(host: str, port: int, chunks: int, itl_s: float, port_file: str | None) -> None:
    runner = web.AppRunner(make_app(chunks, itl_s), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    real = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(real, flush=True)
    if port_file:
        Path(port_file).write_text(str(real))
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--chunks", type=int, default=32, help="content chunks per answer")
    ap.add_argument("--itl-ms", type=float, default=20.0, help="gap between content chunks after the first (ms)")
    ap.add_argument("--port-file", help="write the bound port here")
    a = ap.parse_args()
    try:
        asyncio.run(serve(a.host, a.port, a.chunks, a.itl_ms / 1e3, a.port_file))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
