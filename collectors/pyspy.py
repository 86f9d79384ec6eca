"""py-spy sampler: attach to a serving process for a window, attribute its CPU samples to stages.

py-spy has no Python API; it is driven as a subprocess::

    py-spy record --pid PID --duration S --rate R --format raw -o FILE [--gil] [--idle] [--nonblocking] [--native]

The raw format is one line per distinct stack, ``frame;frame;...;leaf COUNT``, root first, each
frame ``func (file.py:line)`` with a package-relative file name (``vllm/v1/core/sched/
scheduler.py``); ``process PID:"cmdline"`` and ``thread (ID): name`` prefixes may lead; with
``--native`` native frames (``at::_ops::linear::call (libtorch_cpu.so)``) are interleaved.
There are no timestamps: the result is a profile of the window, not a time series.

**Attribution.** Each sample goes to exactly one CPU stage by the walk of
:meth:`collectors.pyspy_frames.PatternSet.classify_stack` (the deepest frame a rule matches; the
first rule within it; plumbing such as the event loop only when nothing else matched; else
``other``) over the engine's table (:mod:`collectors.pyspy_engines`). Without ``--native``, time
in C/Rust extensions (HF tokenizers, torch kernels launched from Python) is charged to the
Python frame that called them. Without ``idle=True`` py-spy drops idle threads, so ``idle`` then
only holds busy-waits it sees.

Front door: :class:`PySpySampler` (``record()``, or ``start()`` then ``wait()``/``stop()``;
``save(capture_dir)``), :func:`parse_raw`, :func:`attribute`, :data:`PATTERN_SETS`.
The sampler is a :class:`collectors.base.SeriesCollector`: once its window ended,
``collect()`` gives the window's samples per stage as series rows (one timestamp, the end).
Threading: a sampler object is driven from one owner thread (``collect()`` from any);
py-spy itself runs as a child process.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from collectors.base import empty_series_frame
from collectors.pyspy_engines import PATTERN_SETS, pattern_set
from collectors.pyspy_frames import (  # re-exported: the CPU stages and the rule types
    CPU_COMM, CPU_DETOKENIZE, CPU_FORWARD, CPU_HTTP, CPU_IDLE, CPU_OTHER, CPU_SAMPLE, CPU_SCHEDULER,
    CPU_SERIALIZATION, CPU_STAGES, CPU_TOKENIZE, Frame, PatternSet, Rule,
)
from diag.ground import stages as S

__all__ = [
    "CPU_COMM", "CPU_DETOKENIZE", "CPU_FORWARD", "CPU_HTTP", "CPU_IDLE", "CPU_OTHER", "CPU_SAMPLE",
    "CPU_SCHEDULER", "CPU_SERIALIZATION", "CPU_STAGES", "CPU_TOKENIZE", "Frame", "PATTERN_SETS",
    "PatternSet", "PySpyError", "PySpyPermissionError", "PySpySampler", "PySpyUnavailable", "Rule",
    "Stack", "StageProfile", "attribute", "attribute_raw", "load_profile", "parse_raw", "pattern_set",
    "record", "save_profile",
]

#: the series rows of a window: source, series name (value: samples), entity "pid<PID>/<stage>"
SOURCE = "pyspy"
SERIES_CPU_SAMPLES = "cpu_samples"

PROFILE_DIR = "profile"
RAW_FILE = "pyspy.raw.txt"
SUMMARY_FILE = "pyspy.json"
PTRACE_HINT = (
    "run as root, grant CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE; Kubernetes: "
    "securityContext.capabilities.add: [SYS_PTRACE]) or set sysctl kernel.yama.ptrace_scope=0"
)


class PySpyError(RuntimeError):
    """py-spy could not profile the target; the message is one line that says why."""


class PySpyUnavailable(PySpyError):
    """The py-spy executable is not installed."""


class PySpyPermissionError(PySpyError):
    """ptrace (process_vm_readv) was refused by the kernel or the container."""


@dataclass(frozen=True)
class Stack:
    """A distinct stack (root first) and how many samples had it."""

    frames: tuple[Frame, ...]
    count: int
    pid: int | None = None
    thread: str | None = None


_FRAME_RE = re.compile(r"^(?P<func>.*) \((?P<loc>[^()]*)\)$")
_THREAD_RE = re.compile(r"^thread \((?P<id>[^)]*)\)(?::[^;]*)?;")
_PROCESS_RE = re.compile(r'^process (?P<pid>\d+):"')


def _parse_frame(text: str) -> Frame:
    m = _FRAME_RE.match(text)
    if m is None:
        return Frame(text.strip(), "")
    loc = m.group("loc")
    file, sep, line = loc.rpartition(":")
    if sep and line.isdigit():
        return Frame(m.group("func"), file, int(line))
    return Frame(m.group("func"), loc)


def parse_raw(text: str, source: str = "<raw>") -> list[Stack]:
    """Parse py-spy's ``--format raw`` output. A malformed line raises ValueError naming it."""
    stacks: list[Stack] = []
    for lineno, raw_line in enumerate(text.splitlines(), 1):
        line = raw_line.rstrip()
        if not line.strip():
            continue
        body, sep, count_s = line.rpartition(" ")  # " 1": a sample with no Python frame
        if not sep or not count_s.isdigit():
            raise ValueError(f"{source}: line {lineno}: not 'frame;...;frame COUNT': {line[:80]!r}")
        pid: int | None = None
        while True:  # process prefixes (nested with --subprocesses): keep the innermost
            m = _PROCESS_RE.match(body)
            if m is None:
                break
            end = body.find('";', m.end())
            if end < 0:
                body = ""
                break
            pid = int(m.group("pid"))
            body = body[end + 2:]
        thread: str | None = None
        m = _THREAD_RE.match(body)
        if m is not None:
            thread = m.group("id")
            body = body[m.end():]
        frames = tuple(_parse_frame(f) for f in body.split(";") if f) if body else ()
        stacks.append(Stack(frames, int(count_s), pid, thread))
    return stacks


# --- the profile ------------------------------------------------------------------------------


@dataclass
class StageProfile:
    """CPU samples per stage for one py-spy window.

    ``shares[stage]`` = samples of that stage / ``samples_total`` (0..1, over thread-samples:
    with several busy threads a window of N seconds holds up to N × rate × threads samples;
    with ``gil=True`` only the GIL holder is sampled, so shares are of GIL time).
    ``top_frames[stage]``: the frames that decided the stage, most samples first.
    """

    engine: str
    samples_total: int
    counts: dict[str, int]
    top_frames: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def shares(self) -> dict[str, float]:
        n = self.samples_total
        return {s: (c / n if n else 0.0) for s, c in self.counts.items()}

    def busy_shares(self) -> dict[str, float]:
        """Shares of the non-idle samples (idle left out), 0..1."""
        busy = self.samples_total - self.counts.get(CPU_IDLE, 0)
        return {s: (c / busy if busy else 0.0) for s, c in self.counts.items() if s != CPU_IDLE}

    def dominant(self, include_idle: bool = False) -> str | None:
        """The stage with the most samples (None when there are none)."""
        items = [(c, s) for s, c in self.counts.items() if c and (include_idle or s != CPU_IDLE)]
        return max(items)[1] if items else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "samples_total": self.samples_total,
            "counts": dict(self.counts),
            "shares": self.shares,
            "busy_shares": self.busy_shares(),
            "top_frames": {s: [[f, c] for f, c in v] for s, v in self.top_frames.items()},
            "attribution": "inclusive: deepest frame matching a rule (first rule within a frame); plumbing rules only when none matched",
            **self.meta,
        }


def attribute(stacks: Iterable[Stack], engine: str | PatternSet = "bundled", top_n: int = 5) -> StageProfile:
    """Attribute every sample to one CPU stage (see the module docstring for the rule)."""
    ps = pattern_set(engine)
    counts: dict[str, int] = {s: 0 for s in CPU_STAGES}
    frames_by_stage: dict[str, Counter[str]] = {s: Counter() for s in CPU_STAGES}
    cache: dict[tuple[Frame, bool, bool], str | None] = {}
    total = 0
    for st in stacks:
        total += st.count
        stage, decided = ps.classify_stack(st.frames, cache)
        counts[stage] = counts.get(stage, 0) + st.count
        label = decided.label() if decided else (st.frames[-1].label() if st.frames else "<no frames>")
        frames_by_stage.setdefault(stage, Counter())[label] += st.count
    top = {s: c.most_common(top_n) for s, c in frames_by_stage.items() if c}
    return StageProfile(ps.engine, total, counts, top)


def attribute_raw(text: str, engine: str | PatternSet = "bundled", source: str = "<raw>") -> StageProfile:
    """:func:`parse_raw` then :func:`attribute`."""
    return attribute(parse_raw(text, source), engine)


# --- driving py-spy ----------------------------------------------------------------------------


def find_pyspy() -> str | None:
    """The py-spy executable: on PATH, else next to this Python (a venv's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    for name in ("py-spy", "py-spy.exe"):
        cand = Path(sys.executable).parent / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


_PERMISSION_MARKERS = ("permission denied", "operation not permitted", "os error 1)", "eperm",
                       "ptrace", "sys_ptrace", "elevated permissions")
_NOT_PYTHON_MARKERS = ("failed to find python version", "failed to get process executable name",
                       "no such file or directory", "failed to find python interpreter",
                       "no such process", "not a python")


def explain_failure(pid: int, returncode: int | None, stderr: str) -> PySpyError:
    """Turn py-spy's exit status and stderr into one clear line."""
    low = stderr.lower()
    if any(m in low for m in _PERMISSION_MARKERS):
        return PySpyPermissionError(f"py-spy cannot attach to PID {pid}: ptrace not permitted; {PTRACE_HINT}")
    if any(m in low for m in _NOT_PYTHON_MARKERS):
        return PySpyError(f"py-spy: PID {pid} is not a running Python process (or it exited)")
    detail = ""
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("Error:"):
            detail = line[len("Error:"):].strip()
            break
        if line and not line.startswith(("py-spy>", "Stack backtrace", "stack backtrace")) \
                and not re.match(r"^\d+:", line) and not detail:
            detail = line
    return PySpyError(f"py-spy failed on PID {pid} (exit {returncode}): {detail or 'no error text'}")


class PySpySampler:
    """Records one window of a process with py-spy and attributes it to CPU stages.

    ``duration_s`` is rounded up to whole seconds (py-spy's ``--duration`` is an integer);
    ``stop()`` ends a window early (SIGINT: py-spy writes what it has) and keeps the result in
    :attr:`profile` (a py-spy failure in :attr:`error`, raised again by :meth:`wait`).
    ``available`` is False with a one-line ``note`` when py-spy is not installed. One owner
    thread drives it; :meth:`collect` may be called from any thread.
    """

    def __init__(
        self,
        pid: int,
        *,
        duration_s: float = 10.0,
        rate_hz: int = 100,
        engine: str | PatternSet = "bundled",
        gil: bool = False,
        idle: bool = False,
        nonblocking: bool = False,
        subprocesses: bool = False,
        native: bool = False,
        py_spy: str | None = None,
    ) -> None:
        if duration_s <= 0 or rate_hz <= 0:
            raise ValueError("duration_s and rate_hz must be > 0")
        self.pid = int(pid)
        self.duration_s = max(1, math.ceil(duration_s))
        self.rate_hz = int(rate_hz)
        self.patterns = pattern_set(engine)
        self.gil, self.idle, self.nonblocking, self.subprocesses = gil, idle, nonblocking, subprocesses
        self.native = native
        self.exe = py_spy or find_pyspy()
        self.available = self.exe is not None
        self.note = ("" if self.available else
                     "py-spy unavailable: the py-spy executable is not installed (pip install py-spy)")
        self.raw_text = ""
        self.profile: StageProfile | None = None
        #: one line when the window failed (py-spy could not attach, no output); "" otherwise
        self.error = ""
        self._failure: PySpyError | ValueError | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._out: Path | None = None
        self._started_unix_s = 0.0
        self._ended_unix_s = 0.0

    def command(self, out_path: str | Path) -> list[str]:
        """The py-spy command line for one window written to ``out_path``."""
        cmd = [str(self.exe or "py-spy"), "record", "--pid", str(self.pid),
               "--duration", str(self.duration_s), "--rate", str(self.rate_hz),
               "--format", "raw", "-o", str(out_path)]
        if self.gil:
            cmd.append("--gil")
        if self.idle:
            cmd.append("--idle")
        if self.nonblocking:
            cmd.append("--nonblocking")
        if self.subprocesses:
            cmd.append("--subprocesses")
        if self.native:
            cmd.append("--native")
        return cmd

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Launch py-spy for the window (returns at once). Raises PySpyError (one line)."""
        if not self.available:
            raise PySpyUnavailable(self.note)
        if self._proc is not None:
            raise PySpyError("this sampler has already recorded a window; make a new one")
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            raise PySpyError(f"py-spy: no process with PID {self.pid}") from None
        except PermissionError:
            pass  # exists but belongs to someone else: py-spy will say whether it may attach
        self._tmp = tempfile.TemporaryDirectory(prefix="ttft-pyspy-")
        self._out = Path(self._tmp.name) / RAW_FILE
        self._started_unix_s = time.time()
        self._proc = subprocess.Popen(
            self.command(self._out), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )

    def wait(self, timeout_s: float | None = None) -> StageProfile:
        """Wait for the window to end (default: its duration + 30 s) and attribute it."""
        if self.profile is not None:
            return self.profile
        if self._failure is not None:
            raise self._failure
        if self._proc is None:
            raise PySpyError("py-spy was not started")
        limit = self.duration_s + 30.0 if timeout_s is None else timeout_s
        try:
            out, err = self._proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            self._proc.send_signal(signal.SIGINT)
            try:
                out, err = self._proc.communicate(timeout=10.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                out, err = self._proc.communicate()
        try:
            return self._finish(out, err)
        except (PySpyError, ValueError) as exc:  # no output, or output py-spy garbled
            self._failure, self.error = exc, str(exc)
            raise

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the window now (py-spy writes the samples so far) and attribute it into
        :attr:`profile`. Owner thread; waits at most about ``timeout_s`` (+10 s if py-spy
        ignores SIGINT); idempotent, a no-op when never started; a py-spy failure is kept in
        :attr:`error` instead of raised."""
        if self.profile is not None or self._failure is not None or self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
        try:
            self.wait(timeout_s)
        except (PySpyError, ValueError):
            pass  # kept in self.error

    def collect(self) -> pd.DataFrame:
        """The window's samples per CPU stage once it ended, else no rows (any thread).

        One row per stage of :data:`CPU_STAGES`: ``ts_s`` = the window's end (Unix s),
        ``source`` = ``"pyspy"``, ``series`` = ``"cpu_samples"``, ``entity`` =
        ``"pid<PID>/<stage>"``, ``value`` = samples (thread-samples, see :class:`StageProfile`).
        """
        prof = self.profile
        if prof is None:
            return empty_series_frame()
        names = list(prof.counts)
        return pd.DataFrame({
            "ts_s": [float(self._ended_unix_s)] * len(names),
            "source": [SOURCE] * len(names),
            "series": [SERIES_CPU_SAMPLES] * len(names),
            "entity": [f"pid{self.pid}/{name}" for name in names],
            "value": [float(prof.counts[name]) for name in names],
        }, columns=list(S.SERIES_COLUMNS))

    def record(self, capture_dir: str | Path | None = None) -> StageProfile:
        """start() + wait(); with ``capture_dir``, also save() into it."""
        self.start()
        prof = self.wait()
        if capture_dir is not None:
            self.save(capture_dir)
        return prof

    def _finish(self, out: bytes, err: bytes) -> StageProfile:
        assert self._proc is not None and self._out is not None
        self._ended_unix_s = time.time()
        stderr = (err or b"").decode("utf-8", "replace") + (out or b"").decode("utf-8", "replace")
        rc = self._proc.returncode
        try:
            if not self._out.exists():
                raise explain_failure(self.pid, rc, stderr)
            self.raw_text = self._out.read_text(encoding="utf-8", errors="replace")
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
        prof = attribute(parse_raw(self.raw_text, f"py-spy output for PID {self.pid}"), self.patterns)
        prof.meta = {
            "pid": self.pid,
            "rate_hz": self.rate_hz,
            "duration_s": self.duration_s,
            "window_unix_s": [self._started_unix_s, self._ended_unix_s],
            "options": {"gil": self.gil, "idle": self.idle, "nonblocking": self.nonblocking,
                        "subprocesses": self.subprocesses, "native": self.native},
            "command": self.command(RAW_FILE),
            "py_spy_exit": rc,
        }
        if "process exited" in stderr:
            prof.meta["note"] = "the process exited during the window"
        if prof.samples_total == 0:
            prof.meta["note"] = ("py-spy recorded no samples: the process was idle "
                                 "(try idle=True) or exited")
        self.profile = prof
        return prof

    def save(self, capture_dir: str | Path) -> tuple[Path, Path]:
        """Write ``profile/pyspy.raw.txt`` and ``profile/pyspy.json`` into the capture."""
        if self.profile is None:
            raise PySpyError("nothing recorded yet")
        return save_profile(capture_dir, self.raw_text, self.profile)


def save_profile(capture_dir: str | Path, raw_text: str, profile: StageProfile) -> tuple[Path, Path]:
    """Write the raw py-spy output and its stage summary under ``<capture>/profile/``."""
    d = Path(capture_dir) / PROFILE_DIR
    d.mkdir(parents=True, exist_ok=True)
    raw_path, json_path = d / RAW_FILE, d / SUMMARY_FILE
    raw_path.write_text(raw_text, encoding="utf-8")
    json_path.write_text(json.dumps(profile.to_dict(), indent=2) + "\n", encoding="utf-8")
    return raw_path, json_path


def load_profile(capture_dir: str | Path, engine: str | PatternSet | None = None) -> StageProfile:
    """Re-attribute a saved raw profile (e.g. with another engine's rules)."""
    d = Path(capture_dir) / PROFILE_DIR
    raw_path = d / RAW_FILE
    if not raw_path.exists():
        raise FileNotFoundError(f"{raw_path}: no py-spy profile in this capture")
    if engine is None:
        try:
            engine = json.loads((d / SUMMARY_FILE).read_text(encoding="utf-8")).get("engine", "bundled")
        except (OSError, ValueError):
            engine = "bundled"
    assert engine is not None
    return attribute_raw(raw_path.read_text(encoding="utf-8", errors="replace"), engine, str(raw_path))


def record(pid: int, duration_s: float = 10.0, engine: str | PatternSet = "bundled",
           capture_dir: str | Path | None = None, **options: Any) -> StageProfile:
    """One window of ``pid`` attributed to stages; see :class:`PySpySampler` for options."""
    return PySpySampler(pid, duration_s=duration_s, engine=engine, **options).record(capture_dir)
