"""The probe's SSE reader for OpenAI-compatible streams, and the JSON codec it shares with the client.

:func:`read_stream` reads one streamed response into its :class:`~collectors.probe.results.RequestResult`:
event and content timestamps (Unix ns), the output text, the finish reason, usage counts and the
error kind of a stream that ends badly. It runs on the event loop that owns the response.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from collectors.probe.results import RequestResult
from collectors.probe.schemas import SchemaRoles

try:  # orjson is optional; it parses small SSE payloads ~3x faster
    import orjson as _orjson

    loads = _orjson.loads
    dumps = _orjson.dumps
except ImportError:  # pragma: no cover - depends on the environment
    loads = json.loads

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


def one_line(text: str, limit: int = 160) -> str:
    """``text`` on one line, white space folded, cut to ``limit`` characters with an ellipsis."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


async def read_stream(resp: aiohttp.ClientResponse, res: RequestResult, *, offset_ns: int, chat: bool,
                      keep_text: bool, schema_roles: SchemaRoles) -> None:
    """Parse the SSE stream of ``resp`` into ``res``, timestamping events as their bytes arrive (hot path).

    ``offset_ns`` turns ``perf_counter_ns`` into Unix ns; ``chat``: the stream is chat completions;
    ``keep_text``: keep the output text on ``res``; ``schema_roles`` hears of the first token.
    """
    off = offset_ns
    keep = keep_text
    texts: list[str] | None = [] if keep else None
    times = res.token_times_ns
    pending = b""
    data_lines: list[bytes] = []
    done = False
    first_event = None
    first_content = None
    last = None
    n_events = 0
    reader = resp.content
    while not done:
        chunk = await reader.readany()
        if not chunk:
            break
        now = time.perf_counter_ns() + off
        if pending:
            chunk = pending + chunk
        lines = chunk.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if line:
                if line.startswith(b"data:"):
                    data_lines.append(line[5:].lstrip(b" "))
                continue  # comments, event:, id:, retry: are ignored
            if not data_lines:
                continue
            payload = data_lines[0] if len(data_lines) == 1 else b"\n".join(data_lines)
            data_lines = []
            n_events += 1
            if first_event is None:
                first_event = now
            last = now
            if payload == b"[DONE]":
                done = True
                break
            try:
                obj = loads(payload)
            except ValueError:
                res.error = "malformed_sse"
                res.error_detail = "data line is not JSON: " + one_line(payload[:120].decode("utf-8", "replace"))
                done = True
                break
            if type(obj) is not dict:
                res.error = "malformed_sse"
                res.error_detail = "data line is not a JSON object"
                done = True
                break
            choices = obj.get("choices")
            if choices:
                c0 = choices[0]
                if chat:
                    delta = c0.get("delta") or {}
                    text = delta.get("content")
                    if not text:
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                        if reasoning:
                            text = reasoning
                        elif delta.get("tool_calls"):
                            text = " "
                    elif res.first_answer_ns is None:
                        res.first_answer_ns = now
                else:
                    text = c0.get("text")
                if text:
                    times.append(now)
                    if first_content is None:
                        first_content = now
                        if res.schema_key is not None:
                            schema_roles.on_first_token(res.schema_key)
                    if texts is not None:
                        texts.append(text)
                fr = c0.get("finish_reason")
                if fr:
                    res.finish_reason = fr
            usage = obj.get("usage")
            if usage:
                pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
                if isinstance(pt, int):
                    res.usage_input_tokens = pt
                if isinstance(ct, int):
                    res.usage_output_tokens = ct
            if "error" in obj and not choices:
                err = obj["error"]
                res.error = "stream_error"
                res.error_detail = one_line(err.get("message", err) if isinstance(err, dict) else err)
                done = True
                break
    if not done and data_lines:  # a last event without its blank line
        payload = b"\n".join(data_lines)
        n_events += 1
        if payload == b"[DONE]":
            done = True
    res.first_event_ns = first_event
    res.first_content_ns = first_content
    res.last_ns = last
    if texts is not None:
        res.output_text = "".join(texts)
    if res.error is not None:
        return
    if n_events == 0:
        res.error = "empty_body"
        res.error_detail = "200 OK with no SSE event"
    elif not done and res.finish_reason is None:
        res.error = "closed_mid_stream"
        res.error_detail = f"stream ended after {n_events} events without [DONE] or finish_reason"
    elif first_content is None:
        res.error = "no_content"
        res.error_detail = "stream finished without non-empty content"
