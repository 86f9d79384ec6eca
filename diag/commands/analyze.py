"""``ttft analyze CAPTURE [CAPTURE ...]``: stage decomposition, verdict and findings."""

from __future__ import annotations

import argparse
import json
import sys

from diag.analysis import analyze_paths
from diag.report.text import format_analysis


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "analyze",
        help="decompose TTFT by stage and name the bottleneck",
        description="Load one or more captures (client and server captures are joined by trace id), "
        "print the per-stage TTFT decomposition and the rule engine's verdict.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="capture directory (or a spans .jsonl file)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds")
    p.add_argument("--slo", metavar="SPEC", help="SLOs, e.g. ttft_p99=2s,tpot_p99=100ms")
    return p


def run(args: argparse.Namespace) -> int:
    from diag.slo import slo_option

    slo = slo_option(args.slo)
    analysis = analyze_paths(args.captures, rules_file=args.rules, slo=slo)
    if args.json:
        from diag.units import json_safe

        json.dump(json_safe(analysis.to_dict()), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_analysis(analysis))
    return 0

