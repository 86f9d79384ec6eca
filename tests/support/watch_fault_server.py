"""A small OpenAI-compatible streaming server, run as its own process by the live-fault tests.

``python watch_fault_server.py MODE_FILE [PORT]`` binds 127.0.0.1 (on a free port without
PORT) and prints ``listening on PORT``. Before every request it reads MODE_FILE (one word), so a test changes
how the server behaves without restarting it:

* ``ok``: /v1/completions and /v1/chat/completions stream 4 tokens; /metrics has vLLM gauges;
* ``503``: every completion is refused with HTTP 503 (an overloaded server shedding load);
* ``shed``: every completion's connection is closed before any answer (a full front end);
* ``no-metrics``: completions as ``ok``, /metrics answers 404 (the exporter went away).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import web


def main() -> None:
    mode_file = Path(sys.argv[1])
    port_arg = int(sys.argv[2]) if len(sys.argv) > 2 else 0

    def mode() -> str:
        try:
            return mode_file.read_text().strip() or "ok"
        except OSError:
            return "ok"

    def chunk(chat: bool, text: str, finish: str | None = None) -> bytes:
        choice: dict[str, Any] = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
                                  else {"index": 0, "text": text, "finish_reason": finish})
        return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fault-model", "object": "model"}]})

    async def metrics(request: web.Request) -> web.Response:
        if mode() == "no-metrics":
            return web.Response(status=404, text="not found\n")
        return web.Response(text='vllm:num_requests_running{model_name="fault-model"} 1\n'
                                 'vllm:num_requests_waiting{model_name="fault-model"} 0\n'
                                 'vllm:kv_cache_usage_perc{model_name="fault-model"} 0.1\n')

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        m = mode()
        if m == "503":
            return web.json_response({"error": {"message": "server overloaded"}}, status=503)
        if m == "shed" and request.transport is not None:
            request.transport.close()
            return web.Response(status=503)
        chat = request.path.endswith("/chat/completions")
        n = max(1, int(body.get("max_tokens") or 4))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.01)  # a little prefill
        for i in range(n):
            await resp.write(chunk(chat, f" t{i}", "length" if i == n - 1 else None))
            await asyncio.sleep(0.002)
        usage = {"prompt_tokens": len(str(body.get("prompt", body.get("messages", ""))).split()),
                 "completion_tokens": n}
        await resp.write(b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", complete)
        app.router.add_post("/v1/chat/completions", complete)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port_arg)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"listening on {port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
