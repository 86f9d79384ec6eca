"""The bundled engine in tests: its in-memory spans, captures of rounds of requests, and
``ttft serve`` (or any command) as a real process."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diag.ground import stages


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


ROOT = Path(__file__).resolve().parents[2]


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


@contextlib.contextmanager
def background_job(argv: list[str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m diag ARGV`` from the repository root as a shell's background job starts it: SIGINT
    ignored on entry. Yields (process, its first stdout line); kills it on exit if still running."""
    proc = subprocess.Popen([sys.executable, "-m", "diag", *argv], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(cmd: list[str], ready: str, timeout_s: float = 60.0) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Run ``cmd`` (repository on PYTHONPATH) until its first stdout line contains ``ready``;
    yields (the process, that line); SIGKILL on the way out."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        r, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if r else ""
        assert ready in line, f"{cmd[2:4]} did not start: {line!r}"
        yield proc, line
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def ttft_serve(port: int) -> Iterator[subprocess.Popen[str]]:
    """``ttft serve --port PORT`` (the tiny model) until it listens; killed on the way out."""
    with process([sys.executable, "-m", "diag", "serve", "--port", str(port)], "listening on") as (proc, _):
        yield proc


#: ``python -c LAUNCH serve …``: ``ttft serve`` without the console script (its argparse and run())
LAUNCH = (
    "import argparse, sys; from diag.cli.commands import serve; p = argparse.ArgumentParser(prog='ttft'); "
    "sub = p.add_subparsers(); serve.add_parser(sub); sys.exit(serve.run(p.parse_args(sys.argv[1:])))"
)


def capture_rounds(out: Path, rounds: list[list[tuple[list[int], int]]], **config: Any) -> Path:
    """Run an in-process bundled engine (``build_engine(model="tiny", capture_dir=out, **config)``)
    over ``rounds`` of requests: each round's (prompt ids, max tokens) submitted at once, greedy and
    ignoring EOS; a round starts when the last one's streams ended. Returns ``out`` (the capture)."""
    from diag.bundled_engine import SamplingParams, SyncEventStream, build_engine

    eng = build_engine(model="tiny", capture_dir=out, **config)
    try:
        for batch in rounds:
            streams = [SyncEventStream() for _ in batch]
            for s, (ids, max_tokens) in zip(streams, batch):
                eng.submit(s.push, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                           prompt_ids=ids)
            for s in streams:
                list(s)
    finally:
        eng.shutdown()
    return out


def kv_receiver(store_port: int, conn: Any) -> None:
    """Rank 1 of a two-rank gloo group in a spawned process: receive KV transfers
    (``diag.bundled_engine.pd_wire.recv_kv``) until a stop header, sending each ``(kind, meta, kv)`` back on ``conn``."""
    import torch

    from diag.bundled_engine.pd_wire import KIND_STOP, recv_kv
    from diag.bundled_engine.tp import connect_store, make_process_group

    pg = make_process_group(connect_store(store_port, 2), 1, 2, "cpu")
    while True:
        got = recv_kv(pg, 0, torch.device("cpu"))
        conn.send(got)
        if got[0] == KIND_STOP:
            return
