"""The capture format: one directory holding everything one run observed, in open formats.

::

    CAPTURE/
      meta.json           tool version, what ran, TTFT boundary, clock sources, faults injected
      spans.otlp.jsonl    OTLP JSON, one ExportTraceServiceRequest per line (Collector file
                          exporter format: hex ids, 64-bit ints as strings, lowerCamelCase)
      series/*.parquet    long-format time series (diag.stages.SERIES_COLUMNS); *.csv on read
      profile/            py-spy raw profile and its per-stage summary

Front door: :class:`CaptureWriter` to write, :func:`load_capture` to read (returns a
:class:`Capture` with its span table and series; request and step tables are built by
:mod:`diag.tables`). Errors that stop a load raise :class:`CaptureError` with a one-line
message naming the file (and line); recoverable problems become ``Capture.warnings``.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag import stages

try:  # orjson parses OTLP JSON 2-3x faster than json; optional
    import orjson as _fastjson

    _loads = _fastjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

SPANS_FILE = "spans.otlp.jsonl"
#: the same, gzip-compressed (samples and archived captures); read transparently
SPANS_FILE_GZ = SPANS_FILE + ".gz"
META_FILE = "meta.json"
SERIES_DIR = "series"
PROFILE_DIR = "profile"
FORMAT_VERSION = 1


class CaptureError(Exception):
    """A capture that cannot be read or written; the message is one line naming the file."""


def tool_version() -> str:
    try:
        from importlib.metadata import version

        return version("ttft-diag")
    except Exception:
        return "0+unknown"


def base_meta() -> dict[str, Any]:
    """Meta fields every capture carries."""
    return {
        "format": "ttft-diag capture",
        "format_version": FORMAT_VERSION,
        "tool_version": tool_version(),
        "created_unix_s": time.time(),
        "host": platform.node(),
        "clock_sources": {
            "span_timestamps": "time.time_ns() (CLOCK_REALTIME, Unix epoch ns) per process",
            "series_timestamps": "time.time() (Unix epoch s)",
        },
        "ttft_boundary": {
            "server": stages.SERVER_BOUNDARY.to_dict(),
            "client": stages.CLIENT_BOUNDARY.to_dict(),
        },
        "faults_injected": {},
    }


class CaptureWriter:
    """Writes a capture directory. Thread-safe: collectors on several threads may share one.

    ``append_span_request`` appends one OTLP JSON line (flushed, so a crash loses at most the
    line being written); ``write_series`` replaces ``series/<source>.parquet``; meta.json is
    rewritten on every ``update_meta`` and on ``close``.
    """

    def __init__(self, path: str | os.PathLike[str], meta: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CaptureError(f"{self.path}: cannot create capture directory: {exc.strerror}") from exc
        self._lock = threading.Lock()
        self._meta: dict[str, Any] = base_meta()
        if meta:
            self._meta.update(meta)
        self._spans_fh = open(self.path / SPANS_FILE, "a", encoding="utf-8")
        self.span_lines = 0
        self._write_meta()

    @property
    def meta(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._meta)

    def _write_meta(self) -> None:
        tmp = self.path / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(self._meta, indent=2, default=str, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path / META_FILE)

    def update_meta(self, **fields: Any) -> None:
        """Merge fields into meta.json; dict values are merged one level deep."""
        with self._lock:
            for key, value in fields.items():
                if isinstance(value, Mapping) and isinstance(self._meta.get(key), dict):
                    self._meta[key].update(value)
                else:
                    self._meta[key] = value
            self._write_meta()

    def append_span_request(self, message: Any) -> None:
        """Append one ExportTraceServiceRequest (proto message or OTLP JSON dict) as a line."""
        from diag.otlp_json import request_to_dict

        doc = message if isinstance(message, Mapping) else request_to_dict(message)
        line = json.dumps(doc, separators=(",", ":"))
        with self._lock:
            if self._spans_fh.closed:
                return
            self._spans_fh.write(line + "\n")
            self._spans_fh.flush()
            self.span_lines += 1

    def append_span_lines(self, lines: Iterable[str]) -> None:
        """Append already-encoded OTLP JSON lines (used by bulk writers and benchmarks)."""
        with self._lock:
            for line in lines:
                self._spans_fh.write(line.rstrip("\n") + "\n")
                self.span_lines += 1
            self._spans_fh.flush()

    def write_series(self, source: str, frame: pd.DataFrame) -> Path:
        """Write a long-format series table as ``series/<source>.parquet`` (replacing it)."""
        missing = [c for c in stages.SERIES_COLUMNS if c not in frame.columns]
        if missing:
            raise CaptureError(f"series {source!r}: missing columns {missing}")
        out_dir = self.path / SERIES_DIR
        out_dir.mkdir(exist_ok=True)
        out = out_dir / f"{source}.parquet"
        frame = frame.loc[:, list(stages.SERIES_COLUMNS)].copy()
        frame["ts_s"] = frame["ts_s"].astype("float64")
        frame["value"] = pd.to_numeric(frame["value"], errors="coerce").astype("float64")
        for col in ("source", "series", "entity"):
            frame[col] = frame[col].astype(str)
        with self._lock:
            frame.to_parquet(out, index=False)
        return out

    def append_series(self, source: str, frame: pd.DataFrame) -> Path:
        """Add rows to ``series/<source>.parquet``, keeping what an earlier run wrote there
        (several probe runs or phases sharing one capture)."""
        existing = self.path / SERIES_DIR / f"{source}.parquet"
        if existing.exists():
            with self._lock:
                old = pd.read_parquet(existing)
            frame = pd.concat([old, frame.loc[:, list(stages.SERIES_COLUMNS)]], ignore_index=True)
        return self.write_series(source, frame)

    def profile_dir(self) -> Path:
        p = self.path / PROFILE_DIR
        p.mkdir(exist_ok=True)
        return p

    def close(self) -> None:
        with self._lock:
            if not self._spans_fh.closed:
                self._spans_fh.close()
            self._write_meta()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- reading --------------------------------------------------------------------------------

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


@dataclass
class Capture:
    """A loaded capture. ``spans`` has SPAN_COLUMNS, one column per known attribute, and
    ``extra`` (dict of other attributes or None). ``series`` has SERIES_COLUMNS."""

    path: Path
    meta: dict[str, Any]
    spans: pd.DataFrame
    series: pd.DataFrame
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name


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
    from diag.capture_arrow import read_spans_arrow

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


def _dedupe_spans(df: pd.DataFrame, warnings: list[str], where: str) -> pd.DataFrame:
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


def read_series_dir(path: Path, warnings: list[str]) -> pd.DataFrame:
    """Concatenate every series/*.parquet and *.csv into one long table."""
    frames = []
    sdir = path / SERIES_DIR
    if sdir.is_dir():
        for f in sorted(sdir.iterdir()):
            try:
                if f.suffix == ".parquet":
                    frames.append(pd.read_parquet(f))
                elif f.suffix == ".csv":
                    frames.append(pd.read_csv(f))
                else:
                    continue
            except Exception as exc:
                warnings.append(f"{f}: unreadable series file ({type(exc).__name__}); skipped")
                continue
            missing = [c for c in stages.SERIES_COLUMNS if c not in frames[-1].columns]
            if missing:
                warnings.append(f"{f}: series file lacks columns {missing}; skipped")
                frames.pop()
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("ts_s", "value") else object) for c in stages.SERIES_COLUMNS})
    df = pd.concat([f.loc[:, list(stages.SERIES_COLUMNS)] for f in frames], ignore_index=True)
    df["ts_s"] = pd.to_numeric(df["ts_s"], errors="coerce")
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    return df.sort_values("ts_s", kind="stable").reset_index(drop=True)


def load_capture(path: str | os.PathLike[str]) -> Capture:
    """Load a capture directory (or a bare ``.jsonl`` file of OTLP JSON lines).

    Raises CaptureError (one line, naming the path) when nothing usable is there.
    """
    p = Path(path)
    warnings: list[str] = []
    if not p.exists():
        raise CaptureError(f"{p}: no such capture (expected a directory with {SPANS_FILE} or a .jsonl file)")
    if p.is_file():
        from diag.capture_files import not_a_capture

        why = not_a_capture(p)
        if why:
            raise CaptureError(why)
        spans_files = [p]
        root = p.parent
        meta: dict[str, Any] = {}
    else:
        root = p
        spans_files = [f for f in (p / SPANS_FILE, p / SPANS_FILE_GZ) if f.exists()]
        meta = {}
        meta_path = p / META_FILE
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                if not isinstance(meta, dict):
                    raise ValueError("not an object")
            except (ValueError, UnicodeDecodeError) as exc:
                warnings.append(f"{meta_path}: unreadable meta.json ({exc}); ignored")
                meta = {}
        profile_summary = p / PROFILE_DIR / "pyspy.json"
        if profile_summary.exists():
            try:
                meta["pyspy"] = json.loads(profile_summary.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                warnings.append(f"{profile_summary}: unreadable py-spy summary ({exc}); ignored")
        has_series = (p / SERIES_DIR).is_dir()
        if not spans_files and not meta and not has_series:
            raise CaptureError(f"{p}: not a capture (no {SPANS_FILE}, {META_FILE} or {SERIES_DIR}/)")
        from diag.capture_files import unread_warning

        unread = unread_warning(p, meta)
        if unread:
            warnings.append(unread)
    span_frames = []
    for f in spans_files:
        try:
            span_frames.append(read_spans_file(f, warnings))
        except EOFError:
            warnings.append(f"{f}: compressed file is truncated; spans after the cut are lost")
        except OSError as exc:
            raise CaptureError(f"{f}: cannot read: {exc.strerror or exc}") from exc
    spans_df = (
        pd.concat(span_frames, ignore_index=True) if len(span_frames) > 1 else (span_frames[0] if span_frames else empty_span_table())
    )
    spans_df = _dedupe_spans(spans_df, warnings, str(spans_files[0] if spans_files else p))
    series = read_series_dir(root, warnings) if p.is_dir() else read_series_dir(Path("/nonexistent"), warnings)
    if spans_df.empty and series.empty:
        warnings.append(f"{p}: capture holds no spans and no series")
    return Capture(path=p, meta=meta, spans=spans_df, series=series, warnings=warnings)


def attribute(spans: pd.DataFrame, key: str) -> pd.Series:
    """A span attribute as a column (all-None when no span carries it)."""
    if key in spans.columns:
        return spans[key]
    if "extra" in spans.columns:
        return spans["extra"].map(lambda d: d.get(key) if isinstance(d, dict) else None)
    return pd.Series([None] * len(spans), index=spans.index, dtype=object)
