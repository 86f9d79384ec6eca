"""``ttft watch`` when the watched stack fails: the frame loop keeps painting, the live verdict
turns to what the probe sees within a few refreshes, the screen says which feed is down, and
the verdict comes back with the server.

Everything here is a real process: ``ttft serve`` (killed with SIGKILL, restarted on the same
port), a small aiohttp server that answers 503 or drops /metrics on demand
(``watch_fault_server.py``), and an OTLP exporter process (``watch_otlp_exporter.py``) that is
killed. The collection is the one ``ttft watch`` runs (probe, /metrics scraper, OTLP receiver),
read by ``LiveSource(follow_outages=True)`` and painted by the Textual app under Pilot.
Slow (5-20 s each): run one at a time with ``-m slow``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from collectors.live import LiveCollection
from collectors.live_probe import ProbePlan, steady_plan
from tui.app import TTFTApp
from tui.sources import LiveSource
from tui.widgets import StatusBar

from support.engine_testutil import free_port, process, ttft_serve
from support.tui_captures import panel_text

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).resolve().parents[1] / "support"  # the helper processes
REFRESH_S = 0.5
#: what "within a few refreshes" is allowed to take on a shared, niced CI box (measured: ~2 s)
TURN_S = 10.0
#: the probe's --probe-timeout in these tests, seconds
PROBE_TIMEOUT_S = 5.0
#: the verdict categories of a window whose requests failed
DOWN_CATEGORIES = ("failures", "no_data")


@contextlib.contextmanager
def fault_server(tmp_path: Path, port: int = 0) -> Iterator[tuple[str, Callable[[str], None]]]:
    """The aiohttp fault server (on ``port``; 0: a free one): yields (its URL, a function that sets its mode)."""
    mode = tmp_path / "mode"
    mode.write_text("ok")
    cmd = [sys.executable, str(SUPPORT / "watch_fault_server.py"), str(mode), str(port)]
    with process(cmd, "listening on") as (_, line):
        yield f"http://127.0.0.1:{int(line.split()[-1])}", lambda m: mode.write_text(m)  # type: ignore[func-returns-value]


@contextlib.contextmanager
def watching(url: str, out: Path, otlp: bool = False) -> Iterator[tuple[LiveCollection, LiveSource, int | None]]:
    """What ``ttft watch URL --probe-rate 4 --probe-timeout 5`` starts (a 30 s window, a 2 s OTLP silence)."""
    live = LiveCollection(out, meta={"kind": "watch", "watch": {"url": url}}, pump_interval_s=0.5)
    live.start_prometheus(url, interval_s=0.5)
    port = live.start_otlp(0, silence_s=2.0) if otlp else None
    plan = ProbePlan(rate_rps=4.0, input_tokens=16, output_tokens=4)
    live.start_probe(url, steady_plan(plan), plan.input_tokens, plan.output_tokens, timeout_s=PROBE_TIMEOUT_S)
    live.start_pump()
    source = LiveSource(out, window_s=30.0, monitors=live.monitors(), title=f"ttft watch {url}", follow_outages=True)
    try:
        yield live, source, port
    finally:
        live.stop()


def run_app(source: LiveSource, script: Callable[[TTFTApp, Pilot[Any]], Awaitable[None]]) -> None:
    async def main() -> None:
        app = TTFTApp(source, refresh_s=REFRESH_S)
        async with app.run_test(size=(160, 50)) as pilot:
            await script(app, pilot)

    asyncio.run(main())


async def until(pilot: Pilot[Any], cond: Callable[[], bool], timeout_s: float, what: str,
                app: TTFTApp | None = None) -> float:
    """Let the app run until ``cond`` holds; returns the seconds it took."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            vm = app.last_vm if app is not None else None
            seen = (vm.verdict.category, vm.verdict.title, vm.errors, vm.window_label) if vm else None
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for: {what}; screen: {seen}")
        await pilot.pause(0.1)
    return time.monotonic() - t0


def verdict(app: TTFTApp) -> tuple[str, str]:
    vm = app.last_vm  # live: the window moves every frame, so the latest rules run is always a frame behind
    if vm is None or vm.verdict.pending:
        return "", ""
    return vm.verdict.category, vm.verdict.title


def answering(app: TTFTApp) -> bool:
    """A current verdict over answered requests, and no feed says the server is gone."""
    vm = app.last_vm
    cat, _ = verdict(app)
    return (vm is not None and cat not in ("", *DOWN_CATEGORIES) and vm.latency.requests > 0
            and not any("not answering" in e for e in vm.errors))


def down(app: TTFTApp, kind: str) -> bool:
    """The verdict is about failed requests of ``kind`` and the screen says the server is gone."""
    vm = app.last_vm
    cat, title = verdict(app)
    return (vm is not None and cat in DOWN_CATEGORIES and kind in title
            and any("server not answering" in e and kind in e for e in vm.errors))


def frames_go_on(app: TTFTApp) -> Callable[[], bool]:
    """True once two more frames were painted without a frame error."""
    start = app.frames

    def cond() -> bool:
        assert not app.last_error, app.last_error
        return app.frames >= start + 2

    return cond


async def kill_until_down(app: TTFTApp, pilot: Pilot[Any], server: subprocess.Popen[str]) -> float:
    """Once the verdict is over answered requests, SIGKILL the server; the seconds until the
    verdict is about refused connections and the screen says the server is not answering."""
    await until(pilot, lambda: answering(app), 40, "a verdict over answered requests", app)
    server.send_signal(signal.SIGKILL)
    server.wait(10)
    return await until(pilot, lambda: down(app, "connect_refused"), TURN_S, "the verdict to turn", app)


def test_server_killed_turns_the_verdict_and_says_so(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ttft_serve(port) as server, watching(url, tmp_path / "cap") as (_, source, _p):
        async def script(app: TTFTApp, pilot: Pilot[Any]) -> None:
            took = await kill_until_down(app, pilot, server)
            print(f"server killed -> verdict turned in {took:.1f} s")
            assert "not answering" in (app.last_vm.window_label or "")
            status = panel_text(app, StatusBar)  # the header says it, in red, with the refused kind
            assert "✖ server not answering since" in status and "connect_refused" in status, status
            await until(pilot, frames_go_on(app), 10, "more frames")

        run_app(source, script)


def test_server_restarted_on_the_same_port_brings_the_verdict_back(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ttft_serve(port) as first, watching(url, tmp_path / "cap") as (_, source, _p):
        async def script(app: TTFTApp, pilot: Pilot[Any]) -> None:
            await kill_until_down(app, pilot, first)
            with ttft_serve(port):
                t0 = time.monotonic()
                await until(pilot, lambda: answering(app), 30, "the verdict to come back", app)
                print(f"server back -> verdict back in {time.monotonic() - t0:.1f} s")
                assert "answering again" in (app.last_vm.window_label or "")

        run_app(source, script)


def test_a_server_that_hangs_times_out_and_comes_back(tmp_path: Path) -> None:
    """SIGSTOP: the server holds its connections and answers nothing; the probe's requests time
    out after --probe-timeout (5 s here), and the verdict turns to timeouts; SIGCONT brings it back."""
    port = free_port()
    with ttft_serve(port) as server, watching(f"http://127.0.0.1:{port}", tmp_path / "cap") as (_, source, _p):
        async def script(app: TTFTApp, pilot: Pilot[Any]) -> None:
            await until(pilot, lambda: answering(app), 40, "a verdict over answered requests", app)
            server.send_signal(signal.SIGSTOP)
            try:
                took = await until(pilot, lambda: down(app, "timeout"), PROBE_TIMEOUT_S + TURN_S,
                                   "the verdict to turn to timeouts", app)
                print(f"server stopped -> verdict turned in {took:.1f} s (probe timeout {PROBE_TIMEOUT_S:g} s)")
            finally:
                server.send_signal(signal.SIGCONT)
            await until(pilot, lambda: answering(app), PROBE_TIMEOUT_S + TURN_S, "the verdict to come back", app)

        run_app(source, script)


@pytest.mark.parametrize(("mode", "kind"), [("503", "http_5xx"), ("shed", "server_disconnected")])
def test_a_server_refusing_is_failures_then_comes_back(tmp_path: Path, mode: str, kind: str) -> None:
    """Answering 503 to everything, or closing every connection before answering."""
    with fault_server(tmp_path) as (url, set_mode), watching(url, tmp_path / "cap") as (_, source, _p):
        async def script(app: TTFTApp, pilot: Pilot[Any]) -> None:
            await until(pilot, lambda: answering(app), 30, "a verdict over answered requests", app)
            set_mode(mode)
            took = await until(pilot, lambda: down(app, kind), TURN_S, f"the verdict to turn on {kind}", app)
            print(f"{mode} -> verdict turned in {took:.1f} s")
            set_mode("ok")
            took = await until(pilot, lambda: answering(app), TURN_S, "the verdict to come back", app)
            print(f"ok again -> verdict back in {took:.1f} s")

        run_app(source, script)


async def said_and_going_on(app: TTFTApp, pilot: Pilot[Any], line: str) -> None:
    """A feed went away: the screen says so (a red line starting with ``line``), new data keeps
    coming, the probe's verdict is still painted and frames do not fail."""
    await until(pilot, lambda: any(e.startswith(line) for e in app.last_vm.errors), TURN_S,
                f"the screen to say {line!r}", app)
    gen = app.last_vm.generation
    await until(pilot, lambda: answering(app) and app.last_vm.generation > gen, 10, "the probe's verdict to go on", app)
    await until(pilot, frames_go_on(app), 10, "more frames")


def test_metrics_gone_is_said_and_the_probe_verdict_goes_on(tmp_path: Path) -> None:
    with fault_server(tmp_path) as (url, set_mode), watching(url, tmp_path / "cap") as (_, source, _p):
        async def script(app: TTFTApp, pilot: Pilot[Any]) -> None:
            await until(pilot, lambda: answering(app) and "/metrics" in app.last_vm.throughput.source, 30,
                        "a verdict with /metrics gauges", app)
            set_mode("no-metrics")
            await said_and_going_on(app, pilot, "/metrics")
            set_mode("ok")
            await until(pilot, lambda: not any(e.startswith("/metrics") for e in app.last_vm.errors), TURN_S,
                        "the /metrics line to clear", app)

        run_app(source, script)


def test_otlp_exporter_gone_is_said_and_the_probe_verdict_goes_on(tmp_path: Path) -> None:
    with fault_server(tmp_path) as (url, _), watching(url, tmp_path / "cap", otlp=True) as (_, source, port):
        assert port
        exporter_cmd = [sys.executable, str(SUPPORT / "watch_otlp_exporter.py"), f"http://127.0.0.1:{port}"]
        with process(exporter_cmd, "exporting") as (exporter, _):
            async def script(app: TTFTApp, pilot: Pilot[Any]) -> None:
                await until(pilot, lambda: answering(app) and app.last_vm.busy.steps > 0, 30,
                            "engine steps from the exporter", app)
                exporter.send_signal(signal.SIGKILL)
                exporter.wait(10)
                await said_and_going_on(app, pilot, "OTLP: no spans")

            run_app(source, script)


def test_a_server_that_is_not_up_yet_is_said_and_watched_once_it_is(tmp_path: Path) -> None:
    """Nothing listens yet: the probe's requests are refused and the screen says the server is
    not answering; the probe keeps sending, so the watch works once the server comes up."""
    port = free_port()
    with watching(f"http://127.0.0.1:{port}", tmp_path / "cap") as (_, source, _p):
        async def script(app: TTFTApp, pilot: Pilot[Any]) -> None:
            await until(pilot, lambda: down(app, "connect_refused"), TURN_S, "the screen to say it is not answering", app)
            with fault_server(tmp_path, port):
                await until(pilot, lambda: answering(app)
                            and not any(e.startswith("probe") for e in app.last_vm.errors), 20,
                            "the verdict once the server is up", app)
            await until(pilot, frames_go_on(app), 10, "more frames")

        run_app(source, script)
