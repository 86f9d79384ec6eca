"""The feeds of a live session: whether each is still alive, and which phase the session is in.

A live view (``ttft watch``, ``ttft demo``) reads a capture that collectors and engine
processes are writing. Each of them is watched by a :class:`Monitor`; a scenario runner says
which phase the session is in with a :class:`PhaseInfo`. These types live with the collectors
(floor 2) so that both the collection (:mod:`collectors.live`), the scenario runner
(:mod:`diag.analysis.scenarios.director`) and the TUI's :class:`tui.sources.LiveSource` can use them
without anything below the TUI importing ``tui``.

Threading: ``Monitor.check`` may be called from any thread and must be cheap; the types here
hold no locks.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class PhaseInfo:
    """What a live source's ``phase_fn`` may return instead of a plain label: the label, when
    the phase began (the live window starts there, so the verdict covers this phase only)
    and the SLOs its rules use."""

    label: str
    start_unix_s: float | None = None
    slo: dict[str, float] | None = None
    #: set once the phase is over (the window stays on it until the next one starts)
    end_unix_s: float | None = None
    #: how the header names the window, e.g. "this phase"
    window_label: str | None = None


class Monitor(Protocol):
    """One feed of a live source (an engine process, a collector thread)."""

    name: str

    def check(self) -> str | None:
        """None while alive; a one-line reason once it died (any thread, must be cheap)."""
        ...


@dataclass
class ProcessMonitor:
    """Watches a subprocess: dead once it exited."""

    name: str
    process: subprocess.Popen[bytes] | subprocess.Popen[str]
    stderr_path: Path | None = None

    def check(self) -> str | None:
        code = self.process.poll()
        if code is None:
            return None
        tail = ""
        if self.stderr_path is not None:
            try:
                lines = [ln for ln in self.stderr_path.read_text(errors="replace").splitlines() if ln.strip()]
                tail = f": {lines[-1].strip()[:140]}" if lines else ""
            except OSError:
                pass
        return f"{self.name} exited with code {code}{tail}"


@dataclass
class CallableMonitor:
    """Wraps a callable that returns None while alive and a reason once dead."""

    name: str
    fn: Callable[[], str | None]

    def check(self) -> str | None:
        try:
            return self.fn()
        except Exception as exc:  # a monitor's bug must not kill the frame
            return f"{self.name}: monitor failed: {type(exc).__name__}: {exc}"
