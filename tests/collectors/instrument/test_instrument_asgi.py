"""The ASGI middleware and the handler hook on a real FastAPI app, driven as ASGI (no network):
the client's traceparent joins, the status and the end of the stream close the request span."""

from __future__ import annotations

import asyncio
import json
import types

import pytest

fastapi = pytest.importorskip("fastapi")

from collectors.instrument.runtime import Instrumentation  # noqa: E402
from collectors.instrument.transformers_serve import TraceMiddleware, _Patches  # noqa: E402
from collectors.spans import setup_tracing  # noqa: E402
from diag.ground import stages  # noqa: E402

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


class _Tok:
    def apply_chat_template(self, messages, **kw):
        return {"input_ids": [1] * len(messages)}


class FakeChatHandler:
    """Shaped like transformers' ChatCompletionHandler.handle_request(body, request_id)."""

    tokenizer_cls = _Tok

    async def handle_request(self, body, request_id):
        from fastapi import HTTPException
        from fastapi.responses import StreamingResponse

        if body.get("min_tokens"):
            raise HTTPException(status_code=422, detail="Unexpected fields in the request: {'min_tokens'}")
        self.tokenizer_cls().apply_chat_template(body["messages"])

        async def gen():
            yield "data: {}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")


@pytest.fixture
def traced_app():
    inst = Instrumentation(environ={})
    inst.sink = setup_tracing(service_name="transformers", memory=True)
    p = _Patches(inst, "5.24.0")
    # fresh subclasses per test: a wrapped attribute is never wrapped twice
    handler_cls = type("FakeChatHandler", (FakeChatHandler,), {})
    tok_cls = type("Tok", (_Tok,), {})
    handler_cls.tokenizer_cls = tok_cls
    p.patch_handler("FakeChatHandler")(types.SimpleNamespace(FakeChatHandler=handler_cls))
    p.wrap(tok_cls, "apply_chat_template", p._make_tokenize)
    handler = handler_cls()
    app = fastapi.FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: fastapi.Request, body: dict):
        return await handler.handle_request(body, request.headers.get("x-request-id", "rid"))

    @app.get("/health")
    def health():
        return {"status": "ok"}

    app.add_middleware(TraceMiddleware, patches=p)
    yield app, inst
    inst.sink.shutdown()


def _call(app, method, path, body=None, headers=()):
    sent = []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000),
             "headers": [(b"content-type", b"application/json"), *headers]}
    payload = json.dumps(body).encode() if body is not None else b""

    calls = []

    async def receive():
        calls.append(1)
        if len(calls) == 1:
            return {"type": "http.request", "body": payload, "more_body": False}
        await asyncio.sleep(30)  # no disconnect: Starlette cancels this listener when the stream ends
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def _spans(inst):
    inst.sink.force_flush()
    return inst.sink.memory.get_finished_spans()


@pytest.mark.timeout(30)
def test_a_streamed_request_joins_the_client_trace_and_ends_with_its_last_chunk(traced_app):
    app, inst = traced_app
    tp = f"00-{TRACE_ID}-{PARENT}-01".encode()
    sent = _call(app, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True},
                 headers=[(b"traceparent", tp), (b"x-request-id", b"r-1")])
    assert sent[0]["status"] == 200 and b"[DONE]" in b"".join(m.get("body", b"") for m in sent)
    spans = {s.name: s for s in _spans(inst)}
    root = spans[stages.SPAN_REQUEST]
    assert format(root.context.trace_id, "032x") == TRACE_ID and format(root.parent.span_id, "016x") == PARENT
    assert root.attributes[stages.ATTR_REQUEST_ID] == "r-1" and stages.ATTR_ERROR not in root.attributes
    assert spans[stages.TOKENIZE].context.trace_id == root.context.trace_id
    assert root.start_time <= spans[stages.TOKENIZE].start_time <= spans[stages.TOKENIZE].end_time <= root.end_time
    assert inst.stats.total_errors == 0


@pytest.mark.timeout(30)
def test_a_refused_request_ends_with_its_status_and_untraced_paths_stay_untraced(traced_app):
    app, inst = traced_app
    sent = _call(app, "POST", "/v1/chat/completions", {"messages": [], "min_tokens": 3, "stream": True})
    assert sent[0]["status"] == 422
    _call(app, "GET", "/health")
    spans = _spans(inst)
    assert [s.name for s in spans] == [stages.SPAN_REQUEST]
    assert spans[0].attributes[stages.ATTR_ERROR] == "http_422"
    assert inst.meta_block()["unmeasured"] == {}
