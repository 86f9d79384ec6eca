"""An OTLP trace receiver: OTLP/HTTP ``POST /v1/traces`` (protobuf or JSON, gzip) and,
optionally, OTLP/gRPC ``TraceService/Export``.

Each accepted ExportTraceServiceRequest is put on a bounded queue and handed to a *sink*
(``sink(message)``, e.g. ``CaptureWriter.append_span_request``) by one background thread, so
a slow disk never blocks the HTTP side. When the queue is full the request is answered 503
(gRPC: UNAVAILABLE), which OTLP exporters retry with backoff; its spans are counted in
``dropped``. Bodies larger than ``max_body_bytes`` (after gunzip too) get 413, malformed ones
400 with a one-line message, other content types 415. Replies are an
ExportTraceServiceResponse in the request's encoding; errors carry a ``google.rpc.Status``.

Binds 127.0.0.1 by default. Threading: the HTTP server runs one thread per connection; the
counters are updated under a lock and may be read from any thread.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from diag.ground.otlp_json import OTLPJSONError, json_to_request

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
DEFAULT_HTTP_PORT = 4318
DEFAULT_GRPC_PORT = 4317
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_QUEUE_REQUESTS = 1024

CT_PROTOBUF = "application/x-protobuf"
CT_JSON = "application/json"

Sink = Callable[[ExportTraceServiceRequest], None]


class BodyError(Exception):
    """A request body that cannot be accepted: HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def count_spans(msg: ExportTraceServiceRequest) -> int:
    """Spans in one export request."""
    return sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)


def gunzip_bounded(data: bytes, max_bytes: int) -> bytes:
    """Decompress a gzip body, refusing (413) more than ``max_bytes`` of output."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise BodyError(400, f"gzip body is corrupt: {exc}") from None
    if len(out) > max_bytes or d.unconsumed_tail:
        raise BodyError(413, f"decompressed body over {max_bytes} bytes")
    if not d.eof:
        raise BodyError(400, "gzip body is truncated")
    return out


def decode_body(body: bytes, content_type: str, content_encoding: str, max_bytes: int) -> tuple[ExportTraceServiceRequest, bool]:
    """An OTLP/HTTP body → (message, is_json). Raises BodyError (400/413/415)."""
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype not in (CT_PROTOBUF, CT_JSON):
        raise BodyError(415, f"unsupported content type {ctype or '(none)'!r}; use {CT_PROTOBUF} or {CT_JSON}")
    enc = content_encoding.strip().lower()
    if enc == "gzip":
        body = gunzip_bounded(body, max_bytes)
    elif enc not in ("", "identity"):
        raise BodyError(415, f"unsupported content encoding {enc!r}; use gzip or none")
    if ctype == CT_JSON:
        try:
            return json_to_request(body), True
        except OTLPJSONError as exc:
            raise BodyError(400, " ".join(str(exc).split())[:200]) from None
        except (AttributeError, TypeError, KeyError) as exc:  # a JSON value of the wrong shape
            raise BodyError(400, f"not OTLP JSON: wrong shape ({type(exc).__name__}: {exc})"[:200]) from None
    try:
        return ExportTraceServiceRequest.FromString(body), False
    except (DecodeError, ValueError) as exc:
        raise BodyError(400, f"protobuf body is not an ExportTraceServiceRequest: {exc}") from None


def _status_body(code_http: int, message: str, as_json: bool) -> bytes:
    """A google.rpc.Status for an error reply (gRPC code from the HTTP status)."""
    grpc_code = {400: 3, 413: 8, 415: 3, 503: 14}.get(code_http, 2)
    if as_json:
        return json.dumps({"code": grpc_code, "message": message}).encode()
    try:
        from google.rpc.status_pb2 import Status

        return Status(code=grpc_code, message=message).SerializeToString()
    except ImportError:  # googleapis-common-protos missing: plain text is still an answer
        return message.encode()


class OTLPReceiver:
    """OTLP trace receiver. ``start()`` → (host, http_port); ``stop()`` drains and joins.

    ``sink`` is called with each accepted ExportTraceServiceRequest on one background thread
    (in arrival order). Counters: ``received_spans`` (accepted), ``received_requests``,
    ``rejected`` (requests answered 4xx), ``dropped`` (spans refused with 503 because the queue
    was full), ``sink_errors`` (sink raised; the message is lost, the receiver goes on).
    ``grpc_port``: None = no gRPC server; 0 = an ephemeral port (see ``grpc_address``).
    """

    def __init__(
        self,
        sink: Sink,
        host: str = "127.0.0.1",
        port: int = DEFAULT_HTTP_PORT,
        grpc_port: int | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_queue_requests: int = DEFAULT_QUEUE_REQUESTS,
    ) -> None:
        self.sink = sink
        self.host = host
        self.port = port
        self.grpc_port = grpc_port
        self.max_body_bytes = max_body_bytes
        self._queue: queue.Queue[ExportTraceServiceRequest | None] = queue.Queue(maxsize=max_queue_requests)
        self._lock = threading.Lock()
        self.received_spans = 0
        self.received_requests = 0
        self.rejected = 0
        self.dropped = 0
        self.sink_errors = 0
        self.last_error = ""
        self._httpd: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self._grpc_server: Any = None
        self.address: tuple[str, int] | None = None
        self.grpc_address: tuple[str, int] | None = None

    # --- accounting (any thread) ---------------------------------------------------------------

    def submit(self, msg: ExportTraceServiceRequest) -> bool:
        """Queue one request for the sink; False (and counted as dropped) when the queue is full."""
        n = count_spans(msg)
        try:
            self._queue.put_nowait(msg)
        except queue.Full:
            with self._lock:
                self.dropped += n
            return False
        with self._lock:
            self.received_spans += n
            self.received_requests += 1
        return True

    def note_rejected(self, message: str) -> None:
        with self._lock:
            self.rejected += 1
            self.last_error = message

    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters."""
        with self._lock:
            return {
                "received_spans": self.received_spans,
                "received_requests": self.received_requests,
                "rejected": self.rejected,
                "dropped": self.dropped,
                "sink_errors": self.sink_errors,
                "queued": self._queue.qsize(),
                "last_error": self.last_error,
            }

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> tuple[str, int]:
        """Bind and serve; returns the HTTP (host, port) actually bound (port 0 allowed)."""
        if self._httpd is not None:
            assert self.address is not None
            return self.address
        handler = _make_handler(self)
        self._httpd = ThreadingHTTPServer((self.host, self.port), handler)
        self._httpd.daemon_threads = True
        host, port = self._httpd.server_address[:2]
        self.address = (str(host), int(port))
        self._worker = threading.Thread(target=self._drain, name="ttft-otlp-sink", daemon=True)
        self._worker.start()
        self._http_thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                             name="ttft-otlp-http", daemon=True)
        self._http_thread.start()
        if self.grpc_port is not None:
            self._start_grpc()
        return self.address

    def _start_grpc(self) -> None:
        import grpc
        from concurrent import futures

        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc

        receiver = self

        class _Servicer(svc.TraceServiceServicer):
            def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:  # noqa: N802
                if not receiver.submit(request):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "receiver queue full; retry later")
                return ExportTraceServiceResponse()

        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ttft-otlp-grpc"),
            options=[("grpc.max_receive_message_length", self.max_body_bytes)],
        )
        svc.add_TraceServiceServicer_to_server(_Servicer(), server)
        bound = server.add_insecure_port(f"{self.host}:{self.grpc_port}")
        if not bound:
            raise OSError(f"cannot bind OTLP/gRPC on {self.host}:{self.grpc_port}")
        server.start()
        self._grpc_server = server
        self.grpc_address = (self.host, int(bound))

    def _drain(self) -> None:
        while True:
            msg = self._queue.get()
            if msg is None:
                return
            try:
                self.sink(msg)
            except Exception as exc:  # the sink's failure must not stop the receiver
                with self._lock:
                    self.sink_errors += 1
                    self.last_error = f"sink failed: {type(exc).__name__}: {exc}"
                log.warning("OTLP sink failed: %s", exc)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, hand every queued request to the sink, join the threads."""
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=0.5).wait(timeout_s)
            self._grpc_server = None
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._http_thread is not None:
            self._http_thread.join(timeout_s)
            self._http_thread = None
        if self._worker is not None:
            self._queue.put(None)  # blocks only while the sink is draining a full queue
            self._worker.join(timeout_s)
            self._worker = None

    def __enter__(self) -> OTLPReceiver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _make_handler(receiver: OTLPReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse the connection
        server_version = "ttft-otlp-receiver"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr
            log.debug("otlp http: " + format, *args)

        def _reply(self, status: int, body: bytes, ctype: str, close: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str, as_json: bool, close: bool = False) -> None:
            if status != 503:
                receiver.note_rejected(f"HTTP {status}: {message}")
            self._reply(status, _status_body(status, message, as_json), CT_JSON if as_json else CT_PROTOBUF, close)

        def _discard(self, length: int) -> None:
            while length > 0:
                chunk = self.rfile.read(min(length, 1 << 16))
                if not chunk:
                    return
                length -= len(chunk)

        def do_POST(self) -> None:  # noqa: N802
            as_json = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower() == CT_JSON
            if self.path.split("?", 1)[0] != TRACES_PATH:
                self._error(404, f"no such path {self.path!r}; OTLP traces go to {TRACES_PATH}", as_json, close=True)
                return
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self._error(411, "chunked bodies are not accepted; send Content-Length", as_json, close=True)
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
                if length < 0:
                    raise ValueError
            except ValueError:
                self._error(411, "Content-Length is missing or invalid", as_json, close=True)
                return
            if length > receiver.max_body_bytes:
                if length <= 4 * receiver.max_body_bytes:  # read it away so the client sees the 413
                    self._discard(length)
                self._error(413, f"body of {length} bytes is over the {receiver.max_body_bytes}-byte limit", as_json,
                            close=True)
                return
            body = self.rfile.read(length)
            if len(body) < length:
                self._error(400, "body shorter than Content-Length", as_json, close=True)
                return
            try:
                msg, as_json = decode_body(body, self.headers.get("Content-Type", ""),
                                           self.headers.get("Content-Encoding", ""), receiver.max_body_bytes)
            except BodyError as exc:
                self._error(exc.status, exc.message, as_json)
                return
            except Exception as exc:  # never a traceback for a client's body
                self._error(400, f"cannot decode body: {type(exc).__name__}: {exc}"[:200], as_json)
                return
            if not receiver.submit(msg):
                self.send_response(503)
                self.send_header("Retry-After", "1")
                body_503 = _status_body(503, "receiver queue full; retry later", as_json)
                self.send_header("Content-Type", CT_JSON if as_json else CT_PROTOBUF)
                self.send_header("Content-Length", str(len(body_503)))
                self.end_headers()
                self.wfile.write(body_503)
                return
            if as_json:
                self._reply(200, b"{}", CT_JSON)
            else:
                self._reply(200, ExportTraceServiceResponse().SerializeToString(), CT_PROTOBUF)

        def _method_not_allowed(self) -> None:
            self.send_response(405)
            self.send_header("Allow", "POST")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_DELETE = do_PATCH = _method_not_allowed  # noqa: N815

    return Handler
