"""The OpenAI-compatible request and error shapes of the bundled engine's HTTP server.

:func:`parse_request` checks a ``/v1/completions`` or ``/v1/chat/completions`` JSON body and
returns a :class:`ParsedRequest` (sampling parameters, prompt or messages, streaming options,
grammar, LoRA adapter), or raises :class:`BadRequest` with the HTTP status and parameter to name;
:func:`error_response` is the one-line JSON error body. Pure functions, any thread.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from diag.bundled_engine.grammar_schema import GrammarError, GrammarSource, grammar_source
from diag.bundled_engine.sampler import MAX_TOKENS_LIMIT, SamplingParams

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 256


class BadRequest(ValueError):
    """A client error with its HTTP status (default 400)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 413: "RequestTooLarge", 503: "ServiceUnavailableError"}


def error_response(message: str, status: int, param: str | None = None) -> web.Response:
    """OpenAI-style error body on one line: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": param, "code": status}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


# --- request parsing ----------------------------------------------------------------------------


def _opt_number(body: dict[str, Any], key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"'{key}' must be a number, got {json.dumps(v)[:40]}", param=key)
    if v < lo or v > hi or (lo_open and v == lo):
        raise BadRequest(f"'{key}' must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v}", param=key)
    return float(v)


def _opt_int(body: dict[str, Any], key: str, default: int | None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"'{key}' must be an integer, got {json.dumps(v)[:40]}", param=key)
    return v


def _opt_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"'{key}' must be a boolean, got {json.dumps(v)[:40]}", param=key)
    return v


@dataclass
class ParsedRequest:
    """A validated completions/chat request."""

    chat: bool
    prompt: str | None
    prompt_ids: list[int] | None
    messages: list[dict[str, str]] | None
    params: SamplingParams
    stream: bool
    include_usage: bool
    max_tokens_given: bool
    grammar: GrammarSource | None = None
    #: the LoRA adapter the request's ``model`` names (None: the base model)
    lora: str | None = None


def parse_request(body: Any, chat: bool, served_names: tuple[str, ...],
                  adapters: tuple[str, ...] = ()) -> ParsedRequest:
    """Validate a decoded JSON body; BadRequest with a one-line message naming the field. A ``model``
    among ``adapters`` (LoRA adapter names) selects that adapter."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    lora: str | None = None
    if model is not None:
        if not isinstance(model, str):
            raise BadRequest("'model' must be a string", param="model")
        if model in adapters:
            lora = model
        elif model not in served_names:
            also = f" and the LoRA adapters {', '.join(repr(a) for a in adapters)}" if adapters else ""
            raise BadRequest(f"model {model!r} not found; this server serves {served_names[0]!r}{also}", status=404,
                             param="model")
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[dict[str, str]] | None = None
    if chat:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise BadRequest("'messages' must be a non-empty list", param="messages")
        messages = []
        for i, m in enumerate(raw):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'", param="messages")
            content = m.get("content")
            if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                parts = []
                for p in content:
                    if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                        raise BadRequest(f"messages[{i}].content: only text parts are supported", param="messages")
                    parts.append(p["text"])
                content = "".join(parts)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise BadRequest(f"messages[{i}].content must be a string", param="messages")
            messages.append({"role": m["role"], "content": content})
        if not any(m["content"] for m in messages):
            raise BadRequest("messages are empty (no content)", param="messages")
    else:
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
            raw = raw[0]
        if isinstance(raw, str):
            if not raw:
                raise BadRequest("'prompt' must not be empty", param="prompt")
            prompt = raw
        elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            prompt_ids = list(raw)
        elif isinstance(raw, list) and not raw:
            raise BadRequest("'prompt' must not be empty", param="prompt")
        elif raw is None:
            raise BadRequest("'prompt' is required", param="prompt")
        else:
            raise BadRequest("'prompt' must be a string, a list of one string, or a list of token ids", param="prompt")
    key = "max_tokens"
    max_tokens = _opt_int(body, "max_tokens", None)
    if chat and body.get("max_completion_tokens") is not None:
        key = "max_completion_tokens"
        max_tokens = _opt_int(body, key, None)
    given = max_tokens is not None
    if max_tokens is None:
        max_tokens = DEFAULT_CHAT_MAX_TOKENS if chat else DEFAULT_COMPLETION_MAX_TOKENS
    if max_tokens < 1 or max_tokens > MAX_TOKENS_LIMIT:
        raise BadRequest(f"'{key}' must be an integer in [1, {MAX_TOKENS_LIMIT}], got {max_tokens}", param=key)
    n = _opt_int(body, "n", 1)
    if n != 1:
        raise BadRequest("'n' must be 1 (one choice per request)", param="n")
    if body.get("stop") not in (None, [], ""):
        raise BadRequest("'stop' sequences are not supported by this engine", param="stop")
    top_k = _opt_int(body, "top_k", 0)
    assert top_k is not None
    if top_k < -1:
        raise BadRequest(f"'top_k' must be >= -1 (-1 or 0 = off), got {top_k}", param="top_k")
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_opt_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_opt_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=max(0, top_k),
        seed=_opt_int(body, "seed", None),
        ignore_eos=_opt_bool(body, "ignore_eos", False),
    )
    stream = _opt_bool(body, "stream", False)
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        include_usage = _opt_bool(so, "include_usage", False)
    try:
        grammar = grammar_source(body.get("response_format"))
    except GrammarError as exc:
        raise BadRequest(str(exc), param="response_format") from None
    return ParsedRequest(chat, prompt, prompt_ids, messages, params, stream, include_usage, given, grammar, lora)
