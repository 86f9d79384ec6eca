"""``ttft scrape URL``: a real process polling a real HTTP /metrics endpoint stops as on Ctrl-C
under a process manager (SIGTERM) and when started as a shell's background job (SIGINT ignored on
entry, so Python raises no KeyboardInterrupt), and writes its capture either way."""

from __future__ import annotations

import http.server
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from diag.ground.capture import load_capture
from support.engine_testutil import ROOT, background_job

METRICS = ROOT / "samples" / "external" / "vllm" / "metrics.t0.prom"


@contextmanager
def metrics_endpoint() -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 answering GET /metrics with a saved vLLM scrape."""
    body = METRICS.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_scrape_stops_on_sigterm_and_on_an_inherited_ignored_sigint(tmp_path: Path, sig: str) -> None:
    out = tmp_path / "cap"
    with metrics_endpoint() as url, background_job(["scrape", url, "--interval", "0.2", "-d", "600",
                                                    "-o", str(out)]) as (proc, line):
        assert "polling" in line
        time.sleep(1.0)
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(20) == 0
    cap = load_capture(out)
    assert len(cap.series) and cap.meta["prometheus_scrape"]["scrapes"] >= 2
