"""``ttft scrape URL -o CAPTURE``: poll an engine's /metrics (or read a Prometheus server) into a capture."""

from __future__ import annotations

import argparse
import sys
import threading
import time

from collectors import prometheus_adapters as pa
from collectors.prometheus import PrometheusAPIError, PrometheusAPIReader, PrometheusScraper, SOURCE
from diag.exit_codes import BAD_INPUT, OK

FLUSH_EVERY_S = 10.0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "scrape",
        help="poll an engine's /metrics into canonical time series",
        description="Poll URL (an engine's /metrics: vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM/Triton or "
        "ttft serve) every --interval seconds and write canonical series (queue/prefill/TTFT/ITL means and "
        "percentiles, KV usage, waiting, running, token rates) to CAPTURE/series/prometheus.parquet. "
        "With --from-prometheus, URL is a Prometheus server and the last --duration seconds are read "
        "for every replica (instance) at once.",
    )
    p.add_argument("url", metavar="URL", help="e.g. http://127.0.0.1:8000/metrics")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between scrapes (default 1)")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("-o", "--output", required=True, metavar="CAPTURE", help="capture directory to write")
    p.add_argument("--engine", choices=sorted(pa.ADAPTERS_BY_ENGINE), help="skip detection from the metric names")
    p.add_argument("--timeout", type=float, default=2.0, metavar="S", help="per-scrape timeout (default 2)")
    p.add_argument("--entity", default="", help="entity name for the rows (e.g. a replica name)")
    p.add_argument("--from-prometheus", action="store_true",
                   help="URL is a Prometheus server: read the last --duration seconds with PromQL")
    p.add_argument("--window", default="30s", help="PromQL rate window with --from-prometheus (default 30s)")
    return p


def run(args: argparse.Namespace, stop_event: threading.Event | None = None) -> int:
    """Scrape until Ctrl-C, ``--duration`` or ``stop_event``; 2 (nothing to judge) when no scrape succeeded."""
    from diag.capture import CaptureWriter
    from diag.cli import UsageError

    if args.interval <= 0:
        raise UsageError("--interval must be > 0")
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be > 0")
    if args.from_prometheus:
        return _run_api(args)
    writer = CaptureWriter(args.output, meta={"command": "scrape"})
    scraper = PrometheusScraper(args.url, interval_s=args.interval, timeout_s=args.timeout, engine=args.engine,
                                entity=args.entity)
    print(f"ttft scrape: polling {args.url} every {args.interval:g}s -> {args.output} (Ctrl-C to stop)", flush=True)
    stop = stop_event or threading.Event()
    start = time.monotonic()
    deadline = None if args.duration is None else start + args.duration
    last_flush = start
    scraper.start()
    try:
        while not stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if now - last_flush >= FLUSH_EVERY_S:
                writer.write_series(SOURCE, scraper.collect())
                last_flush = now
            stop.wait(0.2 if deadline is None else max(0.0, min(0.2, deadline - now)))
    except KeyboardInterrupt:
        pass
    finally:
        scraper.stop()
        frame = scraper.collect()
        writer.write_series(SOURCE, frame)
        stats = scraper.stats()
        writer.update_meta(prometheus_scrape=stats)
        writer.close()
    ok = stats["scrapes"] - stats["errors"]
    msg = (f"ttft scrape: {stats['scrapes']} scrapes of {args.url} ({stats['engine'] or 'engine not detected'}), "
           f"{len(frame)} rows, {stats['errors']} errors")
    if stats["last_error"]:
        msg += f" (last: {stats['last_error']})"
    print(msg, file=sys.stderr)
    return OK if ok > 0 else BAD_INPUT


def _run_api(args: argparse.Namespace) -> int:
    from diag.capture import CaptureWriter
    from diag.cli import UsageError

    reader = PrometheusAPIReader(args.url, engine=args.engine, window=args.window, timeout_s=args.timeout * 5)
    end = time.time()
    start = end - (args.duration or 3600.0)
    try:
        frame = reader.read(start, end, args.interval)
    except PrometheusAPIError as exc:
        raise UsageError(str(exc)) from None
    with CaptureWriter(args.output, meta={"command": "scrape --from-prometheus"}) as writer:
        writer.write_series(SOURCE, frame)
        writer.update_meta(prometheus_api={"url": args.url, "engine": reader.engine, "window": args.window,
                                           "start_unix_s": start, "end_unix_s": end, "errors": reader.errors})
    entities = frame["entity"].nunique() if len(frame) else 0
    print(f"ttft scrape: {len(frame)} rows for {entities} replicas ({reader.engine}) from {args.url}"
          + (f"; {len(reader.errors)} queries failed (first: {reader.errors[0]})" if reader.errors else ""),
          file=sys.stderr)
    return OK if len(frame) else BAD_INPUT
