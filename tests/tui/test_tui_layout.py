"""Which layout the dashboard draws (``--layout auto|compact|medium|full``), and that a forced one
holds whatever the terminal's size; the screens themselves are checked in tmux (test_tui_screens)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tui.app import TTFTApp
from tui.layout import choose_layout
from tui.sources import CaptureSource
from tui.widgets import SlowestTable, VerdictPanel


@pytest.mark.parametrize(("columns", "rows", "layout"), [
    (80, 24, "compact"), (119, 60, "compact"), (200, 30, "compact"),  # too narrow or too short
    (120, 40, "medium"), (159, 80, "medium"), (300, 47, "medium"),
    (160, 48, "full"), (250, 70, "full"),
])
def test_auto_picks_by_terminal_size(columns: int, rows: int, layout: str) -> None:
    assert choose_layout("auto", columns, rows) == layout


def test_a_named_layout_wins_and_an_unknown_one_is_refused() -> None:
    assert choose_layout("full", 80, 24) == "full" and choose_layout("compact", 200, 60) == "compact"
    with pytest.raises(ValueError, match="auto, compact, medium, full"):
        choose_layout("tiny", 80, 24)


def test_forced_layout_holds_at_any_size(queue_capture: Path) -> None:
    async def main() -> None:
        app = TTFTApp(CaptureSource(queue_capture), refresh_s=0.2, layout="compact")
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause(0.3)
            assert app.layout_mode == "compact" and not app.query(SlowestTable)
            assert app.query_one(VerdictPanel).compact
        app = TTFTApp(CaptureSource(queue_capture), refresh_s=0.2, layout="full")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.3)
            assert app.layout_mode == "full" and app.query(SlowestTable)
            await pilot.resize_terminal(120, 40)
            await pilot.pause(0.3)
            assert app.layout_mode == "full"

    asyncio.run(main())


def test_auto_follows_a_resize(queue_capture: Path) -> None:
    async def main() -> None:
        app = TTFTApp(CaptureSource(queue_capture), refresh_s=0.2)
        async with app.run_test(size=(160, 50)) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if app.last_vm is not None:
                    break
            assert app.layout_mode == "full" and app.query(SlowestTable)
            await pilot.resize_terminal(80, 24)
            await pilot.pause(0.5)
            assert app.layout_mode == "compact" and not app.query(SlowestTable)
            assert app.query_one(VerdictPanel)._vm is not None  # repainted with the last frame

    asyncio.run(main())
