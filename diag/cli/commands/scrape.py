"""``ttft scrape URL -o CAPTURE``: poll an engine's /metrics (or read a Prometheus server, or saved
scrapes with ``--from-files``) into a capture. ``ttft scrape prefill=URL decode=URL`` polls the two
instances of a disaggregated pair, each on its own thread, into ``series/prometheus-<role>`` with the
role as the rows' entity. Exit code 2 when nothing was scraped (from either instance of a pair)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from collectors import prometheus_adapters as pa
from collectors.prometheus import SOURCE, ExpositionError, PrometheusScraper, adapt_texts, parse_exposition
from collectors.prometheus_api import PrometheusAPIError, PrometheusAPIReader
from diag.ground.capture_files import SCRAPED_FILES_KEY, natural_key
from diag.ground.exit_codes import BAD_INPUT, OK

if TYPE_CHECKING:
    import pandas as pd

FLUSH_EVERY_S = 10.0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "scrape",
        help="poll an engine's /metrics into canonical time series",
        description="Poll URL (an engine's /metrics: vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM/Triton or "
        "ttft serve) every --interval seconds and write canonical series (queue/prefill/TTFT/ITL means and "
        "percentiles, KV usage, waiting, running, token rates) to CAPTURE/series/prometheus.parquet. "
        "With --from-prometheus, URL is a Prometheus server and the last --duration seconds are read "
        "for every replica (instance) at once. With --from-files, saved /metrics texts (one scrape per file, "
        "e.g. `curl -s URL/metrics > metrics.t$i.prom` in a loop) become the capture's series: times from "
        "--start and --interval when given, else from the files' modification times. Two instances of a "
        "disaggregated prefill/decode pair: `ttft scrape prefill=URL decode=URL`, each scraped on its own and "
        "its series labelled role=prefill / role=decode (what the pd_transfer rule reads).",
    )
    p.add_argument("url", metavar="[ROLE=]URL", nargs="*",
                   help="e.g. http://127.0.0.1:8000/metrics; a disaggregated prefill/decode pair: prefill=URL "
                   "decode=URL, each instance's own /metrics, its series labelled with its role")
    p.add_argument("--from-files", nargs="+", metavar="FILE.prom",
                   help="saved scrapes (Prometheus text) instead of URL, read in natural name order (t2 before t10)")
    p.add_argument("--start", type=float, metavar="UNIX_S",
                   help="with --from-files: Unix time of the first scrape (default: its file's modification time)")
    p.add_argument("--interval", type=float, default=None, metavar="S",
                   help="seconds between scrapes (default 1; with --from-files: default the files' modification times)")
    p.add_argument("-d", "--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("-o", "--output", required=True, metavar="CAPTURE", help="capture directory to write")
    p.add_argument("--engine", choices=sorted(pa.ADAPTERS_BY_ENGINE), help="skip detection from the metric names")
    p.add_argument("--timeout", type=float, default=2.0, metavar="S", help="per-scrape timeout (default 2)")
    p.add_argument("--entity", default="", help="entity name for the rows (e.g. a replica name)")
    p.add_argument("--from-prometheus", action="store_true",
                   help="URL is a Prometheus server: read the last --duration seconds with PromQL")
    p.add_argument("--window", default="30s", metavar="PROMQL_DURATION", help="PromQL rate window with --from-prometheus (default 30s)")
    return p


def run(args: argparse.Namespace, stop_event: threading.Event | None = None) -> int:
    """Scrape until Ctrl-C, ``--duration`` or ``stop_event``; 2 (nothing to judge) when no scrape succeeded."""
    from diag.ground.capture import CaptureWriter
    from diag.cli import UsageError, stop_on_signals

    urls = list(args.url or [])
    if bool(urls) == (args.from_files is not None):
        raise UsageError("give either URL or --from-files FILE.prom ..., not both or neither")
    from collectors.prometheus import metrics_targets

    try:
        targets = metrics_targets(urls, option="URL") if urls else []
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if any(t.role for t in targets) and (args.from_prometheus or args.entity):
        raise UsageError("prefill=URL decode=URL scrapes two instances' /metrics; not with --from-prometheus "
                         "or --entity")
    args.url = targets[0].url if len(targets) == 1 and not targets[0].role else None
    if args.interval is not None and args.interval <= 0:
        raise UsageError("--interval must be > 0")
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be > 0")
    if args.from_files is not None:
        return run_files(args)
    if args.interval is None:
        args.interval = 1.0
    if args.from_prometheus:
        return _run_api(args)
    writer = CaptureWriter(args.output, meta={"command": "scrape"})
    scrapers = {t.source: PrometheusScraper(t.url, interval_s=args.interval, timeout_s=args.timeout,
                                            engine=args.engine, entity=t.entity or args.entity) for t in targets}
    what = " and ".join(f"{t.role}={t.url}" if t.role else t.url for t in targets)
    print(f"ttft scrape: polling {what} every {args.interval:g}s -> {args.output} (Ctrl-C to stop)", flush=True)
    stop = stop_event or threading.Event()
    start = time.monotonic()
    deadline = None if args.duration is None else start + args.duration
    last_flush = start
    for scraper in scrapers.values():
        scraper.start()
    frames: dict[str, pd.DataFrame] = {}
    stats: dict[str, dict[str, object]] = {}
    try:
        with stop_on_signals(stop):
            while not stop.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                if now - last_flush >= FLUSH_EVERY_S:
                    for source, scraper in scrapers.items():
                        writer.write_series(source, scraper.collect())
                    last_flush = now
                stop.wait(0.2 if deadline is None else max(0.0, min(0.2, deadline - now)))
    except KeyboardInterrupt:
        pass
    finally:
        for source, scraper in scrapers.items():
            scraper.stop()
            frames[source] = scraper.collect()
            writer.write_series(source, frames[source])
            stats[source] = scraper.stats()
        one = next(iter(stats.values()))
        writer.update_meta(prometheus_scrape=one if len(stats) == 1 else
                           {t.role: stats[t.source] for t in targets})
        writer.close()
    ok = True
    for t in targets:
        st, frame = stats[t.source], frames[t.source]
        ok = ok and int(st["scrapes"]) - int(st["errors"]) > 0  # type: ignore[call-overload]
        msg = (f"ttft scrape: {st['scrapes']} scrapes of {t.url}{f' ({t.role})' if t.role else ''} "
               f"({st['engine'] or 'engine not detected'}), {len(frame)} rows, {st['errors']} errors")
        if st["last_error"]:
            msg += f" (last: {st['last_error']})"
        print(msg, file=sys.stderr)
    return OK if ok else BAD_INPUT


def read_api_capture(url: str, out: str, duration_s: float, step_s: float, window: str, by: str = "instance",
                     engine: str | None = None, timeout_s: float = 10.0,
                     command: str = "scrape --from-prometheus") -> tuple[pd.DataFrame, PrometheusAPIReader]:
    """The last ``duration_s`` seconds of every replica's canonical series from the Prometheus
    server at ``url``, every ``step_s`` seconds, written as a series-only capture at ``out``.
    Returns the rows and the reader (its ``engine`` and per-query ``errors``); raises UsageError
    when the server is unreachable or has no known engine metrics."""
    from diag.ground.capture import CaptureWriter
    from diag.cli import UsageError

    reader = PrometheusAPIReader(url, engine=engine, window=window, by=by, timeout_s=timeout_s)
    end = time.time()
    start = end - duration_s
    try:
        frame = reader.read(start, end, step_s)
    except PrometheusAPIError as exc:
        raise UsageError(str(exc)) from None
    with CaptureWriter(out, meta={"command": command}) as writer:
        writer.write_series(SOURCE, frame)
        writer.update_meta(prometheus_api={"url": url, "engine": reader.engine, "window": window, "by": by,
                                           "start_unix_s": start, "end_unix_s": end, "errors": reader.errors})
    return frame, reader


def _run_api(args: argparse.Namespace) -> int:
    frame, reader = read_api_capture(args.url, args.output, args.duration or 3600.0, args.interval, args.window,
                                     engine=args.engine, timeout_s=args.timeout * 5)
    entities = frame["entity"].nunique() if len(frame) else 0
    print(f"ttft scrape: {len(frame)} rows for {entities} replicas ({reader.engine}) from {args.url}"
          + (f"; {len(reader.errors)} queries failed (first: {reader.errors[0]})" if reader.errors else ""),
          file=sys.stderr)
    return OK if len(frame) else BAD_INPUT


# --- saved scrapes (--from-files) ------------------------------------------------------------
# Each file is one scrape, read in natural name order (metrics.t2 before metrics.t10). Times are
# --start + k * --interval when --interval is given (--start defaults to the first file's
# modification time), else each file's modification time, which must then increase. The texts go
# through collectors.prometheus.adapt_texts (prometheus_client's parser, the engine adapters), as
# a live scrape's do; meta.json records the files read so the capture stops warning about them.


def scrape_times(paths: list[Path], start_s: float | None, interval_s: float | None) -> list[float]:
    """Unix seconds of each saved scrape (see the module docstring); UsageError when the files'
    times cannot order them."""
    from diag.cli import UsageError

    if interval_s is not None:
        first = start_s if start_s is not None else paths[0].stat().st_mtime
        return [first + k * interval_s for k in range(len(paths))]
    mtimes = [p.stat().st_mtime for p in paths]
    if any(b <= a for a, b in zip(mtimes, mtimes[1:])):
        raise UsageError("the saved scrapes' modification times do not increase in name order (copied or checked "
                         "out files?): give --interval S, the seconds between scrapes (and --start UNIX_S)")
    shift = 0.0 if start_s is None else start_s - mtimes[0]
    return [t + shift for t in mtimes]


def run_files(args: argparse.Namespace) -> int:
    """Write the saved scrapes' canonical series to ``args.output``; 2 when they held none."""
    from diag.ground.capture import CaptureWriter
    from diag.cli import UsageError

    paths = sorted((Path(f) for f in args.from_files), key=lambda p: natural_key(p.name))
    texts: list[tuple[float, str]] = []
    for path in paths:
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: cannot read: {exc}") from None
        texts.append((0.0, text))
    times = scrape_times(paths, args.start, args.interval)
    texts = [(t, text) for t, (_, text) in zip(times, texts)]
    for path, (ts, text) in zip(paths, texts):
        try:
            parse_exposition(text, ts)
        except ExpositionError as exc:
            raise UsageError(f"{path}: {exc}") from None
    try:
        frame = adapt_texts(texts, engine=args.engine, entity=args.entity)
    except ValueError as exc:  # an unknown --engine
        raise UsageError(str(exc)) from None
    out = Path(args.output)
    names = [str(p.resolve().relative_to(out.resolve())) if p.resolve().parent == out.resolve() else str(p)
             for p in paths]
    with CaptureWriter(out, meta={"command": "scrape --from-files"}) as writer:
        writer.write_series(SOURCE, frame)
        writer.update_meta(**{SCRAPED_FILES_KEY: {"files": names, "start_unix_s": times[0],
                                                  "end_unix_s": times[-1], "interval_s": args.interval}})
    engines = "engine not detected" if frame.empty else f"{frame['series'].nunique()} series"
    print(f"ttft scrape: {len(paths)} saved scrapes -> {out} ({len(frame)} rows, {engines})", file=sys.stderr)
    return OK if len(frame) else BAD_INPUT
