"""``ttft receive -o CAPTURE``: an OTLP trace receiver that writes what it gets into a capture
(and, with ``--to-clickhouse URL``, into the Collector's ClickHouse trace table)."""

from __future__ import annotations

import argparse
import sys
import threading
import time

from typing import TYPE_CHECKING

from collectors.otlp_receiver import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, DEFAULT_MAX_BODY_BYTES, OTLPReceiver

if TYPE_CHECKING:
    from diag.ground.capture import CaptureWriter
    from diag.ground.clickhouse_load import OtelTracesWriter


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "receive",
        help="receive OTLP traces (e.g. vLLM's llm_request spans) into a capture",
        description="Listen for OTLP traces (HTTP /v1/traces with protobuf or JSON bodies, and gRPC) "
        "and append every export request to CAPTURE/spans.otlp.jsonl. Runs until Ctrl-C or --duration.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=DEFAULT_HTTP_PORT, help="OTLP/HTTP port (default 4318; 0 = any free port)")
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT,
                   help="OTLP/gRPC port (default 4317; 0 = any free port)")
    p.add_argument("--no-grpc", action="store_true", help="do not start the OTLP/gRPC server")
    p.add_argument("-o", "--output", metavar="CAPTURE", help="capture directory to write")
    p.add_argument("--to-clickhouse", metavar="URL", help="also (or instead) write every span into ClickHouse as the "
                   "OpenTelemetry Collector's clickhouseexporter does (http://host:8123[/db] or chdb:PATH)")
    p.add_argument("--table", default="otel_traces", metavar="NAME", help="with --to-clickhouse: the trace table "
                   "(default otel_traces)")
    p.add_argument("-d", "--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20,
                   help="largest accepted request body in MiB, after gunzip (default 16)")
    p.add_argument("--queue", type=int, default=1024, help="export requests buffered before answering 503")
    return p


def run(args: argparse.Namespace, stop_event: threading.Event | None = None) -> int:
    """Serve until SIGINT/SIGTERM (main thread), ``--duration`` or ``stop_event`` (tests); 0 on a
    clean stop. Either signal ends it as Ctrl-C does: what was received is flushed and the store
    closed (a Collector of one under a process manager gets SIGTERM)."""
    from diag.ground.capture import CaptureWriter
    from diag.cli import UsageError, stop_on_signals

    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be > 0")
    if not args.output and not args.to_clickhouse:
        raise UsageError("give -o CAPTURE and/or --to-clickhouse URL")
    store = open_store(args.to_clickhouse, args.table) if args.to_clickhouse else None
    writer = CaptureWriter(args.output, meta={"command": "receive"}) if args.output else None
    sinks = [s.append_span_request for s in (writer, store) if s is not None]

    def sink(message: object) -> None:
        for one in sinks:
            one(message)

    receiver = OTLPReceiver(
        sink,
        host=args.host,
        port=args.port,
        grpc_port=None if args.no_grpc else args.grpc_port,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_queue_requests=args.queue,
    )
    try:
        host, port = receiver.start()
    except OSError as exc:
        receiver.stop()
        _close(writer, store)
        raise UsageError(f"cannot listen on {args.host}: {exc.strerror or exc}") from None
    where = f"OTLP/HTTP on http://{host}:{port}/v1/traces"
    if receiver.grpc_address:
        where += f", OTLP/gRPC on {receiver.grpc_address[0]}:{receiver.grpc_address[1]}"
    dest = " and ".join(x for x in (args.output, store and f"{store.conn.target.redacted()} table {store.table}") if x)
    print(f"ttft receive: {where} -> {dest} (Ctrl-C to stop)", flush=True)
    stop = stop_event or threading.Event()
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        with stop_on_signals(stop):
            while not stop.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                stop.wait(0.5 if left is None else min(0.5, left))
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
        stats = receiver.stats()
        if writer is not None:
            writer.update_meta(otlp_receiver={**stats, "http": f"{host}:{port}",
                                              "grpc": "%s:%d" % receiver.grpc_address if receiver.grpc_address else None})
        _close(writer, store)
    print(f"ttft receive: {stats['received_spans']} spans in {stats['received_requests']} requests, "
          f"{stats['rejected']} rejected, {stats['dropped']} spans dropped (queue full)"
          + (f", {stats['sink_errors']} write errors" if stats["sink_errors"] else ""), file=sys.stderr)
    return 0


def open_store(url: str, table: str) -> OtelTracesWriter:
    """The ClickHouse sink: each export request inserted as it comes (the SDK batches already)."""
    from diag.cli import UsageError
    from diag.ground.clickhouse import ClickHouseError, connect
    from diag.ground.clickhouse_load import OtelTracesWriter

    try:
        return OtelTracesWriter(connect(url), table, batch_rows=1)
    except (ClickHouseError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _close(writer: CaptureWriter | None, store: OtelTracesWriter | None) -> None:
    if writer is not None:
        writer.close()
    if store is not None:
        try:
            store.close()
        finally:
            store.conn.close()
