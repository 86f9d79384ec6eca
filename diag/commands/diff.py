"""``ttft diff A B [--json] [--rules FILE]``: what changed between two captures and why.

Each side is one capture, a directory of captures (a scenario run), or several captures
joined with commas (``client-a,server-a``): a side's captures are joined by trace id, as
``ttft analyze`` joins them."""

from __future__ import annotations

import argparse
import json
import sys

from diag.report.diff import diff_paths


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "diff",
        help="compare two captures: what changed, and which finding explains it",
        description="Compare capture A (baseline) with capture B: TTFT/ITL percentiles, per-stage p50 and share, "
        "throughput, device busy, KV usage and queue depth; name the stage that moved most and the finding "
        "whose category owns it; say whether the verdict changed.",
    )
    p.add_argument("a", metavar="A", help="baseline: a capture (directory or spans .jsonl), a directory of captures, "
                   "or captures joined by trace id given as PATH,PATH (e.g. client-a,server-a)")
    p.add_argument("b", metavar="B", help="what to compare against the baseline (same forms as A)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds (both sides)")
    return p


def run(args: argparse.Namespace) -> int:
    result = diff_paths(_side(args.a), _side(args.b), rules_file=args.rules)
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(result.format_text())
    return 0


def _side(arg: str) -> list[str]:
    """One side's captures: ``PATH`` or ``PATH,PATH,...`` (empty items ignored)."""
    return [p for p in (x.strip() for x in arg.split(",")) if p] or [arg]
