"""``ttft diff A B [--json] [--rules FILE] [--fail-on KEY=BOUND,...]``: what changed between two captures and why.

Each side is one capture, a directory of captures (a scenario run), or several captures
joined with commas (``client-a,server-a``): a side's captures are joined by trace id, as
``ttft analyze`` joins them. Exit codes (:mod:`diag.ground.exit_codes`): 1 when a ``--fail-on`` bound is
crossed, 2 on bad input or when a side has nothing to judge (verdict ``no_data``), else 0."""

from __future__ import annotations

import argparse
import json
import sys

from diag.ground.exit_codes import BAD_INPUT, FAILED_GATE, OK
from diag.analysis.report.diff import diff_paths


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
    p.add_argument("--fail-on", metavar="SPEC",
                   help="regression gate: exit 1 when a metric moved beyond its bound from A to B, e.g. "
                   "ttft_p99=+10%%,itl_p99=+20ms,requests=-5%% (keys: the metric names in lower case with _)")
    return p


def run(args: argparse.Namespace) -> int:
    from diag.analysis.report.diff_gate import check_fail_on, parse_fail_on

    bounds = parse_fail_on(args.fail_on) if args.fail_on else []  # a bad spec fails before any work
    result = diff_paths(_side(args.a), _side(args.b), rules_file=args.rules)
    checks = check_fail_on(bounds, result)
    if args.json:
        doc = result.to_dict()
        if checks:
            doc["fail_on"] = [c.to_dict() for c in checks]
        json.dump(doc, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(result.format_text())
    empty = [side for side, v in (("A", result.verdict_a), ("B", result.verdict_b)) if v is not None and v.category == "no_data"]
    if empty:
        print(f"ttft diff: nothing to judge on side {' and '.join(empty)}", file=sys.stderr)
        return BAD_INPUT
    failed = [c for c in checks if c.failed]
    if failed:
        print("regression: " + "; ".join(c.detail for c in failed), file=sys.stderr)
        return FAILED_GATE
    if checks:
        print("no regression: " + "; ".join(c.detail for c in checks), file=sys.stderr)
    return OK


def _side(arg: str) -> list[str]:
    """One side's captures: ``PATH`` or ``PATH,PATH,...`` (empty items ignored)."""
    return [p for p in (x.strip() for x in arg.split(",")) if p] or [arg]
