"""``ttft diff A B [--json] [--rules FILE]``: what changed between two captures and why."""

from __future__ import annotations

import argparse
import json
import sys

from diag.diff import diff_paths


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "diff",
        help="compare two captures: what changed, and which finding explains it",
        description="Compare capture A (baseline) with capture B: TTFT/ITL percentiles, per-stage p50 and share, "
        "throughput, device busy, KV usage and queue depth; name the stage that moved most and the finding "
        "whose category owns it; say whether the verdict changed.",
    )
    p.add_argument("a", metavar="A", help="baseline capture (directory or spans .jsonl)")
    p.add_argument("b", metavar="B", help="capture to compare against the baseline")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds (both sides)")
    return p


def run(args: argparse.Namespace) -> int:
    result = diff_paths(args.a, args.b, rules_file=args.rules)
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(result.format_text())
    return 0
