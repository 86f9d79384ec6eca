"""``ttft report CAPTURE [CAPTURE ...] -o FILE.html|.md|.json [--slo SPEC] [--rules FILE]``.

Writes a self-contained report (format from the suffix) and prints one line: where it went
and the verdict. Exit codes (:mod:`diag.ground.exit_codes`): 1 when an SLO given with ``--slo`` is
broken (a CI gate); 2 when there is nothing to judge (verdict ``no_data``; the report is still
written) or on bad input (unknown suffix, bad SLO, unreadable capture: a one-line error raised
as CaptureError for the CLI front to print); 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from diag.analysis import analyze_paths
from diag.ground.exit_codes import BAD_INPUT, FAILED_GATE, OK
from diag.analysis.report import report_format, write_report


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML, Markdown or JSON report (verdict, evidence, plots)",
        description="Analyse one or more captures (client and server captures are joined by trace id) and write "
        "a report: the verdict and its evidence first, then SLOs, other findings, latency percentiles, the stage "
        "waterfall, TTFT against prompt length and load, and device/KV/queue timelines. The HTML opens offline. "
        "Exit code 1 when an SLO is broken.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="capture directory (or a spans .jsonl file)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="report file: .html, .md or .json")
    p.add_argument("--slo", metavar="SPEC", help="SLOs to gate on, each with a unit (ms, s, us), "
                   "e.g. ttft_p99=2s,tpot_p99=100ms,itl_p99=50ms")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds")
    p.add_argument("--title", metavar="TEXT", help="report title (default: the capture names)")
    return p


def run(args: argparse.Namespace) -> int:
    report_format(args.output)  # fail on a bad suffix before any work
    from diag.ground.slo import slo_option

    slo = slo_option(args.slo)
    analysis = analyze_paths(args.captures, rules_file=args.rules, slo=slo)
    result = write_report(analysis, args.output, slo=slo, title=args.title)
    print(f"report written to {result.path} ({result.format}); {result.verdict_line}")
    d = analysis.diagnosis
    if d is not None and d.verdict.category == "no_data":
        print(f"ttft report: nothing to judge: {d.verdict.title}", file=sys.stderr)
        return BAD_INPUT
    if result.slo:
        broken = [s for s in result.slo if not s.passed]
        if broken:
            print("SLO broken: " + "; ".join(f"{s.key}: {s.detail}" for s in broken), file=sys.stderr)
            return FAILED_GATE
        print(f"SLOs met: {', '.join(s.key for s in result.slo)}")
    return OK
