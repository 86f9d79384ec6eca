"""OTLP spans into the Collector's ClickHouse table, as its ``clickhouseexporter`` writes them.

:class:`OtelTracesWriter` takes ExportTraceServiceRequests (protobuf messages from the OTLP
receiver, or OTLP JSON documents from a capture's ``spans.otlp.jsonl``), turns each span into
the exporter's row (:func:`diag.ground.otel_traces.rows_from_request`) and inserts them in batches of
``batch_rows`` (JSONEachRow). It makes the table with the exporter's DDL when missing, as the
exporter does on start. :func:`load_capture_spans` loads a capture's span file through it.

Thread-safety: ``append_span_request`` may be called from one thread at a time (the receiver's
sink thread); memory holds at most one batch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from diag.ground.capture import SPANS_FILE, SPANS_FILE_GZ, CaptureError
from diag.ground.capture_spans import open_spans
from diag.ground.clickhouse import ClickHouseError, Connection
from diag.ground.otel_traces import DEFAULT_TABLE, check_identifier, rows_from_request, traces_ddl

try:  # the capture loader's fast parser, when present
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads


class OtelTracesWriter:
    """Writes OTLP export requests into ``table`` of ``conn``'s database, the exporter's way."""

    def __init__(self, conn: Connection, table: str = DEFAULT_TABLE, create: bool = True,
                 resource_overrides: Mapping[str, str] | None = None, batch_rows: int = 20_000) -> None:
        self.conn = conn
        self.table = f"{check_identifier(conn.target.database, 'database')}.{check_identifier(table)}"
        self.resource_overrides = dict(resource_overrides or {})
        self.batch_rows = batch_rows
        self.rows = 0  # spans inserted so far
        self._pending: list[str] = []
        if create:
            conn.command(traces_ddl(table, conn.target.database))

    def append_span_request(self, message: Any) -> None:
        """Add one ExportTraceServiceRequest (a protobuf message or an OTLP JSON dict)."""
        if not isinstance(message, Mapping):
            from diag.ground.otlp_json import request_to_dict

            message = request_to_dict(message)
        for row in rows_from_request(message, self.resource_overrides):
            self._pending.append(json.dumps(row, separators=(",", ":"), ensure_ascii=False))
        if len(self._pending) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Insert what is pending (one INSERT)."""
        if self._pending:
            batch, self._pending = self._pending, []
            self.conn.insert_json_rows(self.table, batch)
            self.rows += len(batch)

    def close(self) -> None:
        self.flush()


def _span_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = [f for f in (path / SPANS_FILE, path / SPANS_FILE_GZ) if f.exists()]
    if not files:
        raise CaptureError(f"{path}: no {SPANS_FILE} to load")
    return files


def load_capture_spans(path: str | os.PathLike[str], writer: OtelTracesWriter) -> tuple[int, list[str]]:
    """Every span of a capture (its ``spans.otlp.jsonl[.gz]``, or a bare ``.jsonl`` file) into
    ``writer``; returns (spans written, warnings: bad lines are skipped and named, at most 5).
    Raises CaptureError when there is no span file, ClickHouseError when an insert fails."""
    before = writer.rows + len(writer._pending)
    warnings: list[str] = []
    bad = 0
    for f in _span_files(Path(path)):
        try:
            with open_spans(f) as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        doc = _loads(line)
                        if not isinstance(doc, dict) or "resourceSpans" not in doc:
                            raise ValueError("not an OTLP ExportTraceServiceRequest")
                        writer.append_span_request(doc)
                    except (ValueError, TypeError, KeyError, AttributeError) as exc:
                        bad += 1
                        if bad <= 5:
                            warnings.append(f"{f}:{lineno}: {' '.join(str(exc).split())[:120]}; line skipped")
        except OSError as exc:
            raise CaptureError(f"{f}: cannot read: {exc.strerror or exc}") from None
    writer.flush()
    if bad > 5:
        warnings.append(f"{path}: {bad} bad lines in all (first 5 shown)")
    return writer.rows - before, warnings


def load_captures(conn: Connection, paths: Iterable[str | os.PathLike[str]], table: str = DEFAULT_TABLE,
                  resource_overrides: Mapping[str, str] | None = None) -> tuple[int, list[str]]:
    """:func:`load_capture_spans` for several captures into one table; (spans, warnings)."""
    writer = OtelTracesWriter(conn, table, resource_overrides=resource_overrides)
    total, warnings = 0, []
    for p in paths:
        n, w = load_capture_spans(p, writer)
        total += n
        warnings += w
    writer.close()
    return total, warnings


__all__ = ["ClickHouseError", "OtelTracesWriter", "load_capture_spans", "load_captures"]
