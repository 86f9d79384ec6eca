"""What a server says about its own limits before the probe pushes against them.

The context limit comes from ``GET /v1/models`` where the server lists one per model:
``max_model_len`` on vLLM's ``ModelCard`` (vllm-project/vllm@ec3b890c14b00f6670515d9df8d503b5270e95ca,
``vllm/entrypoints/openai/protocol.py``: "max_model_len: int | None", the engine's maximum
sequence length, prompt and output together) and on the bundled engine (``diag/bundled_engine/server.py``,
``_models``: the engine's ``max_context_tokens``). Servers that list none leave it to the prompt
ladder, which stops below the first length answered with a 4xx.

Threading: :func:`context_limit` is a coroutine for the probe's event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from collectors.probe.endpoint import auth_headers, split_url

#: Keys of a ``/v1/models`` entry that give the context limit in tokens (see the module docstring).
CONTEXT_KEYS: tuple[str, ...] = ("max_model_len",)


def limit_from_models(doc: Any, model: str | None) -> int | None:
    """The context limit (tokens) of ``model`` (or the first listed) in a ``/v1/models`` body."""
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    entries = [d for d in data if isinstance(d, dict)]
    chosen = next((d for d in entries if model and d.get("id") == model), entries[0] if entries else None)
    if chosen is None:
        return None
    for key in CONTEXT_KEYS:
        value = chosen.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return int(value)
    return None


async def context_limit(url: str, model: str | None, api_key: str | None = None,
                        timeout_s: float = 10.0) -> tuple[int | None, str]:
    """(context limit in tokens or None, where it came from / why not)."""
    base, _ = split_url(url)
    headers = auth_headers(api_key)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers) as s:
            async with s.get(base + "/v1/models") as r:
                if r.status != 200:
                    return None, f"GET /v1/models answered {r.status}"
                doc = await r.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return None, f"GET /v1/models failed ({type(exc).__name__})"
    limit = limit_from_models(doc, model)
    if limit is None:
        return None, "GET /v1/models lists no context limit: the prompt ladder learns it from a 4xx"
    return limit, f"context limit {limit} tokens (GET /v1/models {CONTEXT_KEYS[0]})"


__all__ = ["CONTEXT_KEYS", "context_limit", "limit_from_models"]
