"""``ttft export CAPTURE… -o FILE``: one row per request (client and server joined) as Parquet, CSV or JSONL.

Exit codes (:mod:`diag.exit_codes`): 2 when the input is not a capture, the output format is
unknown, or there is no request to export; 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from diag.exit_codes import BAD_INPUT, OK


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "export",
        help="per-request table (every stage's timing, tokens, errors) as Parquet, CSV or JSONL",
        description="Load one or more captures (client and server joined by trace id) and write one row per "
        "request: ids, segment, warm-up flag, every stage's time, TTFT/E2E/ITL, tokens and the error, with "
        "AIPerf's profile_export names beside ours (time_to_first_token_ms, request_latency_ms, "
        "inter_token_latency_ms, input_sequence_length, output_sequence_length). The format follows "
        "the output's suffix: .parquet, .csv or .jsonl. No prompt text is written.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="capture directory (or a spans .jsonl file)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="requests.parquet, requests.csv or requests.jsonl")
    p.add_argument("--no-warmup", action="store_true", help="leave out the probe's warm-up requests")
    return p


def run(args: argparse.Namespace) -> int:
    from diag.analysis import analyze_paths
    from diag.cli import UsageError
    from diag.report.export import ExportError, export_format, request_rows, write_rows

    try:
        export_format(args.output)
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    analysis = analyze_paths(args.captures, run_rules=False)
    rows = request_rows(analysis.tables)
    if args.no_warmup:
        rows = rows[~rows["warmup"].fillna(False).astype(bool)].reset_index(drop=True)
    if rows.empty:
        print(f"ttft export: no request in {', '.join(args.captures)}; nothing written", file=sys.stderr)
        return BAD_INPUT
    fmt = write_rows(rows, args.output)
    print(f"ttft export: {len(rows)} requests ({int(rows['has_client'].fillna(False).astype(bool).sum())} seen by the "
          f"client, {int(rows['has_server'].fillna(False).astype(bool).sum())} by the server) -> {args.output} ({fmt})",
          file=sys.stderr)
    return OK
