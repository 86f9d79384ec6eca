"""Hooks that sample the server side into the probe's capture while it probes:
the server's Prometheus ``/metrics`` (``--metrics URL``) and NVML GPU counters (``--gpu``).

The collectors live in ``collectors.prometheus`` (``PrometheusScraper``) and
``collectors.nvml`` (``NvmlSampler``); they are imported lazily here, and anything missing or
failing becomes a one-line note in meta.json's ``alongside`` instead of an error.

Threading: both collectors sample on their own daemon threads; start/stop from one thread.
"""

from __future__ import annotations

from typing import Any

from diag.capture import CaptureWriter


def _frame_of(obj: Any) -> Any:
    for name in ("frame", "collect", "to_frame"):
        fn = getattr(obj, name, None)
        if callable(fn):
            return fn()
    return None


class Alongside:
    """Starts the optional server-side samplers; :meth:`stop` writes their series."""

    def __init__(self, metrics_url: str | None = None, gpu: bool = False, metrics_interval_s: float = 0.5,
                 gpu_interval_s: float = 0.1) -> None:
        self.metrics_url = metrics_url
        self.gpu = gpu
        self.metrics_interval_s = metrics_interval_s
        self.gpu_interval_s = gpu_interval_s
        self.scraper: Any = None
        self.nvml: Any = None
        self.notes: dict[str, Any] = {}

    def start(self) -> None:
        """Start what was asked for; failures become notes."""
        if self.metrics_url:
            try:
                from collectors.prometheus import PrometheusScraper, metrics_url

                url = metrics_url(self.metrics_url)
                self.scraper = PrometheusScraper(url, interval_s=self.metrics_interval_s)
                self.scraper.start()
                self.notes["prometheus"] = {"url": url, "interval_s": self.metrics_interval_s}
            except Exception as exc:  # missing module or bad URL: note and go on
                self.scraper = None
                self.notes["prometheus"] = f"skipped: {type(exc).__name__}: {exc}"
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

    def stop(self, writer: CaptureWriter | None) -> dict[str, Any]:
        """Stop the samplers and write ``series/prometheus`` and ``series/nvml``; returns notes."""
        for name, obj in (("prometheus", self.scraper), ("nvml", self.nvml)):
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
        self.scraper = self.nvml = None
        return self.notes
