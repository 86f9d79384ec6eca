"""Collectors feeding one capture directory while a live view (``watch``, ``demo``) reads it.

:class:`LiveCollection` owns the :class:`~diag.ground.capture.CaptureWriter` and starts, each only
if it comes up: the probe (client TTFT, ``collectors.probe``), the /metrics scraper
(``collectors.prometheus``), the OTLP receiver (``collectors.otlp_receiver``) and the NVML
sampler (``collectors.nvml``). A collector failing to start becomes a one-line note, never an
exception. A pump thread rewrites ``series/<source>.parquet`` from the scraper and the
sampler every ``pump_interval_s`` so a live reader (``tui.sources.LiveSource``) sees them;
the probe (:class:`collectors.live_probe.ProbeThread`) appends finished requests' spans
every second. Each feed has a :class:`~collectors.feeds.Monitor` that says, in one line, when it
stops: /metrics failing, the OTLP exporter silent after it had sent spans, the probe unable
to reach the server.

Threading: ``start_*``/``stop`` from one owner thread (the command's main thread). The probe
runs its own asyncio loop on a daemon thread; the pump is a daemon thread; ``monitors()``
objects may be checked from any thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.base import SeriesCollector
from collectors.feeds import CallableMonitor, Monitor
from collectors.live_probe import PlanFn, ProbeThread
from collectors.nvml import NvmlSampler
from collectors.otlp_receiver import OTLPReceiver
from collectors.prometheus import PrometheusScraper, metrics_url
from diag.ground.capture import CaptureWriter

@dataclass
class _Feed:
    """One collector of the session and where its rows go (``series/<source>.parquet``)."""

    source: str
    collector: SeriesCollector
    stopped: bool = False
    #: its rows were written once after it stopped: the pump leaves it alone from then on
    written_final: bool = False


class LiveCollection:
    """The collectors of one live session, writing into ``capture_dir``.

    Every time-series collector is a :class:`~collectors.base.SeriesCollector` under a source
    name (:meth:`add_collector`); the pump and :meth:`stop` drive them through that protocol
    only. ``start_prometheus``/``start_nvml`` build the collector, note why it could not start,
    and add it; the OTLP receiver and the probe write spans, not series, and are started apart.
    """

    def __init__(self, capture_dir: str | os.PathLike[str], meta: dict[str, Any] | None = None,
                 pump_interval_s: float = 1.0, writer: CaptureWriter | None = None) -> None:
        self.path = Path(capture_dir)
        self.writer = writer or CaptureWriter(self.path, meta=meta)
        if writer is not None and meta:
            self.writer.update_meta(**meta)
        self.pump_interval_s = pump_interval_s
        self.notes: list[str] = []
        self._monitors: list[Monitor] = []
        #: series collectors by source name, in the order they were added (pump thread reads it)
        self._feeds: dict[str, _Feed] = {}
        self._feeds_lock = threading.Lock()
        self.scraper: PrometheusScraper | None = None  # the most recently started scraper
        #: the /metrics scrapers by source name (for meta.json's stats)
        self.scrapers: dict[str, PrometheusScraper] = {}
        self.nvml: NvmlSampler | None = None
        self.receiver: OTLPReceiver | None = None
        self.probe: ProbeThread | None = None
        self._pump_stop = threading.Event()
        self._pump: threading.Thread | None = None
        self.pump_error = ""

    # --- series collectors ----------------------------------------------------------------------

    def add_collector(self, source: str, collector: SeriesCollector) -> None:
        """Start ``collector`` and pump its rows into ``series/<source>.parquet`` (owner thread).
        A collector already under ``source`` is replaced (its file is rewritten by the new one).
        Raises what ``collector.start()`` raises; then nothing is added."""
        collector.start()
        with self._feeds_lock:
            self._feeds[source] = _Feed(source, collector)

    def stop_collector(self, source: str) -> None:
        """Stop one collector (its engine is going away); its rows are written once more and kept."""
        with self._feeds_lock:
            feed = self._feeds.get(source)
            if feed is not None:
                feed.stopped = True
        if feed is not None:
            try:
                feed.collector.stop()
            except Exception:
                pass

    def collectors(self) -> list[SeriesCollector]:
        """The series collectors added so far, stopped ones included (any thread)."""
        with self._feeds_lock:
            return [f.collector for f in self._feeds.values()]

    def start_prometheus(self, url: str, interval_s: float = 1.0, source: str = "prometheus",
                         entity: str = "") -> bool:
        """Scrape ``url`` (``/metrics`` appended when missing) into ``series/<source>.parquet``, its rows'
        entities under ``entity`` (``role=prefill``: one instance of a disaggregated pair).
        One scraper per ``source``; the demo starts one per engine process."""
        url = metrics_url(url)  # trtllm-serve's JSON /metrics: the scraper moves to /prometheus/metrics
        try:
            scraper = PrometheusScraper(url, interval_s=interval_s, entity=entity)
            self.add_collector(source, scraper)
        except Exception as exc:
            self.notes.append(f"/metrics scraper failed to start: {type(exc).__name__}: {exc}")
            return False
        self.scrapers[source] = scraper
        self.scraper = scraper

        def check() -> str | None:
            with self._feeds_lock:
                feed = self._feeds.get(source)
                stopped = feed is not None and feed.stopped
            if not stopped and scraper.consecutive_errors >= 3:
                return f"/metrics {url}: {scraper.last_error or 'failing'}"
            return None

        self._monitors.append(CallableMonitor(f"metrics {source}", check))
        self.writer.update_meta(live={"metrics_url": url} if source == "prometheus"
                                else {f"metrics_url_{source}": url})
        return True

    def start_nvml(self, interval_s: float = 0.5) -> bool:
        """Sample GPU counters (a note when there is no GPU or no NVML)."""
        try:
            sampler = NvmlSampler(interval_s=interval_s)
        except Exception as exc:
            self.notes.append(f"NVML failed: {type(exc).__name__}: {exc}")
            return False
        if not sampler.available:
            self.notes.append(sampler.note or "NVML unavailable")
            self.writer.update_meta(nvml=sampler.device_info())
            return False
        self.add_collector("nvml", sampler)
        self.nvml = sampler
        self.writer.update_meta(nvml=sampler.device_info())
        return True

    # --- span feeds ---------------------------------------------------------------------------

    def start_otlp(self, port: int, silence_s: float = 10.0) -> int | None:
        """Receive OTLP/HTTP spans on 127.0.0.1:``port`` into the capture; returns the port.
        Its monitor reports an exporter that sent spans and then nothing for ``silence_s``."""
        try:
            self.receiver = OTLPReceiver(self.writer.append_span_request, port=port)
            _, bound = self.receiver.start()
        except OSError as exc:
            self.notes.append(f"OTLP receiver: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}")
            self.receiver = None
            return None
        except Exception as exc:
            self.notes.append(f"OTLP receiver failed: {type(exc).__name__}: {exc}")
            self.receiver = None
            return None
        self.notes.append(f"OTLP/HTTP receiver on http://127.0.0.1:{bound}/v1/traces")
        self.writer.update_meta(live={"otlp_port": bound})
        self._monitors.append(CallableMonitor("otlp", _silence_check(self.receiver, silence_s)))
        return int(bound)

    def start_probe(self, url: str, plan: PlanFn, input_tokens: int = 64, output_tokens: int = 16,
                    concurrency: int = 4, model: str | None = None, timeout_s: float = 60.0) -> bool:
        """Probe ``url`` (client TTFT) following ``plan``; a request unanswered for ``timeout_s``
        fails as a timeout."""
        self.probe = ProbeThread(url, self.writer, plan, input_tokens, output_tokens, concurrency, model,
                                 timeout_s=timeout_s)
        self.probe.start()
        self._monitors.append(CallableMonitor("probe", self.probe.check))
        return True

    def add_monitor(self, monitor: Monitor) -> None:
        self._monitors.append(monitor)

    def monitors(self) -> list[Monitor]:
        return list(self._monitors)

    # --- the series pump ----------------------------------------------------------------------

    def pump_once(self) -> None:
        """Rewrite the series files from the collectors' rows (pump thread or caller)."""
        with self._feeds_lock:
            due = [(feed, feed.stopped) for feed in self._feeds.values() if not feed.written_final]
        for feed, stopped in due:
            frame = feed.collector.collect()
            if len(frame):
                self.writer.write_series(feed.source, frame)
            if stopped:
                with self._feeds_lock:
                    feed.written_final = True

    def _pump_main(self) -> None:
        while not self._pump_stop.wait(self.pump_interval_s):
            try:
                self.pump_once()
                self.pump_error = ""
            except Exception as exc:  # a full disk, say: shown by the monitor, retried
                self.pump_error = f"writing series failed: {type(exc).__name__}: {exc}"

    def start_pump(self) -> None:
        if self._pump is None:
            self._pump = threading.Thread(target=self._pump_main, name="ttft-series-pump", daemon=True)
            self._pump.start()
            self._monitors.append(CallableMonitor("series", lambda: self.pump_error or None))

    # --- shutdown -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything, write the last series and close the capture (idempotent)."""
        if self.probe is not None:
            self.probe.stop()
        self._pump_stop.set()
        if self._pump is not None:
            self._pump.join(5)
        with self._feeds_lock:
            sources = list(self._feeds)
        for source in sources:
            self.stop_collector(source)
        if self.receiver is not None:
            try:
                self.receiver.stop()
            except Exception:
                pass
        try:
            self.pump_once()
        except Exception:
            pass
        stats: dict[str, Any] = {"notes": list(self.notes), "ended_unix_s": time.time()}
        if len(self.scrapers) == 1 and self.scraper is not None:
            stats["metrics"] = self.scraper.stats()
        elif self.scrapers:
            stats["metrics"] = {src: sc.stats() for src, sc in self.scrapers.items()}
        if self.receiver is not None:
            stats["otlp"] = self.receiver.stats()
        if self.probe is not None:
            stats["probe"] = {"requests": self.probe.requests, "errors": self.probe.errors, "error": self.probe.error}
        self.writer.update_meta(live=stats)
        self.writer.close()


def _silence_check(receiver: OTLPReceiver, silence_s: float) -> Callable[[], str | None]:
    """A monitor function: None until spans arrived, then a reason once none came for ``silence_s``
    (an exporter that stopped; an engine with no requests is silent too, the line says both)."""
    seen = {"n": 0, "at": time.monotonic(), "wall": time.time()}

    def check() -> str | None:
        n = receiver.received_requests
        if n != seen["n"]:
            seen.update(n=n, at=time.monotonic(), wall=time.time())
            return None
        quiet_s = time.monotonic() - seen["at"]
        if n == 0 or quiet_s < silence_s:
            return None
        last = time.strftime("%H:%M:%S", time.localtime(seen["wall"]))
        return (f"OTLP: no spans for {quiet_s:.0f} s (last at {last}): the engine's exporter stopped, "
                "or no request reached the engine")

    return check
