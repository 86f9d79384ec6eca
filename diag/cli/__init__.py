"""The ``ttft`` command line: a thin front over one module per sub-command.

Each module in :mod:`diag.cli.commands` exposes ``add_parser(subparsers)`` and ``run(args) -> int``.
Every command keeps one exit-code contract (:mod:`diag.ground.exit_codes`, stated in each ``--help``):
0 ok, 1 an SLO broken or a regression beyond ``--fail-on``, 2 bad input (one line on stderr) or
nothing to judge, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

#: Sub-commands in the order ``ttft --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "demo", "serve", "diagnose", "probe", "analyze", "report", "diff", "export", "view", "watch",
    "receive", "scrape", "profile", "scenarios", "instrument", "completion",
)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows every option's default, unless its help already states one or it has
    none worth showing (None, False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default in (None, False, argparse.SUPPRESS) or default == []
                or "default" in text.lower() or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return action.help
        return f"{text} (default: %(default)s)"


class UsageError(Exception):
    """A user error: printed as one line, exit code 2."""


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM set ``stop``: a long-running command ends as on
    Ctrl-C under a process manager (SIGTERM) and when it was started as a shell's background job
    (SIGINT ignored on entry, so Python raises no KeyboardInterrupt). The old handlers come back
    after. Only from the main thread; elsewhere the block runs as it is."""
    old: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ttft",
        description="ttft-diag: find out why time-to-first-token is high. "
        "Times every stage of a request, samples the GPU and the engine alongside, and names the bottleneck.",
    )
    from diag.ground.capture import tool_version
    from diag.ground.exit_codes import EPILOG

    parser.epilog = EPILOG
    parser.add_argument("--version", action="version", version=f"ttft-diag {tool_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"diag.cli.commands.{name}")  # every one ships: an ImportError is a bug
        p = module.add_parser(sub)
        p.formatter_class = DefaultsHelpFormatter
        p.epilog = f"{p.epilog}\n\n{EPILOG}" if p.epilog else EPILOG
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    from diag.ground.capture import CaptureError
    from diag.ground.exit_codes import BAD_INPUT, INTERRUPTED, OK

    try:
        return int(args._run(args) or 0)
    except (CaptureError, UsageError) as exc:
        print(f"ttft {args.command}: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        return OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
