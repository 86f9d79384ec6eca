"""``ttft instrument [--capture DIR | --otlp URL] -- COMMAND …``: stage spans on an engine without
touching its code.

Python engines (first target: Hugging Face ``transformers serve``) get our bootstrap on
``PYTHONPATH`` (import hooks, see :mod:`collectors.instrument`); vLLM, SGLang and TGI get their
own tracing flags pointed at our OTLP receiver, which writes DIR (see
:mod:`collectors.instrument.commandline`; those command lines are tested as built only).
COMMAND's exit status is this command's; SIGINT/SIGTERM are passed on to it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


#: signals --toggle-signal may name: the user-defined ones (the others stop, stop or hang an engine)
TOGGLE_SIGNALS = ("USR1", "USR2")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "instrument",
        help="run an engine with our stage spans on it, without changing its code",
        description="Run COMMAND with zero-code instrumentation: a Python engine (transformers serve) gets "
        "import hooks that emit tokenize/queue/prefill/sample/detokenize and cold-start spans, joined to the "
        "client's traceparent; vLLM, SGLang and TGI get their own OTLP tracing switched on into our receiver. "
        "Example: ttft instrument --capture srv -- transformers serve MODEL, then ttft probe ... -o cli and "
        "ttft analyze cli srv.",
    )
    dest = p.add_mutually_exclusive_group()
    dest.add_argument("--capture", metavar="DIR", help="capture directory to write (spans.otlp.jsonl, meta.json)")
    dest.add_argument("--otlp", metavar="URL", help="OTLP endpoint to export to instead (e.g. http://127.0.0.1:4318; "
                      "default without --capture: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT)")
    p.add_argument("--receiver-port", type=int, default=0, metavar="PORT",
                   help="self-tracing engines: our OTLP/gRPC receiver's port (default: any free port)")
    p.add_argument("--toggle-signal", metavar="SIG", default=None,
                   help="Python engines: this signal (USR1 or USR2) pauses and resumes the hooks in the engine's "
                        "process (kill -SIG PID; while paused every hook is a plain call, no span); meta.json lists "
                        "the flips")
    p.add_argument("--paused", action="store_true",
                   help="with --toggle-signal: start with the hooks paused (trace only once you send the signal)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the engine's command line")
    return p


def run(args: argparse.Namespace) -> int:
    from collectors.instrument import commandline, runtime
    from diag.cli import UsageError

    from collectors.otel_env import check_protocol, endpoint_from_env

    if args.capture is None and args.otlp is None:
        args.otlp = endpoint_from_env()
        if args.otlp is None:
            raise UsageError("give --capture DIR or --otlp URL (or set OTEL_EXPORTER_OTLP_ENDPOINT)")
    if args.otlp is not None:
        try:
            check_protocol()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("give the engine's command after --, e.g. ttft instrument --capture srv -- transformers serve MODEL")
    if args.capture is not None:
        cap = Path(args.capture)
        if (cap / "spans.otlp.jsonl").exists():
            raise UsageError(f"{cap} already holds a capture; give a new directory")
        try:
            (cap / runtime.LOCK_NAME).unlink()  # a lock left by a killed run
        except OSError:
            pass
    if args.paused and not args.toggle_signal:
        raise UsageError("--paused needs --toggle-signal SIG (otherwise nothing could resume tracing)")
    if args.toggle_signal and args.toggle_signal.upper().removeprefix("SIG") not in TOGGLE_SIGNALS:
        raise UsageError(f"--toggle-signal {args.toggle_signal}: use one of {', '.join(TOGGLE_SIGNALS)} "
                         "(SIGINT and SIGTERM stop the engine)")
    engine = commandline.detect_engine(argv)
    receiver: Any = None
    writer: Any = None
    grpc = None
    if engine in commandline.SELF_TRACING and args.otlp is None:
        receiver, writer, grpc = _start_receiver(args.capture, args.receiver_port, engine)
    toggle = args.toggle_signal.upper().removeprefix("SIG") if args.toggle_signal else None
    plan = commandline.plan(argv, os.environ, capture_dir=args.capture, otlp_url=args.otlp, receiver_grpc=grpc,
                            toggle_signal=toggle, paused=args.paused)
    if writer is not None:
        writer.update_meta(instrument={"engine_flags": plan.added_flags, "argv": plan.argv,
                                       "note": "engine tracing flags are tested as built, not against a running engine"})
    if plan.added_flags:
        print(f"ttft instrument: {engine}: added {' '.join(plan.added_flags)}", file=sys.stderr, flush=True)
    try:
        return _run_child(plan.argv, plan.env)
    finally:
        if receiver is not None:
            receiver.stop()
        if writer is not None:
            writer.close()


def _start_receiver(capture: str, grpc_port: int, engine: str) -> tuple[Any, Any, str]:
    from collectors.otlp_receiver import OTLPReceiver
    from diag.ground.capture import CaptureWriter
    from diag.cli import UsageError

    writer = CaptureWriter(capture, meta={"command": "instrument", "engine": engine})
    receiver = OTLPReceiver(writer.append_span_request, host="127.0.0.1", port=0, grpc_port=grpc_port)
    try:
        receiver.start()
    except OSError as exc:
        receiver.stop()
        writer.close()
        raise UsageError(f"cannot start the OTLP receiver: {exc.strerror or exc}") from None
    host, port = receiver.grpc_address or ("127.0.0.1", grpc_port)
    return receiver, writer, f"{host}:{port}"


def _run_child(argv: list[str], env: dict[str, str]) -> int:
    """Run COMMAND, passing SIGINT/SIGTERM on; its exit status (128+N when killed by signal N)."""
    try:
        proc = subprocess.Popen(argv, env=env)
    except OSError as exc:
        from diag.cli import UsageError

        raise UsageError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None

    def forward(signum: int, _frame: Any) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc
