"""The instrumented process's side of ``ttft instrument``: settings from the environment, the
one trace sink, the capture claim, and the flush at exit.

``ttft instrument`` passes its settings to COMMAND's process (and to every Python process it
starts) through environment variables (``ENV_*`` below). :func:`current` returns the process's
one :class:`Instrumentation`; its sink is built lazily by :meth:`Instrumentation.activate` when a
target's patches apply, so helper processes that never import the engine write nothing. Only one
process may write a capture: it claims ``CAPTURE/.instrument.lock`` (O_EXCL) first.

Exit: spans are exported continuously (about every 0.5 s) by the sink's own threads; at exit
(``threading._register_atexit`` - before non-daemon threads are joined - with ``atexit`` as a
fallback) and on SIGTERM/SIGINT (chained to the handler that was there) the sink is flushed and
meta.json gets the hook counters. Tracing can be paused: with ``ENV_TOGGLE_SIGNAL`` set (a signal
name, e.g. ``USR2``), that signal flips every hook between on and off (:class:`HookSwitch`);
``ENV_PAUSED`` starts the process with them off; meta.json lists the flips. Threading:
:meth:`activate` and :meth:`shutdown` are idempotent and take a lock; call them from any thread.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from collectors.instrument.hooks import HookStats, HookSwitch, PostImportHooks

ENV_CAPTURE = "TTFT_INSTRUMENT_CAPTURE"  # capture directory to write
ENV_OTLP = "TTFT_INSTRUMENT_OTLP"  # OTLP/HTTP base URL to export to
ENV_TARGETS = "TTFT_INSTRUMENT_TARGETS"  # comma-separated targets ("transformers")
ENV_BOOTSTRAP_DIR = "TTFT_INSTRUMENT_BOOTSTRAP_DIR"  # our sitecustomize's directory (for chaining)
ENV_COMMAND = "TTFT_INSTRUMENT_COMMAND"  # COMMAND as given, for meta.json
ENV_TOGGLE_SIGNAL = "TTFT_INSTRUMENT_TOGGLE_SIGNAL"  # a signal name (USR1, USR2): flips tracing on/off
ENV_PAUSED = "TTFT_INSTRUMENT_PAUSED"  # "1": start with tracing off (needs ENV_TOGGLE_SIGNAL)
LOCK_NAME = ".instrument.lock"


def say(line: str) -> None:
    """One line on stderr, prefixed so a user knows who speaks."""
    try:
        print(f"ttft instrument: {line}", file=sys.stderr, flush=True)
    except Exception:
        pass


class Instrumentation:
    """Per-process state: hook counters, the import hooks, the sink once a target is active."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.capture_dir = env.get(ENV_CAPTURE) or None
        self.otlp_url = env.get(ENV_OTLP) or None
        self.targets = [t for t in (env.get(ENV_TARGETS) or "transformers").split(",") if t]
        self.command = env.get(ENV_COMMAND, "")
        self.toggle_signal = env.get(ENV_TOGGLE_SIGNAL) or None
        self.switch = HookSwitch(on=not (self.toggle_signal and env.get(ENV_PAUSED) == "1"))
        self.stats = HookStats()
        self.hooks = PostImportHooks(self.stats)
        self.sink: Any = None
        self.meta: dict[str, Any] = {}
        self.unmeasured: dict[str, str] = {}
        self._lock = threading.Lock()
        self._claimed: Path | None = None
        self._shut = False

    def activate(self, target: str, version: str) -> Any:
        """Build the sink (once); None when no destination or another process owns the capture."""
        with self._lock:
            if self.sink is not None or self._shut:
                return self.sink
            if self.capture_dir is None and self.otlp_url is None:
                return None
            if self.capture_dir is not None and not self._claim(Path(self.capture_dir)):
                return None
            from collectors.spans import setup_tracing

            self.meta = {"target": target, "target_version": version, "pid": os.getpid(),
                         "command": self.command, "started_unix_s": time.time()}
            self.sink = setup_tracing(
                service_name=target, capture_dir=self.capture_dir, otlp_endpoint=self.otlp_url, provider_name=target,
                meta={"command": "instrument", "engine": target, "instrument": self.meta_block()},
            )
            _install_exit_paths(self)
            return self.sink

    def _claim(self, path: Path) -> bool:
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path / LOCK_NAME, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False  # another process of this command writes the capture
        except OSError as exc:
            say(f"cannot write the capture {path}: {exc}")
            return False
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        self._claimed = path / LOCK_NAME
        return True

    def note_unmeasured(self, stage: str, why: str) -> None:
        """Say in meta.json that a stage is not measured in this mode, and why."""
        if self.unmeasured.get(stage) != why:
            self.unmeasured[stage] = why
            self.write_meta()

    def meta_block(self) -> dict[str, Any]:
        block = {**self.meta, **self.stats.as_meta(), "unmeasured": dict(self.unmeasured)}
        if self.toggle_signal:
            block["toggle_signal"] = self.toggle_signal
            block["tracing_on"] = self.switch.on
            block["toggles"] = [{"unix_s": t, "on": on} for t, on in self.switch.toggles]
        return block

    def install_toggle(self) -> None:
        """Flip tracing on ``toggle_signal`` (main thread only; an unknown name is one line, no toggle).

        A handler already installed for that signal is still called after the flip.
        """
        if not self.toggle_signal:
            return
        if threading.current_thread() is not threading.main_thread():
            self.switch.on, self.toggle_signal = True, None  # no handler: never left paused
            return
        name = self.toggle_signal.upper()
        signum = getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)
        if not isinstance(signum, signal.Signals):
            say(f"unknown toggle signal {self.toggle_signal!r}: tracing cannot be paused in this process")
            self.switch.on, self.toggle_signal = True, None
            return
        previous = signal.getsignal(signum)

        def flip(sig: int, frame: Any) -> None:
            self.switch.set(not self.switch.on)
            # not from the handler itself: it may have interrupted this thread inside the writer
            threading.Thread(target=self.write_meta, name="ttft-toggle-meta", daemon=True).start()
            if callable(previous):
                previous(sig, frame)

        try:
            signal.signal(signum, flip)
        except (ValueError, OSError) as exc:
            say(f"cannot handle {signum.name}: {exc}; tracing stays on")
            self.switch.on, self.toggle_signal = True, None

    def write_meta(self) -> None:
        with self.stats.guard("meta"):
            if self.sink is not None:
                self.sink.set_meta(instrument=self.meta_block())

    def shutdown(self) -> None:
        """Flush every span, write the counters into meta.json, close the sink. Idempotent."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
        sink = self.sink
        if sink is None:
            return
        if self.capture_dir is None and (self.stats.total_errors or self.unmeasured):
            # --otlp only: no meta.json to carry these, so they go to stderr
            say(f"hook errors swallowed: {self.stats.total_errors} {self.stats.errors or ''}; "
                f"unmeasured: {', '.join(sorted(self.unmeasured)) or 'none'}")
        try:
            sink.force_flush()
            self.meta["stopped_unix_s"] = time.time()
            sink.set_meta(instrument=self.meta_block())
            sink.shutdown()
        except Exception as exc:
            say(f"flushing spans at exit failed: {exc}")
        finally:
            if self._claimed is not None:
                try:
                    self._claimed.unlink()
                except OSError:
                    pass


_CURRENT: Instrumentation | None = None


def current() -> Instrumentation:
    """This process's Instrumentation (built from the environment on first use)."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = Instrumentation()
    return _CURRENT


def _install_exit_paths(inst: Instrumentation) -> None:
    """Flush at interpreter exit and on SIGTERM/SIGINT, then let the old behaviour happen."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(inst.shutdown)  # runs before non-daemon threads are joined
    except Exception:
        pass
    atexit.register(inst.shutdown)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(signum)
            signal.signal(signum, _chained(inst, signum, previous))
        except (ValueError, OSError):
            pass


def _chained(inst: Instrumentation, signum: int, previous: Any) -> Any:
    def handler(sig: int, frame: Any) -> None:
        if sig == signal.SIGTERM or previous in (signal.SIG_DFL, None):
            inst.shutdown()  # the default action ends the process without atexit
        if callable(previous):
            previous(sig, frame)
        elif previous == signal.SIG_IGN:
            return
        else:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)

    return handler
