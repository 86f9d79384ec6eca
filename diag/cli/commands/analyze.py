"""``ttft analyze CAPTURE [CAPTURE ...]``: stage decomposition, verdict and findings.

Exit codes (:mod:`diag.ground.exit_codes`): 1 when an SLO given with ``--slo`` is broken (checked as
``ttft report`` checks it), 2 when there is nothing to judge (verdict ``no_data``) or the input
is not a capture, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from diag.analysis import Analysis, analyze_paths
from diag.analysis.fleet import FleetAnalysis
from diag.ground.tables import Tables
from diag.ground.exit_codes import BAD_INPUT, FAILED_GATE, OK
from diag.analysis.fleet_traces import DEFAULT_BY
from diag.analysis.report.text import format_analysis
from rules import Diagnosis


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "analyze",
        help="decompose TTFT by stage and name the bottleneck",
        description="Load one or more captures (client and server captures are joined by trace id), "
        "print the per-stage TTFT decomposition and the rule engine's verdict. Exit code 1 when an SLO is broken.",
    )
    p.add_argument("captures", nargs="*", metavar="CAPTURE", help="capture directory (or a spans .jsonl file)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also list each rule that could not run and what it needed (feature names)")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds")
    p.add_argument("--slo", metavar="SPEC", help="SLOs to gate on, each with a unit (ms, s, us), "
                   "e.g. ttft_p99=2s,tpot_p99=100ms")
    fleet = p.add_argument_group("fleet (one verdict per replica)")
    fleet.add_argument("--by", metavar="LABEL", help="judge each replica of the engine series on its own (the series' "
                       "replica label, e.g. instance), then the fleet, and name the hot replica")
    fleet.add_argument("--from-prometheus", metavar="URL", help="read the engines' series from a Prometheus server "
                       "(or Thanos/Mimir) instead of captures; implies --by instance unless --by is given")
    fleet.add_argument("--from-clickhouse", metavar="URL", help="read the fleet's traces from ClickHouse, in the "
                       "table the OpenTelemetry Collector's clickhouseexporter writes (http://host:8123[/db], "
                       "https://user:pass@host:8443[/db], or chdb:PATH for a local chdb directory); implies "
                       f"--by {DEFAULT_BY} unless --by is given (a resource or span attribute, or service.name)")
    fleet.add_argument("--table", default="otel_traces", metavar="NAME",
                       help="with --from-clickhouse: the trace table (default otel_traces)")
    fleet.add_argument("--service", metavar="NAME", help="with --from-clickhouse: only the traces this service "
                       "(resource service.name) has a span in")
    fleet.add_argument("--since", default="1h", metavar="DURATION",
                       help="with --from-clickhouse: the last DURATION of traces, e.g. 15m, 1h, 2d (default 1h)")
    fleet.add_argument("--sample", type=int, default=5000, metavar="N",
                       help="with --from-clickhouse: the rules judge each replica's N most recent requests "
                       "(their spans are read); the aggregates cover every request (default 5000)")
    fleet.add_argument("-d", "--duration", type=float, default=300.0, metavar="S",
                       help="with --from-prometheus: the last S seconds (default 300)")
    fleet.add_argument("--window", default="30s", metavar="PROMQL_DURATION",
                       help="with --from-prometheus: PromQL rate window, e.g. 30s; with --from-clickhouse: the "
                       "width of each row of the per-window aggregates (default 30s)")
    fleet.add_argument("--step", type=float, default=5.0, metavar="S",
                       help="with --from-prometheus: seconds between points read (default 5)")
    fleet.add_argument("-o", "--output", metavar="CAPTURE",
                       help="with --from-prometheus: also keep the series read as a capture; with --from-clickhouse: "
                       "keep each replica's sampled spans as a capture CAPTURE/<replica>/ for report, view, diff "
                       "and export (default: not kept)")
    return p


def run(args: argparse.Namespace) -> int:
    from diag.ground.slo import slo_option

    slo = slo_option(args.slo)
    if args.from_prometheus or args.by or args.from_clickhouse:
        return run_fleet(args, slo)
    if not args.captures:
        from diag.cli import UsageError

        raise UsageError("give a CAPTURE (or --from-prometheus URL, or --from-clickhouse URL)")
    analysis = analyze_paths(args.captures, rules_file=args.rules, slo=slo)
    if args.json:
        from diag.analysis.report.jsondoc import analysis_document

        json.dump(analysis_document(analysis), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(format_analysis(analysis, args.verbose))
    return verdict_exit_code(analysis, slo, "analyze")


def run_fleet(args: argparse.Namespace, slo: Mapping[str, float] | None) -> int:
    """``--by LABEL`` / ``--from-prometheus URL``: per-replica verdicts; exit codes as for one capture,
    taken on the fleet's analysis (2 when no replica has series, 1 when the fleet breaks an SLO)."""
    import tempfile

    from diag.ground.capture import CaptureError
    from diag.cli import UsageError
    from diag.analysis.fleet import analyze_fleet
    from diag.analysis.report.fleet import fleet_document, format_fleet

    if args.from_clickhouse:
        fleet = run_clickhouse(args, slo)
    else:
        by = args.by or "instance"
        with tempfile.TemporaryDirectory(prefix="ttft-fleet-") as tmp:
            paths = list(args.captures)
            if args.from_prometheus:
                if paths:
                    raise UsageError("give captures or --from-prometheus URL, not both")
                paths = [read_prometheus(args, by, args.output or f"{tmp}/fleet")]
            try:
                fleet = analyze_fleet(paths, by=by, rules_file=args.rules, slo=dict(slo) if slo else None)
            except CaptureError as exc:
                raise UsageError(str(exc)) from None
    if args.json:
        json.dump(fleet_document(fleet), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(format_fleet(fleet, args.verbose))
    return verdict_exit_code(fleet.fleet, slo, "analyze")


def run_clickhouse(args: argparse.Namespace, slo: Mapping[str, float] | None) -> FleetAnalysis:
    """``--from-clickhouse URL``: per-replica verdicts from the fleet's traces (``diag.analysis.fleet_traces``);
    a bad URL, a missing table, an empty window or a bad option is a usage error (one line)."""
    from diag.ground.capture import CaptureError
    from diag.cli import UsageError
    from diag.ground.clickhouse import ClickHouseError
    from diag.analysis.fleet_traces import StoreQuery, analyze_store, read_store, write_captures
    from diag.ground.units import parse_duration_s

    if args.captures:
        raise UsageError("give captures or --from-clickhouse URL, not both")
    series = None
    if args.from_prometheus:  # joined: each replica gets the series whose instance label is its name
        import tempfile

        from diag.ground.capture import load_capture

        with tempfile.TemporaryDirectory(prefix="ttft-fleet-") as tmp:
            series = load_capture(read_prometheus(args, "instance", f"{tmp}/fleet")).series
    try:
        q = StoreQuery(args.from_clickhouse, table=args.table, service=args.service,
                       since_s=parse_duration_s(args.since), by=args.by or DEFAULT_BY,
                       window_s=parse_duration_s(args.window), sample=args.sample)
        read = read_store(q)
        if args.output:
            kept = write_captures(read, args.output)
            print(f"ttft analyze: kept {len(kept)} replicas' sampled spans as captures under {args.output}",
                  file=sys.stderr)
        return analyze_store(read, rules_file=args.rules, slo=dict(slo) if slo else None, series=series)
    except (ClickHouseError, CaptureError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def read_prometheus(args: argparse.Namespace, by: str, out: str) -> str:
    """The last ``--duration`` seconds of every replica's engine series from ``--from-prometheus``,
    written as a series-only capture at ``out``; returns ``out``."""
    from diag.cli import UsageError
    from diag.cli.commands.scrape import read_api_capture

    if args.duration <= 0 or args.step <= 0:
        raise UsageError("--duration and --step must be > 0")
    _, reader = read_api_capture(args.from_prometheus, out, args.duration, args.step, args.window, by=by,
                                 command="analyze --from-prometheus")
    for err in reader.errors[:5]:
        print(f"ttft analyze: warning: query failed: {err}", file=sys.stderr)
    return out


def verdict_exit_code(analysis: Analysis, slo: Mapping[str, float] | None, command: str) -> int:
    """The contract's code for an analysis: 2 nothing to judge, 1 an SLO broken, else 0; the
    reason goes to stderr as one line."""
    if analysis.diagnosis is None:
        return OK
    return diagnosis_exit_code(analysis.diagnosis, analysis.tables, slo, command)


def diagnosis_exit_code(d: Diagnosis, tables: Tables, slo: Mapping[str, float] | None, command: str) -> int:
    """:func:`verdict_exit_code` for a diagnosis of ``tables`` (a live window, a capture):
    2 when nothing can be judged (no data, or every request failed: a server that is down),
    1 when an SLO given is broken, else 0."""
    if d.verdict.category == "no_data":
        print(f"ttft {command}: nothing to judge: {d.verdict.title}", file=sys.stderr)
        return BAD_INPUT
    if d.verdict.category == "failures" and not d.features.value("requests_n") and not d.features.value("series_only"):
        print(f"ttft {command}: nothing to judge: no request completed ({d.verdict.title})", file=sys.stderr)
        return BAD_INPUT
    if not slo:
        return OK
    from diag.analysis.report.summary import evaluate_slo, latency_percentiles

    checks = d.features.value("slo_checks")
    results = evaluate_slo(latency_percentiles(tables), dict(slo), checks if isinstance(checks, Mapping) else None)
    broken = [s for s in results if not s.passed]
    if broken:
        print("SLO broken: " + "; ".join(f"{s.key}: {s.detail}" for s in broken), file=sys.stderr)
        return FAILED_GATE
    return OK
