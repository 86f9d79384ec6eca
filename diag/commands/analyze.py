"""``ttft analyze CAPTURE [CAPTURE ...]``: stage decomposition, verdict and findings.

Exit codes (:mod:`diag.exit_codes`): 1 when an SLO given with ``--slo`` is broken (checked as
``ttft report`` checks it), 2 when there is nothing to judge (verdict ``no_data``) or the input
is not a capture, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from diag.analysis import Analysis, analyze_paths
from diag.exit_codes import BAD_INPUT, FAILED_GATE, OK
from diag.report.text import format_analysis


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "analyze",
        help="decompose TTFT by stage and name the bottleneck",
        description="Load one or more captures (client and server captures are joined by trace id), "
        "print the per-stage TTFT decomposition and the rule engine's verdict. Exit code 1 when an SLO is broken.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="capture directory (or a spans .jsonl file)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds")
    p.add_argument("--slo", metavar="SPEC", help="SLOs to gate on, each with a unit (ms, s, us), "
                   "e.g. ttft_p99=2s,tpot_p99=100ms")
    return p


def run(args: argparse.Namespace) -> int:
    from diag.slo import slo_option

    slo = slo_option(args.slo)
    analysis = analyze_paths(args.captures, rules_file=args.rules, slo=slo)
    if args.json:
        from diag.report.jsondoc import analysis_document

        json.dump(analysis_document(analysis), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(format_analysis(analysis))
    return verdict_exit_code(analysis, slo, "analyze")


def verdict_exit_code(analysis: Analysis, slo: Mapping[str, float] | None, command: str) -> int:
    """The contract's code for an analysis: 2 nothing to judge, 1 an SLO broken, else 0; the
    reason goes to stderr as one line."""
    d = analysis.diagnosis
    if d is not None and d.verdict.category == "no_data":
        print(f"ttft {command}: nothing to judge: {d.verdict.title}", file=sys.stderr)
        return BAD_INPUT
    if not slo:
        return OK
    from diag.report.summary import evaluate_slo, latency_percentiles

    checks = d.features.value("slo_checks") if d is not None else None
    results = evaluate_slo(latency_percentiles(analysis.tables), dict(slo),
                           checks if isinstance(checks, Mapping) else None)
    broken = [s for s in results if not s.passed]
    if broken:
        print("SLO broken: " + "; ".join(f"{s.key}: {s.detail}" for s in broken), file=sys.stderr)
        return FAILED_GATE
    return OK
