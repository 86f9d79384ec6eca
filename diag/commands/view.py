"""``ttft view CAPTURE [--window S]``: the live dashboard over a recorded capture, with a time
cursor (←/→) that moves the analysis window. Without a terminal it prints the analysis."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "view",
        help="browse a capture in the terminal dashboard, with a time cursor",
        description="Open a capture in the dashboard: verdict, TTFT/ITL, stage breakdown, throughput, KV, "
        "GPU (or the engine's busy timeline) and the slowest requests. Starts on the whole capture; "
        "←/→ move an analysis window over it, -/+ change its width, 0 goes back to the whole capture, "
        "Enter on a request opens its waterfall, r writes a report, ? lists the keys.",
    )
    p.add_argument("capture", metavar="CAPTURE", help="capture directory (or a spans .jsonl file)")
    p.add_argument("--window", type=float, metavar="S", default=None,
                   help="analysis window in seconds (default: the whole capture; ←/→ then use a sixth of it)")
    p.add_argument("--refresh", type=float, metavar="S", default=1.0, help="seconds between screen refreshes")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds")
    p.add_argument("--slo", metavar="SPEC", help="SLOs, each with a unit (ms, s, us), e.g. ttft_p99=2s,tpot_p99=100ms")
    p.add_argument("--report-dir", metavar="DIR", default=".", help="where the r key writes reports")
    p.add_argument("--no-tui", action="store_true", help="print the analysis instead of opening the dashboard")
    return p


def run(args: argparse.Namespace) -> int:
    from tui.sources import open_capture_source

    from diag.slo import slo_option

    slo = slo_option(args.slo)
    source = open_capture_source(args.capture, args.window)
    if args.no_tui or not (sys.stdin.isatty() and sys.stdout.isatty()):
        from diag.analysis import analyze_paths
        from diag.report.text import format_analysis

        if not args.no_tui:
            print("ttft view: no terminal; printing the analysis instead (ttft analyze)", file=sys.stderr)
        from diag.commands.analyze import verdict_exit_code

        analysis = analyze_paths([args.capture], rules_file=args.rules, slo=slo)
        print(format_analysis(analysis))
        return verdict_exit_code(analysis, slo, "view")
    from tui.app import run_app

    return run_app(source, refresh_s=args.refresh, slo=slo, rules_file=args.rules, report_dir=args.report_dir)
