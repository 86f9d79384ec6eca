"""Data sources for the TUI behind one small protocol: ``poll() -> Snapshot``.

* :class:`CaptureSource` reads a recorded capture once and moves an analysis window over it
  (the time cursor of ``ttft view``).
* :class:`LiveSource` re-reads a capture directory that collectors are writing: it tails
  ``spans.otlp.jsonl`` incrementally (a byte offset; only new complete lines are parsed),
  re-reads ``series/*`` files whose mtime changed, keeps a bounded retention, and asks its
  :class:`Monitor` objects whether the processes/threads feeding it are still alive.

Threading: ``poll()`` does file I/O and pandas work and runs on a worker thread, never on
the UI thread; it is not re-entrant (the app runs at most one frame at a time). ``move``,
``zoom``, ``reset_window``, ``add_note`` and ``status`` may be called from any thread (a
lock guards the cursor). Times: Unix epoch nanoseconds (``_ns``) and seconds (``_s``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

# The feed types live with the collectors (floor 2); named here too for the TUI's callers.
from collectors.feeds import CallableMonitor, Monitor, PhaseInfo, ProcessMonitor  # noqa: F401
from diag.ground import stages
from diag.analysis import expand_capture_paths, load_captures, recorded_slo
from diag.ground.capture import (
    META_FILE,
    SERIES_DIR,
    SPANS_FILE,
    SPANS_FILE_GZ,
    Capture,
    CaptureError,
)
from diag.ground.capture_spans import empty_span_table
from diag.ground.tables import Tables, build_tables
from tui.outage import ServerState, server_state

NS = 1_000_000_000


@dataclass
class Snapshot:
    """What one poll saw: the tables, the analysis window and the health of the feeds."""

    tables: Tables
    #: the analysis window [start, end) in Unix ns
    window_ns: tuple[int, int]
    #: first and last timestamp the source holds, Unix ns (equal when empty)
    extent_ns: tuple[int, int]
    #: increases whenever the data (not the window) changed
    generation: int
    live: bool
    title: str
    #: one-line notes (a collector that is missing, a warning from the capture)
    notes: list[str] = field(default_factory=list)
    #: one-line messages of feeds that died (shown in red)
    errors: list[str] = field(default_factory=list)
    #: the demo's current phase, if any
    phase: str | None = None
    #: True when the window covers the whole capture (``view`` before the cursor moves)
    whole: bool = False
    #: SLOs the rules should hold this window to (the demo's phase), overriding the app's
    slo: dict[str, float] | None = None
    #: how the header names the window (None: "last N s" live, offsets in a capture)
    window_label: str | None = None


class Source(Protocol):
    """What the app needs from a data source."""

    title: str
    live: bool

    def poll(self) -> Snapshot:
        """Read what is new and return the current snapshot (worker thread only)."""
        ...

    def move(self, steps: int) -> bool:
        """Move the analysis window by ``steps`` half-widths; False if this source can't."""
        ...

    def zoom(self, factor: float) -> bool:
        """Multiply the window width by ``factor``; False if this source can't."""
        ...

    def reset_window(self) -> None:
        """Back to the default window (the whole capture, or the live tail)."""
        ...

    def close(self) -> None:
        ...


def _extent(tables: Tables) -> tuple[int, int]:
    """First and last timestamp (Unix ns) over requests, steps and series."""
    lo: list[float] = []
    hi: list[float] = []
    req = tables.requests
    if len(req) and "start_ns" in req.columns:
        s = pd.to_numeric(req["start_ns"], errors="coerce").dropna()
        if len(s):
            lo.append(float(s.min()))
            hi.append(float(s.max()))
    st = tables.steps
    if len(st) and "start_ns" in st.columns:
        lo.append(float(st["start_ns"].min()))
        hi.append(float(st["end_ns"].max()))
    se = tables.series
    if len(se):
        ts = pd.to_numeric(se["ts_s"], errors="coerce").dropna()
        if len(ts):
            lo.append(float(ts.min()) * NS)
            hi.append(float(ts.max()) * NS)
    if not lo:
        now = time.time_ns()
        return now, now
    # end one µs past the last timestamp: start_ns columns are often float64 (NaN-able), whose
    # spacing at today's epoch is 256 ns, so "+ 1 ns" rounded back onto the last request
    return int(min(lo)), int(max(hi)) + 1000


def default_window_s(extent_ns: tuple[int, int]) -> float:
    """The window width the cursor uses when it leaves the whole-capture view: a sixth of
    the capture, at least 1 s (seconds)."""
    span_s = (extent_ns[1] - extent_ns[0]) / NS
    return max(1.0, span_s / 6.0)


class CaptureSource:
    """One recorded capture, or several joined by trace id (``client server-0``), with a time
    cursor. They are loaded on the first ``poll`` (a worker thread), so the UI is up before a
    large capture finishes loading, and joined as ``ttft analyze`` joins them
    (:func:`diag.analysis.load_captures`, :func:`diag.ground.tables.build_tables`).

    ``slo`` (seconds by ``ttft_p99``-style key): what the rules hold the run to; None takes the
    SLO the capture records, as ``ttft analyze`` does (:func:`diag.analysis.recorded_slo`)."""

    live = False

    def __init__(self, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                 window_s: float | None = None, tables: Tables | None = None,
                 slo: dict[str, float] | None = None) -> None:
        raw = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        if not raw:
            raise CaptureError("no capture given")
        self.paths = [Path(p) for p in raw]
        self.path = self.paths[0]
        self.title = "ttft view " + " ".join(str(p) for p in self.paths)
        self._tables = tables
        self._slo = slo
        self._window_s = window_s
        self._lock = threading.Lock()
        self._end_ns: int | None = None  # window end (cursor); None = not yet placed
        self._whole = window_s is None
        self._extent: tuple[int, int] | None = None

    def _load(self) -> Tables:
        if self._tables is None:
            caps = load_captures(list(self.paths))
            self._tables = build_tables(caps)
            if self._slo is None:
                self._slo = recorded_slo(caps)
            self._extent = _extent(self._tables)
        elif self._extent is None:
            self._extent = _extent(self._tables)
        return self._tables

    def poll(self) -> Snapshot:
        tables = self._load()
        assert self._extent is not None
        lo, hi = self._extent
        with self._lock:
            if self._whole:
                window = (lo, hi)
            else:
                width = int((self._window_s or default_window_s(self._extent)) * NS)
                if self._end_ns is None:
                    self._end_ns = min(hi, lo + width)  # start at the beginning of the capture
                end = self._end_ns
                window = (end - width, end)
        notes = list(tables.warnings[:3])
        return Snapshot(tables, window, (lo, hi), 1, False, self.title, notes=notes, whole=self._whole,
                        slo=self._slo)

    def move(self, steps: int) -> bool:
        with self._lock:
            if self._extent is None:
                return False
            lo, hi = self._extent
            if self._window_s is None:
                self._window_s = default_window_s(self._extent)
            width = int(self._window_s * NS)
            if self._whole:
                self._whole = False
                # from the whole capture: left shows the last window, right the first
                self._end_ns = hi if steps < 0 else min(hi, lo + width)
                return True
            end = (self._end_ns or hi) + steps * width // 2
            self._end_ns = int(min(max(end, lo + min(width, hi - lo)), hi))
            return True

    def zoom(self, factor: float) -> bool:
        with self._lock:
            if self._extent is None:
                return False
            lo, hi = self._extent
            span_s = max((hi - lo) / NS, 0.001)
            if self._whole:
                self._whole = False
                self._window_s = default_window_s(self._extent)
                self._end_ns = hi
                return True
            w = (self._window_s or default_window_s(self._extent)) * factor
            self._window_s = float(min(max(w, 0.1), span_s))
            return True

    def reset_window(self) -> None:
        with self._lock:
            self._whole = True

    def close(self) -> None:
        return None


class SpanTail:
    """Incremental reader of a growing OTLP JSON lines file: keeps a byte offset and parses
    only complete new lines. A file that shrank (rotated, rewritten) is re-read from 0.
    Not thread-safe: one reader (the frame worker)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines_read = 0
        self.bad_lines = 0
        self.last_error = ""

    def read_new(self) -> pd.DataFrame | None:
        """New spans as a span table, or None when nothing new arrived."""
        from diag.ground.capture_spans import parse_span_lines  # the loader's own line parser

        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        if size < self.offset:
            self.offset = 0
        if size == self.offset:
            return None
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read(size - self.offset)
        cut = chunk.rfind(b"\n")
        if cut < 0:
            return None  # a partial line: wait for its end
        chunk = chunk[: cut + 1]
        self.offset += len(chunk)
        first = self.lines_read
        lines = [ln for ln in chunk.splitlines() if ln.strip()]
        self.lines_read += len(lines)

        def on_bad(lineno: int, why: str) -> None:
            self.bad_lines += 1
            self.last_error = f"{self.path}: line {first + lineno}: {why}"

        # the chunk ends at a newline, so every line here is complete
        return parse_span_lines(((i, ln + b"\n") for i, ln in enumerate(lines, 1)), str(self.path), on_bad)


class LiveSource:
    """A capture directory being written by collectors (or by the engine in another process).

    The window is the last ``window_s`` seconds of wall-clock time, so a feed that stops
    shows up as an emptying window. Spans older than ``retention_s`` are dropped to bound
    memory and frame time. ``monitors`` report dead feeds; ``phase_fn`` names the demo's
    current phase (called on the worker thread; must be cheap and thread-safe): a label, or a
    :class:`PhaseInfo` whose start clips the window to the phase and whose SLOs go to the rules.
    With ``follow_outages`` (``ttft watch``) the window starts where the probe's requests began
    to fail while the server is not answering, and at the first answered request once it is
    back (:mod:`tui.outage`), so the verdict follows what the probe sees now; the screen says
    the server is not answering.
    """

    live = True

    def __init__(self, path: str | os.PathLike[str], window_s: float = 60.0, retention_s: float = 900.0,
                 monitors: list[Monitor] | None = None,
                 phase_fn: Callable[[], str | PhaseInfo | None] | None = None,
                 title: str | None = None, clock_ns: Callable[[], int] = time.time_ns,
                 follow_outages: bool = False) -> None:
        self.path = Path(path)
        self.title = title or f"ttft watch {self.path}"
        self.window_s = float(window_s)
        self.retention_s = float(retention_s)
        self.monitors: list[Monitor] = list(monitors or [])
        self.phase_fn = phase_fn
        self._clock_ns = clock_ns
        self._tail = SpanTail(self.path / SPANS_FILE)
        self._spans: pd.DataFrame = empty_span_table()
        self._series_files: dict[Path, tuple[float, pd.DataFrame]] = {}
        self._meta: dict[str, object] = {}
        self._meta_mtime = 0.0
        self._tables: Tables | None = None
        self._generation = 0
        self.follow_outages = follow_outages
        self._server = ServerState()
        self._server_gen = -1
        self._notes: list[str] = []
        self._lock = threading.Lock()

    def add_note(self, note: str) -> None:
        """A one-line note shown under the header (any thread)."""
        with self._lock:
            if note not in self._notes:
                self._notes.append(note)

    def add_monitor(self, monitor: Monitor) -> None:
        with self._lock:
            self.monitors.append(monitor)

    def _read_series(self, errors: list[str]) -> bool:
        sdir = self.path / SERIES_DIR
        changed = False
        if not sdir.is_dir():
            return False
        for f in sorted(sdir.iterdir()):
            if f.suffix not in (".parquet", ".csv"):
                continue
            try:
                mtime = f.stat().st_mtime
            except FileNotFoundError:
                continue
            old = self._series_files.get(f)
            if old is not None and old[0] == mtime:
                continue
            try:
                frame = pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_csv(f)
            except Exception:  # a file being replaced right now: try again next frame
                continue
            if any(c not in frame.columns for c in stages.SERIES_COLUMNS):
                errors.append(f"{f}: series file lacks the series columns; ignored")
                continue
            self._series_files[f] = (mtime, frame.loc[:, list(stages.SERIES_COLUMNS)])
            changed = True
        return changed

    def _read_meta(self) -> bool:
        p = self.path / META_FILE
        try:
            mtime = p.stat().st_mtime
        except FileNotFoundError:
            return False
        if mtime == self._meta_mtime:
            return False
        import json

        try:
            meta = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if isinstance(meta, dict):
            self._meta = meta
            self._meta_mtime = mtime
            return True
        return False

    def poll(self) -> Snapshot:
        errors: list[str] = []
        now = self._clock_ns()
        changed = False
        if not self.path.is_dir():
            errors.append(f"capture directory {self.path} is gone")
        else:
            try:
                new = self._tail.read_new()
            except OSError as exc:
                new = None
                errors.append(f"{self._tail.path}: cannot read: {exc.strerror}")
            if new is not None and len(new):
                frames = [f for f in (self._spans, new) if len(f)]
                spans = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
                for col in ("name", "service"):
                    spans[col] = spans[col].astype(str).astype("category")
                self._spans = spans
                changed = True
            changed |= self._read_series(errors)
            changed |= self._read_meta()
        horizon = now - int(self.retention_s * NS)
        if len(self._spans) and int(self._spans["end_ns"].min()) < horizon:
            self._spans = self._spans.loc[self._spans["end_ns"] >= horizon].reset_index(drop=True)
            changed = True
        if changed or self._tables is None:
            series_frames = [fr for _, fr in self._series_files.values() if len(fr)]
            series = (pd.concat(series_frames, ignore_index=True) if series_frames
                      else pd.DataFrame({c: pd.Series(dtype="float64" if c in ("ts_s", "value") else object)
                                         for c in stages.SERIES_COLUMNS}))
            if len(series):
                series["ts_s"] = pd.to_numeric(series["ts_s"], errors="coerce")
                series["value"] = pd.to_numeric(series["value"], errors="coerce")
                series = series.loc[series["ts_s"] >= horizon / NS]
                series = series.sort_values("ts_s", kind="stable").reset_index(drop=True)
            cap = Capture(path=self.path, meta=dict(self._meta), spans=self._spans, series=series)
            self._tables = build_tables(cap)
            self._generation += 1
        with self._lock:
            notes = list(self._notes)
            monitors = list(self.monitors)
        for m in monitors:
            why = m.check()
            if why:
                errors.append(why)
        if self._tail.last_error:
            notes.append(f"{self._tail.bad_lines} unreadable span lines (last: {self._tail.last_error})")
        info: str | PhaseInfo | None = None
        if self.phase_fn is not None:
            try:
                info = self.phase_fn()
            except Exception:  # the phase label is cosmetic
                info = None
        assert self._tables is not None
        lo, hi = now - int(self.window_s * NS), now
        slo = None
        label = None
        if isinstance(info, PhaseInfo):
            if info.end_unix_s is not None:
                hi = min(int(info.end_unix_s * NS), now)
                lo = hi - int(self.window_s * NS)
            if info.start_unix_s is not None:
                lo = max(lo, min(int(info.start_unix_s * NS), hi - 1))
            slo = info.slo
            label = info.window_label
            phase: str | None = info.label
        else:
            phase = info
        if self.follow_outages:
            lo, outage_label = self._follow_server(lo, hi, errors)
            label = outage_label or label
        window = (lo, hi)
        extent = _extent(self._tables)
        return Snapshot(self._tables, window, (min(extent[0], window[0]), max(extent[1], now)), self._generation,
                        True, self.title, notes=notes, errors=errors, phase=phase, slo=slo,
                        window_label=label)

    def _follow_server(self, lo: int, hi: int, errors: list[str]) -> tuple[int, str | None]:
        """The window start and its label after an outage of the watched server (worker thread)."""
        assert self._tables is not None
        if self._server_gen != self._generation:
            self._server = server_state(self._tables.requests)
            self._server_gen = self._generation
        st = self._server
        if st.down_since_ns is not None:
            since = time.strftime("%H:%M:%S", time.localtime(st.down_since_ns / NS))
            kinds = ", ".join(f"{k} x{v}" for k, v in st.kinds.items())
            errors.append(f"server not answering since {since} ({(hi - st.down_since_ns) / NS:.0f} s): {kinds}")
            return max(lo, min(st.down_since_ns, hi - 1)), f"since {since} (not answering)"
        if st.back_since_ns is not None and st.back_since_ns > lo:
            since = time.strftime("%H:%M:%S", time.localtime(st.back_since_ns / NS))
            return min(st.back_since_ns, hi - 1), f"since {since} (answering again)"
        return lo, None

    def move(self, steps: int) -> bool:
        return False  # the live window follows now; use `ttft view` on the capture to scroll

    def zoom(self, factor: float) -> bool:
        self.window_s = float(min(max(self.window_s * factor, 5.0), self.retention_s))
        return True

    def reset_window(self) -> None:
        return None

    def close(self) -> None:
        return None


def open_capture_source(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                        window_s: float | None = None, slo: dict[str, float] | None = None) -> CaptureSource:
    """A CaptureSource over one capture or several (joined by trace id; a directory of captures
    stands for all of them) after checking that each looks like a capture (CaptureError if not)."""
    raw = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    expanded = expand_capture_paths(raw)
    if not expanded:
        raise CaptureError("no capture given")
    for p in expanded:
        if not p.exists():
            raise CaptureError(f"{p}: no such capture (expected a directory with {SPANS_FILE} or a .jsonl file)")
        if p.is_dir() and not any((p / n).exists() for n in (SPANS_FILE, SPANS_FILE_GZ, META_FILE, SERIES_DIR)):
            raise CaptureError(f"{p}: not a capture (no {SPANS_FILE}, {META_FILE} or {SERIES_DIR}/)")
    if window_s is not None and (not np.isfinite(window_s) or window_s <= 0):
        raise CaptureError(f"--window {window_s}: must be a positive number of seconds")
    return CaptureSource(expanded, window_s, slo=slo)
