"""Helpers shared by the engine tests (a uniquely named module: other test folders have conftests)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diag import stages


def finished_spans(engine) -> list[Any]:
    """Every span the engine's in-memory sink has finished so far."""
    engine.sink.force_flush()
    return list(engine.sink.memory.get_finished_spans())


def spans_by_request(spans) -> dict[int, dict[str, list[Any]]]:
    """trace id -> span name -> spans (request spans under stages.SPAN_REQUEST)."""
    out: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for s in spans:
        out[s.context.trace_id][s.name].append(s)
    return {k: v for k, v in out.items() if stages.SPAN_REQUEST in v}


ROOT = Path(__file__).resolve().parents[3]


def stop_process(proc: subprocess.Popen) -> int:
    """SIGINT (a ``ttft`` command flushes its capture), 30 s to exit, then kill; the exit code."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@contextlib.contextmanager
def serve_process(cmd: list[str]) -> Iterator[tuple[subprocess.Popen, str]]:
    """Run a ``ttft serve`` command line from the repository root; yield (process, its first
    stdout line). On exit: SIGINT (the engine flushes its capture), 30 s to exit, then kill;
    ``process.returncode`` holds the exit code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline()
    finally:
        stop_process(proc)
