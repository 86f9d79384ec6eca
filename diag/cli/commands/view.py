"""``ttft view CAPTURE [CAPTURE ...] [--window S]``: the live dashboard over a recorded capture,
with a time cursor (←/→) that moves the analysis window. Without a terminal (or with --no-tui) it
prints the analysis of all the captures joined, as ``ttft analyze`` does, and keeps its exit codes.
The dashboard joins several captures (or a directory of them) as ``ttft analyze`` does, and the
whole-capture view shows the numbers ``ttft analyze`` prints for the same captures."""

from __future__ import annotations

import argparse
import sys

from tui.layout import LAYOUTS


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "view",
        help="browse a capture in the terminal dashboard, with a time cursor",
        description="Open a capture in the dashboard: verdict, TTFT/ITL, stage breakdown, throughput, KV, "
        "GPU (or the engine's busy timeline) and the slowest requests. Starts on the whole capture; "
        "←/→ move an analysis window over it, -/+ change its width, 0 goes back to the whole capture, "
        "Enter on a request opens its waterfall, r writes a report, ? lists the keys.",
    )
    p.add_argument("capture", metavar="CAPTURE", help="capture directory (or a spans .jsonl file), or a directory "
                   "of captures (a scenario run: client/, server-0/)")
    p.add_argument("more", nargs="*", metavar="CAPTURE", help="more captures, joined by trace id (client server-0)")
    p.add_argument("--window", type=float, metavar="S", default=None,
                   help="analysis window in seconds (default: the whole capture; ←/→ then use a sixth of it)")
    p.add_argument("--refresh", type=float, metavar="S", default=1.0, help="seconds between screen refreshes")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds")
    p.add_argument("--slo", metavar="SPEC", help="SLOs, each with a unit (ms, s, us), e.g. ttft_p99=2s,tpot_p99=100ms")
    p.add_argument("--report-dir", metavar="DIR", default=".", help="where the r key writes reports")
    p.add_argument("--layout", choices=LAYOUTS, default="auto",
                   help="screen layout: compact (from 80x24), medium (120x40), full (160x48); auto picks by "
                   "terminal size, again on resize")
    p.add_argument("--no-tui", action="store_true", help="print the analysis instead of opening the dashboard")
    return p


def run(args: argparse.Namespace) -> int:
    from tui.sources import open_capture_source

    from diag.analysis import analyze_paths
    from diag.ground.slo import slo_option

    slo = slo_option(args.slo)
    paths = [args.capture, *args.more]
    if args.no_tui or not (sys.stdin.isatty() and sys.stdout.isatty()):
        from diag.cli.commands.analyze import verdict_exit_code
        from diag.analysis.report.text import format_analysis

        if not args.no_tui:
            print("ttft view: no terminal; printing the analysis instead (ttft analyze)", file=sys.stderr)
        analysis = analyze_paths(paths, rules_file=args.rules, slo=slo)
        print(format_analysis(analysis))
        return verdict_exit_code(analysis, slo, "view")
    source = open_capture_source(paths, args.window, slo=slo)
    from tui.app import run_app

    return run_app(source, refresh_s=args.refresh, slo=slo, rules_file=args.rules, report_dir=args.report_dir,
                   layout=args.layout)
