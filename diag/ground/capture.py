"""The capture format: one directory holding everything one run observed, in open formats.

::

    CAPTURE/
      meta.json           tool version, what ran, TTFT boundary, clock sources, faults injected
      spans.otlp.jsonl    OTLP JSON, one ExportTraceServiceRequest per line (Collector file
                          exporter format: hex ids, 64-bit ints as strings, lowerCamelCase)
      series/*.parquet    long-format time series (diag.ground.stages.SERIES_COLUMNS); *.csv on read
      profile/            py-spy raw profile and its per-stage summary

Front door: :class:`CaptureWriter` to write, :func:`load_capture` to read (returns a
:class:`Capture` with its span table (read by :mod:`diag.ground.capture_spans`) and series; request and
step tables are built by :mod:`diag.ground.tables`). Errors that stop a load raise :class:`CaptureError` with a one-line
message naming the file (and line); recoverable problems become ``Capture.warnings``.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from diag.ground import stages
from diag.ground.capture_spans import dedupe_spans, empty_span_table, read_spans_file

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
        from diag.ground.otlp_json import request_to_dict

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
        from diag.ground.capture_files import not_a_capture

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
        from diag.ground.capture_files import unread_warning

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
    spans_df = dedupe_spans(spans_df, warnings, str(spans_files[0] if spans_files else p))
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
