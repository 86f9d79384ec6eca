"""Hooks that sample the server side into the probe's capture while it probes:
the server's Prometheus ``/metrics`` (``--metrics URL``, or ``--metrics prefill=URL --metrics decode=URL``
for the two instances of a disaggregated pair) and NVML GPU counters (``--gpu``).

The collectors live in ``collectors.prometheus`` (``PrometheusScraper``) and
``collectors.nvml`` (``NvmlSampler``); they are imported lazily here, and anything missing or
failing becomes a one-line note in meta.json's ``alongside`` instead of an error.

A scrape is fetched while the probe runs and parsed later (:class:`DeferredScrape`): the
fetching thread mostly waits on its socket with the GIL released, while parsing an engine's
exposition holds the GIL for milliseconds the probe's event loop would wait for, in the middle
of the requests it times. The texts wait, compressed, until :meth:`Alongside.parse_pending`
(called between load phases, when no request is in flight) or :meth:`Alongside.stop`.

Threading: the collectors sample on their own daemon threads; start/stop/parse_pending from one
thread.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence
from typing import Any

from diag.ground.capture import CaptureWriter

#: fetched texts waiting to be parsed, compressed, at most this many bytes: past it the fetching
#: thread parses the oldest itself (counted in the notes' ``parsed_while_probing``)
MAX_PENDING_BYTES = 64 * 1024 * 1024


class DeferredScrape:
    """A :class:`collectors.prometheus.PrometheusScraper` whose thread only fetches (its
    ``on_text``): the texts are parsed by :meth:`parse_pending` on the caller's thread, in the
    order they were taken (rates and histogram deltas between scrapes come out as the scraper's
    own loop gives them).

    Threading: the scraper's thread appends under a lock; :meth:`parse_pending`, :meth:`stop`,
    :meth:`collect` and :meth:`stats` from one other thread."""

    def __init__(self, scraper: Any) -> None:
        self.scraper = scraper
        scraper.on_text = self._keep
        self._pending: list[tuple[float, bytes]] = []
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self.parsed_while_probing = 0

    def start(self) -> None:
        self.scraper.start()

    def _keep(self, ts_s: float, text: str) -> None:
        """The scraper thread's hand-over: keep the text compressed; past
        :data:`MAX_PENDING_BYTES` the oldest is parsed here, while the probe runs."""
        packed = zlib.compress(text.encode("utf-8"), 1)
        with self._lock:
            self._pending.append((ts_s, packed))
            self._pending_bytes += len(packed)
            over = self._pending_bytes > MAX_PENDING_BYTES
        if over:
            self._parse(1)
            self.parsed_while_probing += 1

    def _parse(self, most: int | None = None) -> int:
        with self._lock:
            take = self._pending if most is None else self._pending[:most]
            self._pending = [] if most is None else self._pending[most:]
            self._pending_bytes -= sum(len(p) for _, p in take)
        for ts, packed in take:
            self.scraper.ingest(ts, zlib.decompress(packed).decode("utf-8"))
        return len(take)

    def parse_pending(self) -> int:
        """Parse every text fetched so far into rows; returns how many."""
        return self._parse()

    def stop(self) -> None:
        """Stop fetching (join the scraper's thread) and parse what is left."""
        self.scraper.stop()
        self.parse_pending()

    def collect(self) -> Any:
        return self.scraper.collect()

    def stats(self) -> dict[str, Any]:
        return {**self.scraper.stats(), "parsed_while_probing": self.parsed_while_probing}


def _frame_of(obj: Any) -> Any:
    for name in ("frame", "collect", "to_frame"):
        fn = getattr(obj, name, None)
        if callable(fn):
            return fn()
    return None


class Alongside:
    """Starts the optional server-side samplers; :meth:`stop` writes their series.

    ``metrics_url``: one /metrics URL, or the values of a repeated ``--metrics`` (``prefill=URL``,
    ``decode=URL``: :func:`collectors.prometheus.metrics_targets`), each scraped on its own thread
    into ``series/<source>`` with its role as the rows' entity."""

    def __init__(self, metrics_url: str | Sequence[str] | None = None, gpu: bool = False,
                 metrics_interval_s: float = 0.5, gpu_interval_s: float = 0.1) -> None:
        self.metrics_url = metrics_url
        self.gpu = gpu
        self.metrics_interval_s = metrics_interval_s
        self.gpu_interval_s = gpu_interval_s
        #: source name (``prometheus``, ``prometheus-prefill``, ...) -> its deferred scraper
        self.scrapers: dict[str, DeferredScrape] = {}
        self.nvml: Any = None
        self.notes: dict[str, Any] = {}

    @property
    def scraper(self) -> DeferredScrape | None:
        """The single endpoint's scraper (``--metrics URL``); None when none or a pair runs."""
        return self.scrapers.get("prometheus")

    def start(self) -> None:
        """Start what was asked for; failures become notes."""
        if self.metrics_url:
            try:
                from collectors.prometheus import PrometheusScraper, metrics_targets, metrics_url

                targets = metrics_targets(self.metrics_url)
            except Exception as exc:  # missing module or a bad --metrics value: note and go on
                self.notes["prometheus"] = f"skipped: {type(exc).__name__}: {exc}"
                targets = []
            for t in targets:
                try:
                    url = metrics_url(t.url)
                    scraper = DeferredScrape(PrometheusScraper(url, interval_s=self.metrics_interval_s,
                                                               entity=t.entity))
                    scraper.start()
                    self.scrapers[t.source] = scraper
                    self.notes[t.source] = {"url": url, "interval_s": self.metrics_interval_s,
                                            **({"role": t.role} if t.role else {})}
                except Exception as exc:  # a bad URL: note and go on
                    self.notes[t.source] = f"skipped: {type(exc).__name__}: {exc}"
        if self.gpu:
            try:
                from collectors.nvml import NvmlSampler

                sampler = NvmlSampler(interval_s=self.gpu_interval_s)
                if not getattr(sampler, "available", True):
                    self.notes["nvml"] = f"skipped: {getattr(sampler, 'note', 'NVML unavailable')}"
                else:
                    sampler.start()
                    self.nvml = sampler
                    self.notes["nvml"] = {"interval_s": self.gpu_interval_s}
            except Exception as exc:
                self.nvml = None
                self.notes["nvml"] = f"skipped: {type(exc).__name__}: {exc}"

    def parse_pending(self) -> None:
        """Parse the scrapes fetched so far (call between load phases: no request in flight)."""
        for scraper in self.scrapers.values():
            scraper.parse_pending()

    def stop(self, writer: CaptureWriter | None) -> dict[str, Any]:
        """Stop the samplers and write ``series/prometheus`` (``series/prometheus-<role>`` for a pair) and
        ``series/nvml``; returns notes."""
        for name, obj in (*self.scrapers.items(), ("nvml", self.nvml)):
            if obj is None:
                continue
            try:
                obj.stop()
                frame = _frame_of(obj)
                stats = getattr(obj, "stats", None)
                if callable(stats) and isinstance(self.notes.get(name), dict):
                    self.notes[name].update(stats())
                if writer is not None and frame is not None and len(frame):
                    writer.append_series(name, frame)
                if isinstance(self.notes.get(name), dict):
                    self.notes[name]["rows"] = 0 if frame is None else int(len(frame))
            except Exception as exc:
                self.notes[name] = f"failed: {type(exc).__name__}: {exc}"
        self.scrapers = {}
        self.nvml = None
        return self.notes
