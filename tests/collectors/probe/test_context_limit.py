"""collectors.probe.context_limit: which refusals say the prompt is longer than the context."""

from __future__ import annotations

import pytest

from collectors.probe.results import RequestResult
from collectors.probe.context_limit import describe, record, refusal_of, refused_as_too_long, stated_limit_tokens

VLLM_NEW = ("HTTP 400: {\"error\": {\"message\": \"You passed 3000 input tokens and requested 16 output tokens. However, "
            "the model's context length is only 2048 tokens, resulting in a maximum input length of 2032 tokens.\"}}")
VLLM_OLD = "HTTP 400: {\"object\": \"error\", \"message\": \"This model's maximum context length is 2048 tokens. However, you requested 3000 tokens\"}"
TGI = "HTTP 422: {\"error\": \"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 5000 `inputs` tokens and 16 `max_new_tokens`\"}"
#: vLLM 0.32.0: the prompt fits, but the context leaves 240 tokens for the 246 the probe demands (min_tokens)
VLLM_ANSWER = ("HTTP 400: {\"error\": {\"message\": \"min_tokens must be less than or equal to max_tokens=240, got "
               "246.\", \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}")
LLAMA_CPP = ("HTTP 400: {\"error\": {\"code\": 400, \"message\": \"the request exceeds the available context size, try "
             "increasing it\", \"type\": \"exceed_context_size_error\"}}")


@pytest.mark.parametrize("status,detail,limit", [(400, VLLM_NEW, 2048), (400, VLLM_OLD, 2048), (422, TGI, 4096),
                                                 (400, LLAMA_CPP, None), (413, "HTTP 413: Request Entity Too Large", None),
                                                 (400, VLLM_ANSWER, None)])
def test_servers_refusals_of_a_long_prompt(status, detail, limit) -> None:
    assert refused_as_too_long(status, detail)
    assert stated_limit_tokens(detail) == limit


@pytest.mark.parametrize("status,detail", [
    (400, "HTTP 400: {\"error\": {\"message\": \"unknown field stream_options\"}}"),  # what the compat check finds
    (422, "HTTP 422: Unexpected fields in the request: ['ignore_eos', 'min_tokens']"),
    (400, "HTTP 400"),  # no body: nothing says the prompt was too long
    (429, "HTTP 429: rate limit: too many tokens per minute"),  # not a refusal of the prompt's length
    (500, VLLM_OLD),
    (None, None),
])
def test_other_refusals_are_not_the_context_limit(status, detail) -> None:
    assert not refused_as_too_long(status, detail)


def test_the_record_and_its_line() -> None:
    results = [RequestResult("a", status=200), RequestResult("b", status=400, error="http_4xx", error_detail=VLLM_OLD),
               RequestResult("c", status=400, error="http_4xx", error_detail=VLLM_OLD)]
    refusal = refusal_of(results)
    assert refusal == {"status": 400, "message": VLLM_OLD, "stated_limit_tokens": 2048, "requests_refused": 2}
    assert refusal_of(results[:1]) is None
    limit = record(refusal, "prompt=4096", 4096, 2048, "a prompt sweep")
    assert limit["refused_segments"] == ["prompt=4096"] and limit["context_limit_tokens"] == 2048
    line = describe(limit)
    assert "prompt=4096 was refused" in line and "between 2048 and 4096" in line and "not failures" in line
    assert "below 64 prompt tokens" in describe(record(refusal, "prompt=64", 64, None, "a prompt sweep"))
