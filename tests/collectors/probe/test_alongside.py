"""Scrapes alongside the probe: fetched while requests run, parsed only between load phases."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, ProbeSession, WorkloadSpec
from collectors.probe.alongside import DeferredScrape
from collectors.prometheus import PrometheusScraper
from diag.ground import stages

FIX = Path(__file__).resolve().parents[1] / "fixtures"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        pass


def test_a_deferred_scrape_fetches_on_its_thread_and_parses_when_asked(tmp_path: Path) -> None:
    (tmp_path / "metrics").write_text((FIX / "vllm.t5.prom").read_text())
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(tmp_path)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        scrape = DeferredScrape(PrometheusScraper(f"http://127.0.0.1:{httpd.server_address[1]}/metrics",
                                                  interval_s=0.02, timeout_s=1.0))
        scrape.start()
        deadline = time.time() + 5
        while time.time() < deadline and scrape.scraper.scrapes < 5:  # counted as it starts:
            time.sleep(0.02)                                           # the 5th may be in flight
        assert scrape.scraper.scrapes >= 5 and scrape.collect().empty  # fetched, nothing parsed yet
        assert scrape.parse_pending() >= 4
        rows = scrape.collect()
        assert (rows["series"] == stages.SERIES_KV_USAGE).any() and rows["ts_s"].is_monotonic_increasing
        scrape.stop()  # what was fetched since is parsed too
        stats = scrape.stats()
        assert stats["engine"] == "vllm" and stats["errors"] == 0 and stats["parsed_while_probing"] == 0
        assert len(scrape.collect()) >= len(rows)
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.slow
def test_the_probe_parses_the_engines_metrics_between_phases_not_while_requests_run(tmp_path: Path) -> None:
    from diag.ground.capture import load_capture
    from diag.analysis.scenarios.engine_process import EngineProcess

    seen_during: list[tuple[int, int]] = []  # (texts fetched, rows parsed) at each finished request

    with EngineProcess(["--max-running", "1", "--threads", "1"]) as eng:
        session: ProbeSession | None = None

        def progress(done: int, total: int | None, label: str) -> None:
            scrape = session.alongside.scraper if session is not None else None
            if scrape is not None:
                seen_during.append((scrape.scraper.scrapes, len(scrape.collect())))

        cfg = ProbeConfig(eng.url, load=LoadSpec(concurrency=4, requests=24),
                          workload=WorkloadSpec(LengthSpec("fixed", 64), LengthSpec("fixed", 32)),
                          output=tmp_path / "cap", metrics_url=eng.url, progress=progress)

        async def main() -> None:
            nonlocal session
            session = ProbeSession(cfg)
            session.alongside.metrics_interval_s = 0.1
            async with session:
                await session.phase(cfg.load)
                after = len(session.alongside.scraper.collect())
                assert after > 0  # parsed once the phase ended, before the session closed

        asyncio.run(main())
    assert seen_during and max(f for f, _ in seen_during) >= 2  # the engine was scraped while requests ran
    assert all(rows == 0 for _, rows in seen_during)  # ... and nothing was parsed meanwhile
    series = load_capture(tmp_path / "cap").series
    assert (series["source"] == "prometheus").any()
