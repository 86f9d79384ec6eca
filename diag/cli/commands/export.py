"""``ttft export CAPTURE… -o FILE``: one row per request (client and server joined) as Parquet, CSV or JSONL;
``ttft export CAPTURE… --to-clickhouse URL``: every span into the Collector's ClickHouse table.

Exit codes (:mod:`diag.ground.exit_codes`): 2 when the input is not a capture, the output format is
unknown, there is no request (or span) to export, or ClickHouse refuses; 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from diag.ground.exit_codes import BAD_INPUT, OK


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
    p.add_argument("-o", "--output", metavar="FILE", help="requests.parquet, requests.csv or requests.jsonl")
    p.add_argument("--no-warmup", action="store_true", help="leave out the probe's warm-up requests")
    ch = p.add_argument_group("into ClickHouse (the Collector's otel_traces table)")
    ch.add_argument("--to-clickhouse", metavar="URL", help="write every span of the captures as the OpenTelemetry "
                    "Collector's clickhouseexporter writes it (http://host:8123[/db] or chdb:PATH), making the table "
                    "with the exporter's DDL when missing; ttft analyze --from-clickhouse reads it back")
    ch.add_argument("--table", default="otel_traces", metavar="NAME", help="the trace table (default otel_traces)")
    ch.add_argument("--resource", action="append", default=[], metavar="KEY=VALUE",
                    help="set a resource attribute on every span, e.g. service.instance.id=replica-1 for a "
                    "capture from a replica that did not name itself (repeatable)")
    return p


def _resource(items: list[str]) -> dict[str, str]:
    from diag.cli import UsageError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad --resource {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def to_clickhouse(args: argparse.Namespace) -> int:
    """``--to-clickhouse URL``: every span of the captures into the trace table."""
    from diag.analysis import expand_capture_paths
    from diag.ground.capture import CaptureError
    from diag.cli import UsageError
    from diag.ground.clickhouse import ClickHouseError, connect
    from diag.ground.clickhouse_load import load_captures

    overrides = _resource(args.resource)
    try:
        conn = connect(args.to_clickhouse)
        try:
            n, warnings = load_captures(conn, expand_capture_paths(args.captures), args.table, overrides)
        finally:
            conn.close()
    except (ClickHouseError, CaptureError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    for w in warnings:
        print(f"ttft export: warning: {w}", file=sys.stderr)
    if not n:
        print(f"ttft export: no span in {', '.join(args.captures)}; nothing written", file=sys.stderr)
        return BAD_INPUT
    print(f"ttft export: {n} spans -> {conn.target.redacted()} table {conn.target.database}.{args.table}",
          file=sys.stderr)
    return OK


def run(args: argparse.Namespace) -> int:
    from diag.analysis import analyze_paths
    from diag.cli import UsageError
    from diag.analysis.report.export import ExportError, export_format, request_rows, write_rows

    if args.to_clickhouse:
        if args.output:
            raise UsageError("give -o FILE or --to-clickhouse URL, not both")
        return to_clickhouse(args)
    if not args.output:
        raise UsageError("give -o FILE (or --to-clickhouse URL)")
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
