"""Run the bundled engine (``ttft serve``) in its own process, as a real deployment would.

The scenario runner uses a separate process so the engine's threads never share an
interpreter lock with the probe measuring it. ``EngineProcess`` starts it, waits for the
"listening on" line, and on ``stop()`` sends SIGINT so the engine flushes its capture.

Unless its arguments say ``--threads``, the engine gets one torch thread fewer than the
machine has cores, so the probe (and the TUI) keep a core: on a 2-core box, a 2-thread engine
beside a busy client stalls in its threads' barriers for tens of milliseconds now and then,
which shows up as token-gap spikes that no scenario put there.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import diag

_LISTENING = re.compile(r"listening on (http://\S+)(?: \(model=([^,)]+))?")


def engine_threads(cores: int | None = None) -> int:
    """Torch threads for an engine that shares this machine with its client: all cores but one."""
    n = cores if cores is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    return max(1, (n or 1) - 1)


class EngineProcessError(RuntimeError):
    """The engine process failed to start; the message carries its last stderr line."""


class EngineProcess:
    """``python -m diag serve --port 0 ARGS`` as a child process. Not thread-safe; one owner."""

    def __init__(self, args: Sequence[str], capture_dir: str | os.PathLike[str] | None = None,
                 start_timeout_s: float = 180.0) -> None:
        self.args = list(args)
        self.capture_dir = Path(capture_dir) if capture_dir is not None else None
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.model = ""  # the served model name, from the listening line
        self._stderr: list[str] = []

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "diag", "serve", "--port", "0", *self.args]
        if "--threads" not in self.args:
            cmd += ["--threads", str(engine_threads())]
        if self.capture_dir is not None:
            cmd += ["--capture", str(self.capture_dir)]
        return cmd

    def start(self) -> "EngineProcess":
        env = dict(os.environ)
        root = str(Path(diag.__file__).resolve().parents[1])  # the checkout or site-packages holding diag
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.monotonic() + self.start_timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            m = _LISTENING.search(line)
            if m:
                self.url = m.group(1)
                self.model = m.group(2) or ""
                threading.Thread(target=self._drain_stdout, daemon=True).start()
                return self
        self.kill()
        last = next((l for l in reversed(self._stderr) if l.strip()), "no output")
        raise EngineProcessError(f"engine did not start ({' '.join(self.args)}): {last.strip()}")

    def _drain_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-50]

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGINT (the engine flushes its capture), then SIGKILL if it does not exit."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "EngineProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
