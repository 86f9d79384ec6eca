"""The live verdict served as Prometheus metrics (``ttft watch --expose [HOST:]PORT``).

:class:`VerdictExporter` reads the watch's capture through its own
:class:`tui.sources.LiveSource` (a source is polled by one thread only, and the screen owns
the other), judges the last ``window_s`` seconds every ``interval_s`` on its daemon thread,
and serves the latest :func:`diag.analysis.report.verdict_metrics.verdict_exposition` at ``/metrics``
(503 until the first verdict). Binds 127.0.0.1 unless a host is given.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST

from diag.analysis.report.verdict_metrics import verdict_exposition
from diag.ground.tables import stage_decomposition


def parse_expose(spec: str) -> tuple[str, int]:
    """``9464``, ``:9464`` or ``HOST:9464`` -> (host, port); ValueError (one line) otherwise."""
    host, _, port = spec.rpartition(":")
    try:
        port_n = int(port)
    except ValueError:
        raise ValueError(f"--expose {spec!r}: expected [HOST:]PORT, e.g. :9464") from None
    if not 0 <= port_n <= 65535:
        raise ValueError(f"--expose {spec!r}: port must be 0..65535")
    return (host or "127.0.0.1"), port_n


class VerdictExporter:
    """Serves the live verdict of a capture being written; start() once, stop() once."""

    def __init__(self, capture: str | Path, host: str = "127.0.0.1", port: int = 9464, window_s: float = 60.0,
                 interval_s: float = 5.0, slo: dict[str, float] | None = None, rules_file: str | None = None) -> None:
        from tui.sources import LiveSource

        self._source = LiveSource(capture, window_s=window_s, follow_outages=True)
        self._interval_s = interval_s
        self._slo, self._rules_file = slo, rules_file
        self._body: bytes | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = exporter.latest()
                if body is None:
                    self.send_error(503, "no verdict yet")
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._threads = [threading.Thread(target=self._server.serve_forever, name="ttft-expose-http", daemon=True),
                         threading.Thread(target=self._judge_loop, name="ttft-expose-rules", daemon=True)]

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def latest(self) -> bytes | None:
        with self._lock:
            return self._body

    def judge_once(self) -> None:
        """Poll the capture, run the rules over the window, keep the exposition (the rules thread)."""
        from tui.adapters import run_rules

        snap = self._source.poll()
        run = run_rules(snap.tables, snap.window_ns, slo=self._slo, rules_file=self._rules_file)
        if run.diagnosis is None:
            return
        dec = stage_decomposition(snap.tables.window(run.window_ns).requests)
        body = verdict_exposition(run.diagnosis, dec, time.time())
        with self._lock:
            self._body = body

    def _judge_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.judge_once()
            except Exception:  # noqa: BLE001  (a bad window must not stop the exporter; the next one retries)
                pass
            self._stop.wait(self._interval_s)

    def start(self) -> "VerdictExporter":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._source.close()


__all__ = ["VerdictExporter", "parse_expose"]
