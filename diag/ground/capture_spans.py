"""The span table of a capture: OTLP JSON lines (``spans.otlp.jsonl``, gzipped or not) read into
one DataFrame, column-wise in bounded chunks.

:func:`read_spans_file` and :func:`parse_span_lines` give a table with :data:`SPAN_COLUMNS`, one
column per known attribute (:data:`KNOWN_ATTRS`) and ``extra`` for the rest; times are Unix ns.
Bad lines become warnings, never exceptions. Pure reads; any thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages

try:  # orjson parses OTLP JSON 2-3x faster than json; optional
    import orjson as _fastjson

    _loads = _fastjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

#: Attribute keys lifted into their own span-table columns (everything else goes to ``extra``).
_KNOWN_ATTRS: tuple[str, ...] = tuple(
    sorted(
        {
            getattr(stages, n)
            for n in dir(stages)
            if (n.startswith(("ATTR_", "GEN_AI_", "VLLM_")) and n != "VLLM_SPAN_REQUEST")
            and isinstance(getattr(stages, n), str)
        }
    )
)
_KNOWN_SET = frozenset(_KNOWN_ATTRS)
#: attribute keys a span table holds as columns of their own (the rest: ``extra``)
KNOWN_ATTRS: frozenset[str] = _KNOWN_SET

SPAN_COLUMNS: tuple[str, ...] = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "service",
    "start_ns",
    "end_ns",
    "status_code",
    "source_file",
)


def _int_value(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        return None
    try:
        return int(v)
    except ValueError:
        return None


def _ns(v: Any) -> int:
    """A 64-bit Unix-ns timestamp from OTLP JSON (a string, or an int from lenient writers)."""
    if isinstance(v, bool):
        raise TypeError("timestamp is a boolean")
    if v is None or v == "":
        return 0
    if isinstance(v, (int, str)):
        n = int(v)
        if not 0 <= n < 2**63:
            raise ValueError("timestamp out of range")
        return n
    raise TypeError("timestamp is not an integer string")


def _any_value(v: Mapping[str, Any]) -> Any:
    """Decode an OTLP JSON AnyValue."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return _int_value(v["intValue"])
    if "doubleValue" in v:
        d = v["doubleValue"]
        return float(d) if isinstance(d, (int, float, str)) and not isinstance(d, bool) else None
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        arr = v["arrayValue"]
        values = arr.get("values") if isinstance(arr, Mapping) else None
        return [_any_value(x) if isinstance(x, Mapping) else None for x in (values or ())]
    if "kvlistValue" in v:
        kvl = v["kvlistValue"]
        values = kvl.get("values") if isinstance(kvl, Mapping) else None
        return {
            str(kv.get("key")): _any_value(kv.get("value") or {})
            for kv in values or ()
            if isinstance(kv, Mapping) and isinstance(kv.get("value") or {}, Mapping)
        }
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


class _SpanColumns:
    """Column-wise accumulation of spans, flushed to small DataFrames to bound memory."""

    CHUNK_ROWS = 131072

    def __init__(self, source_file: str) -> None:
        self.source_file = source_file
        self.frames: list[pd.DataFrame] = []
        self._reset()

    def _reset(self) -> None:
        self.cols: dict[str, list[Any]] = {c: [] for c in SPAN_COLUMNS if c != "source_file"}
        self.attr_cols: dict[str, dict[int, Any]] = {}
        self.extra: dict[int, dict[str, Any]] = {}
        self.n = 0

    def add(self, span: Mapping[str, Any], service: str) -> None:
        """Add one OTLP JSON span; raises TypeError/ValueError (adding nothing) if malformed."""
        if not isinstance(span, Mapping):
            raise TypeError("span is not an object")
        ids = []
        for key in ("traceId", "spanId", "parentSpanId"):
            v = span.get(key) or ""
            if not isinstance(v, str):
                raise TypeError(f"{key} is not a hex string")
            ids.append(v)
        name = span.get("name") or ""
        if not isinstance(name, str):
            raise TypeError("name is not a string")
        kind = span.get("kind") or 0
        if not isinstance(kind, int):
            raise TypeError("kind is not an integer")
        start = _ns(span.get("startTimeUnixNano"))
        end = _ns(span.get("endTimeUnixNano"))
        status = span.get("status") or {}
        code = status.get("code") if isinstance(status, Mapping) else None
        code = code if isinstance(code, int) else 0
        known: list[tuple[str, Any]] = []
        extra: dict[str, Any] = {}
        attrs = span.get("attributes") or []
        if not isinstance(attrs, list):
            raise TypeError("attributes is not a list")
        for kv in attrs:
            if not isinstance(kv, Mapping) or not isinstance(kv.get("key"), str):
                raise TypeError("attribute without a string key")
            key = kv["key"]
            value = kv.get("value") or {}
            if not isinstance(value, Mapping):
                raise TypeError(f"attribute {key}: value is not an AnyValue object")
            val = _any_value(value)
            if key in _KNOWN_SET:
                known.append((key, val))
            else:
                extra[key] = val
        i = self.n
        c = self.cols
        c["trace_id"].append(ids[0])
        c["span_id"].append(ids[1])
        c["parent_span_id"].append(ids[2])
        c["name"].append(name)
        c["kind"].append(kind)
        c["service"].append(service)
        c["start_ns"].append(start)
        c["end_ns"].append(end)
        c["status_code"].append(code)
        for key, val in known:
            col = self.attr_cols.get(key)
            if col is None:
                col = self.attr_cols[key] = {}
            col[i] = val
        if extra:
            self.extra[i] = extra
        self.n += 1
        if self.n >= self.CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.n:
            return
        df = pd.DataFrame(self.cols)
        for key, values in self.attr_cols.items():
            df[key] = _object_column(self.n, values)
        if self.extra:
            df["extra"] = _object_column(self.n, self.extra)
        for col in ("trace_id", "span_id", "parent_span_id"):
            df[col] = df[col].astype("string[pyarrow]")
        for col in ("name", "service"):
            df[col] = df[col].astype("category")
        df["source_file"] = self.source_file
        self.frames.append(df)
        self._reset()


def _service_name(resource: Any) -> str:
    if not isinstance(resource, Mapping):
        return ""
    for kv in resource.get("attributes") or ():
        if isinstance(kv, Mapping) and kv.get("key") == "service.name" and isinstance(kv.get("value"), Mapping):
            return str(_any_value(kv["value"]))
    return ""


def _object_column(n: int, values: dict[int, Any]) -> np.ndarray:
    """An object column of length n with None where a row has no value."""
    col = np.full(n, None, dtype=object)
    for i, v in values.items():
        col[i] = v
    return col


def open_spans(path: Path) -> Any:
    """Open a spans file for binary reading, gunzipping ``*.gz`` transparently."""
    if path.suffix == ".gz":
        import gzip

        return gzip.open(path, "rb")
    return open(path, "rb")


def _iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open_spans(path) as fh:
        for lineno, line in enumerate(fh, 1):
            yield lineno, line


def read_spans_file(path: Path, warnings: list[str]) -> pd.DataFrame:
    """Read one OTLP JSON lines file into a span table; bad lines become warnings.

    Tries the vectorised Arrow reader first; on any surprise it reads line by line, which
    names each bad line.
    """
    from diag.ground.capture_arrow import read_spans_arrow

    if path.stat().st_size > 0:
        fast = read_spans_arrow(path, _KNOWN_SET, SPAN_COLUMNS)
        if fast is not None:
            return fast
    bad = 0

    def on_bad(lineno: int, why: str) -> None:
        nonlocal bad
        bad += 1
        if bad <= 5:
            warnings.append(f"{path}:{lineno}: {why}")

    df = parse_span_lines(_iter_lines(path), str(path), on_bad)
    if bad > 5:
        warnings.append(f"{path}: {bad} bad lines in all (first 5 shown)")
    return df if df is not None else empty_span_table()


def parse_span_lines(lines: Iterable[tuple[int, bytes]], source: str,
                     on_bad: Callable[[int, str], None]) -> pd.DataFrame | None:
    """OTLP JSON export lines (line number, bytes) -> a span table, or None when no span.

    A bad line is reported through ``on_bad(lineno, why)`` and skipped; the rest still loads.
    Used by the file loader's careful path and by the TUI's incremental tail.
    """
    acc = _SpanColumns(source)
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            doc = _loads(line)
        except ValueError:
            on_bad(lineno, ("truncated last line" if not line.endswith(b"\n") else "not valid JSON") + "; line skipped")
            continue
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            on_bad(lineno, "not an OTLP ExportTraceServiceRequest; line skipped")
            continue
        try:
            for rs in doc["resourceSpans"] or ():
                service = _service_name(rs.get("resource"))
                for ss in rs.get("scopeSpans") or ():
                    for span in ss.get("spans") or ():
                        acc.add(span, service)
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            on_bad(lineno, f"malformed span ({type(exc).__name__}: {exc}); rest of line skipped")
    acc.flush()
    if not acc.frames:
        return None
    df = acc.frames[0] if len(acc.frames) == 1 else pd.concat(acc.frames, ignore_index=True)
    for col in ("name", "service"):
        df[col] = df[col].astype("category")
    return df


def empty_span_table() -> pd.DataFrame:
    df = pd.DataFrame({c: pd.Series(dtype=object) for c in SPAN_COLUMNS})
    df["start_ns"] = df["start_ns"].astype("int64")
    df["end_ns"] = df["end_ns"].astype("int64")
    return df


def dedupe_spans(df: pd.DataFrame, warnings: list[str], where: str) -> pd.DataFrame:
    if df.empty:
        return df
    dup = df.duplicated(subset=["trace_id", "span_id"], keep="first")
    n = int(dup.sum())
    if n:
        warnings.append(f"{where}: {n} duplicate span ids (same trace and span id); kept the first of each")
        df = df.loc[~dup].reset_index(drop=True)
    bad_time = df["end_ns"] < df["start_ns"]
    if bool(bad_time.any()):
        warnings.append(f"{where}: {int(bad_time.sum())} spans end before they start; dropped")
        df = df.loc[~bad_time].reset_index(drop=True)
    return df
