"""``ttft watch URL``: the live dashboard on an external stack.

Starts, each when it comes up (else a one-line note on screen): a
low-rate probe against the OpenAI-compatible URL (client TTFT), /metrics scraping, an OTLP
receiver for the engine's own spans, and NVML with ``--gpu``. Everything goes into one capture
(``-o``, default ``./ttft-watch-<time>``) that ``ttft view`` / ``ttft analyze`` read later.
"""

from __future__ import annotations

import argparse
import sys
import time


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "watch",
        help="live dashboard on a running OpenAI-compatible server (probe + /metrics + OTLP + NVML)",
        description="Watch a serving stack live: a low-rate probe measures client TTFT, /metrics is scraped, "
        "an OTLP receiver takes the engine's spans (point its exporter at --otlp-port), NVML samples the GPUs "
        "with --gpu. The verdict follows the last --window seconds. Everything is written to a capture.",
    )
    p.add_argument("url", metavar="URL", help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--metrics", metavar="[ROLE=]URL", action="append", default=None,
                   help="Prometheus /metrics URL (default: URL/metrics; --no-metrics to skip); a disaggregated "
                   "prefill/decode pair: --metrics prefill=URL --metrics decode=URL, each instance's own /metrics")
    p.add_argument("--otlp-port", type=int, metavar="P", default=4318,
                   help="port of the OTLP/HTTP receiver on 127.0.0.1 (default 4318; 0 picks one; --no-otlp: none)")
    p.add_argument("--probe-rate", type=float, metavar="R", default=0.5,
                   help="probe requests per second (default 0.5; --no-probe: none)")
    off = p.add_argument_group("sources off (one way for each: --no-SOURCE; the older 'none', -1 and 0 still work)")
    off.add_argument("--no-metrics", action="store_true", help="do not scrape /metrics")
    off.add_argument("--no-otlp", action="store_true", help="no OTLP receiver for the engine's spans")
    off.add_argument("--no-probe", action="store_true", help="no probe requests (no client TTFT)")
    p.add_argument("--probe-prompt", type=int, metavar="TOKENS", default=64, help="probe prompt length")
    p.add_argument("--probe-output", type=int, metavar="TOKENS", default=16, help="probe output length")
    p.add_argument("--probe-timeout", type=float, metavar="S", default=30.0,
                   help="seconds a probe request may go unanswered before it fails as a timeout (default 30)")
    p.add_argument("--model", default=None, help="model name to send (default: the server's first model)")
    p.add_argument("--gpu", action="store_true", help="sample GPU counters with NVML")
    p.add_argument("-o", "--output", metavar="CAPTURE", default=None,
                   help="capture directory to write (default ./ttft-watch-YYYYmmdd-HHMMSS)")
    p.add_argument("--window", type=float, metavar="S", default=60.0, help="analysis window, seconds (default 60)")
    p.add_argument("--refresh", type=float, metavar="S", default=1.0, help="seconds between screen refreshes")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds")
    p.add_argument("--slo", metavar="SPEC", help="SLOs, e.g. ttft_p99=2s,tpot_p99=100ms")
    p.add_argument("--expose", metavar="[HOST:]PORT", default=None,
                   help="serve the live verdict, its confidence and the stage shares as Prometheus metrics at "
                   "http://HOST:PORT/metrics (ttft_verdict{category=...}, ...; host 127.0.0.1 unless given), "
                   "for a Grafana alert")
    p.add_argument("--expose-interval", type=float, metavar="S", default=5.0,
                   help="seconds between two verdicts served by --expose (default 5)")
    p.add_argument("-d", "--duration", type=float, metavar="S", default=None,
                   help="without a terminal: how long to collect before printing the verdict (default 30)")
    return p


def run(args: argparse.Namespace) -> int:
    from diag.cli import UsageError

    if args.no_metrics or args.metrics == ["none"]:
        args.metrics = "none"
    if args.no_otlp:
        args.otlp_port = -1
    if args.no_probe:
        args.probe_rate = 0.0
    if args.probe_rate < 0 or args.window <= 0 or args.refresh <= 0 or args.probe_timeout <= 0:
        raise UsageError("--probe-rate must be >= 0, --window, --refresh and --probe-timeout > 0")
    from collectors.probe.endpoint import split_url
    from diag.ground.slo import slo_option

    try:
        split_url(args.url)  # a URL that can never answer is refused here, not retried on screen
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    slo = slo_option(args.slo)
    expose = None
    if args.expose is not None:
        from tui.expose import parse_expose

        if args.expose_interval <= 0:
            raise UsageError("--expose-interval must be > 0")
        try:
            expose = parse_expose(args.expose)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    targets: list[MetricsTarget] = []
    if args.metrics != "none":
        from collectors.prometheus import MetricsTarget, metrics_targets

        try:
            targets = metrics_targets(args.metrics) if args.metrics else [MetricsTarget(args.url)]
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    out = args.output or f"ttft-watch-{time.strftime('%Y%m%d-%H%M%S')}"
    from collectors.live import LiveCollection
    from collectors.live_probe import ProbePlan, steady_plan
    from tui.sources import LiveSource

    live = LiveCollection(out, meta={"kind": "watch", "watch": {"url": args.url}})
    if args.metrics != "none":
        for target in targets:
            live.start_prometheus(target.url, source=target.source, entity=target.entity)
    if args.otlp_port >= 0:
        live.start_otlp(args.otlp_port)
    if args.gpu:
        live.start_nvml()
    else:
        live.notes.append("GPU counters off (--gpu to sample NVML): showing the engine's busy timeline if it sends step spans")
    if args.probe_rate > 0:
        plan = ProbePlan(rate_rps=args.probe_rate, input_tokens=args.probe_prompt, output_tokens=args.probe_output)
        live.start_probe(args.url, steady_plan(plan), plan.input_tokens, plan.output_tokens, model=args.model,
                         timeout_s=args.probe_timeout)
    else:
        live.notes.append("probe off (--probe-rate 0): no client TTFT")
    live.start_pump()
    source = LiveSource(out, window_s=args.window, monitors=live.monitors(), title=f"ttft watch {args.url}",
                        follow_outages=True)
    for n in live.notes:
        source.add_note(n)
    exporter = None
    if expose is not None:
        from tui.expose import VerdictExporter

        try:
            exporter = VerdictExporter(out, *expose, window_s=args.window, interval_s=args.expose_interval, slo=slo,
                                       rules_file=args.rules).start()
        except OSError as exc:
            live.stop()
            raise UsageError(f"--expose {args.expose}: cannot listen ({exc.strerror or exc})") from None
        print(f"ttft watch: serving the live verdict at {exporter.url}", file=sys.stderr)
    try:
        if sys.stdin.isatty() and sys.stdout.isatty():
            from tui.app import run_app

            code = run_app(source, refresh_s=args.refresh, slo=slo, rules_file=args.rules)
        else:
            code = _headless(source, args.duration or 30.0, slo, args.rules)
    finally:
        if exporter is not None:
            exporter.stop()
        live.stop()
    print(f"ttft watch: capture written to {out} (open it with: ttft view {out})", file=sys.stderr)
    return code


def _headless(source: object, duration_s: float, slo: dict[str, float] | None, rules_file: str | None) -> int:
    """No terminal: collect for ``duration_s`` and print the verdict of the last window. Exit
    codes as ``ttft analyze``'s: 2 when nothing answered (the server is down or refuses every
    request), 1 when an SLO given is broken, else 0."""
    from tui import adapters

    print(f"ttft watch: no terminal; collecting for {duration_s:.0f} s, then printing the verdict", file=sys.stderr)
    time.sleep(duration_s)
    snap = source.poll()  # type: ignore[attr-defined]
    for e in snap.errors:
        print(f"feed down: {e}")
    run = adapters.run_rules(snap.tables, snap.window_ns, slo=slo, rules_file=rules_file)
    from diag.cli.commands.analyze import diagnosis_exit_code
    from diag.analysis.report.text import format_diagnosis

    print(format_diagnosis(run.diagnosis))
    return diagnosis_exit_code(run.diagnosis, snap.tables, slo, "watch")
