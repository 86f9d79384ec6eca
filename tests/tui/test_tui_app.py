"""The Textual app driven by Pilot over captures built with the real span helpers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from tui.app import TTFTApp
from tui.sources import CaptureSource, CallableMonitor, LiveSource
from tui.widgets import HelpScreen, SlowestTable, StatusBar, VerdictPanel, WaterfallScreen

from support.tui_captures import panel_text

SIZE = (160, 50)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def until(pilot: Pilot[Any], cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Let the app run (workers included) until ``cond`` holds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        if loop.time() > end:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.05)


def settled(app: TTFTApp) -> bool:
    """A frame is painted and its verdict is for the current window and data."""
    vm = app.last_vm
    return vm is not None and not vm.verdict.pending and not vm.verdict.stale


def test_view_shows_verdict_and_keys_work(queue_capture: Path, tmp_path: Path) -> None:
    async def main() -> None:
        app = TTFTApp(CaptureSource(queue_capture), refresh_s=0.2, report_dir=tmp_path / "reports")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: settled(app))
            vm = app.last_vm
            assert vm is not None and vm.whole
            assert vm.latency.requests == 60
            verdict = panel_text(app, VerdictPanel).lower()
            assert "queue" in verdict, verdict
            # every evidence row says whether it crossed its threshold, or that it is context
            rows = [ln for ln in panel_text(app, VerdictPanel).splitlines()
                    if any(ln.strip().startswith(e.name[:20]) for e in vm.verdict.evidence)]
            assert len(rows) >= len(vm.verdict.evidence) > 0
            assert all(("✓ crossed" in ln) or ("✗ not crossed" in ln) or ("· context" in ln) for ln in rows), rows
            assert any("✓ crossed" in ln for ln in rows), rows
            # the stage bar, the table and the status line are filled
            assert app.query_one(SlowestTable).row_count == 15
            assert "CAPTURE" in panel_text(app, StatusBar)

            # p pauses and resumes
            await pilot.press("p")
            assert app.paused and "PAUSED" in panel_text(app, StatusBar)
            frames = app.frames
            await pilot.pause(0.6)
            assert app.frames == frames  # nothing refreshed while paused (capture: no new data)
            await pilot.press("p")
            assert not app.paused

            # right from the whole capture -> the first window: healthy, so no longer "queue"
            await pilot.press("right")
            await until(pilot, lambda: settled(app) and not app.last_vm.whole)
            first = app.last_vm
            assert first is not None and first.latency.requests < 60
            assert first.latency.ttft_p99_s is not None and first.latency.ttft_p99_s < 0.1
            # move the cursor to the end: queueing shows up again
            for _ in range(12):
                await pilot.press("right")
            await until(pilot, lambda: settled(app) and app.last_vm.window_ns[1] == app.last_vm.extent_ns[1])
            late = app.last_vm
            assert late is not None and late.latency.ttft_p50_s is not None and late.latency.ttft_p50_s > 0.3
            assert "queue" in panel_text(app, VerdictPanel).lower()
            # 0: back to the whole capture
            await pilot.press("0")
            await until(pilot, lambda: app.last_vm is not None and app.last_vm.whole)

            # ? opens the help, Esc closes it
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen))
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, HelpScreen))

            # r writes a report
            await pilot.press("r")
            await until(pilot, lambda: app.last_report is not None)
            assert app.last_report is not None and app.last_report.exists()
            if app.last_report.suffix == ".json":
                doc = json.loads(app.last_report.read_text())
                assert "stages" in doc

            # q quits
            await pilot.press("q")
        assert app.return_code in (0, None)

    run(main())


def test_tab_moves_between_panels_and_enter_opens_waterfall(queue_capture: Path) -> None:
    async def main() -> None:
        app = TTFTApp(CaptureSource(queue_capture), refresh_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.last_vm is not None)
            seen = set()
            for _ in range(6):
                await pilot.press("tab")
                assert app.focused is not None
                seen.add(app.focused.id)
            assert {"verdict", "latency", "stages", "throughput", "slowest", "gpu"} <= seen
            table = app.query_one(SlowestTable)
            table.focus()
            await pilot.pause()
            trace = table.selected_trace()
            assert trace
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, WaterfallScreen))
            screen = app.screen
            assert isinstance(screen, WaterfallScreen)
            names = [r.name for r in screen.vm.rows]
            assert "ttft.request" in names and "queue" in names and "prefill" in names
            assert screen.vm.first_token_s is not None
            # the cursor keys do nothing under the waterfall; Esc goes back
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, WaterfallScreen))

    run(main())


def test_dead_source_is_shown(tmp_path: Path, queue_capture: Path) -> None:
    state = {"dead": False}

    def engine_alive() -> str | None:
        return "engine exited with code 1: out of memory" if state["dead"] else None

    async def main() -> None:
        src = LiveSource(queue_capture, window_s=3600, monitors=[CallableMonitor("engine", engine_alive)],
                         title="ttft watch test")
        src.add_note("NVML: not available on this machine")
        app = TTFTApp(src, refresh_s=0.1)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.last_vm is not None and app.last_vm.latency.requests == 60)
            status = panel_text(app, StatusBar)
            assert "LIVE" in status and "NVML" in status
            assert not app.last_vm.errors
            state["dead"] = True
            await until(pilot, lambda: app.last_vm is not None and bool(app.last_vm.errors))
            assert "engine exited with code 1" in panel_text(app, StatusBar)
            # the app stays responsive
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen))

    run(main())


def test_bad_capture_shows_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "spans.otlp.jsonl").write_text("{not json\n")

    async def main() -> None:
        app = TTFTApp(CaptureSource(bad), refresh_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.last_vm is not None or bool(app.last_error))
            await pilot.pause(0.1)
            # an empty capture still renders (with a warning), never a traceback
            assert app.last_vm is not None
            assert "no completed requests" in panel_text(app, VerdictPanel).lower() or app.last_vm.verdict.title

    run(main())
