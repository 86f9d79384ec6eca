"""Which layout the dashboard draws (``--layout auto|compact|medium|full``), and that a forced one
holds whatever the terminal's size; the screens themselves are checked in tmux (test_tui_screens)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from rich.console import Console

from tui.app import TTFTApp
from tui.layout import choose_layout
from tui.sources import CaptureSource
from tui.viewmodels import GpuVM
from tui.widgets import BusyOrGpuPanel, SlowestTable, VerdictPanel


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


class _Narrow(BusyOrGpuPanel):
    """The panel at a fixed content width, outside an app (rendering is string work only)."""

    width_cells = 25

    @property
    def inner_width(self) -> int:
        return self.width_cells


def _text(panel: BusyOrGpuPanel) -> list[str]:
    console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
    console.print(panel.render())
    return [ln.rstrip() for ln in console.export_text().splitlines() if ln.strip()]


def test_compact_gpu_panel_sums_eight_gpus_up_in_four_lines() -> None:
    """Beside the stage panel at 80x24 (a bar and three legend lines), one line a GPU would push
    the verdict off the screen."""
    gpus = [GpuVM(entity=f"gpu{i}", util_pct=80.0 + i, hbm_used_bytes=60e9, hbm_total_bytes=80e9, membw_pct=40.0)
            for i in range(8)]
    compact = _Narrow(compact=True)
    compact._gpus = gpus
    lines = _text(compact)
    assert len(lines) <= 4 and all(len(ln) <= _Narrow.width_cells for ln in lines), lines
    assert "8 GPUs" in lines[0] and "util 84%" in lines[0] and "(80%-87%)" in "".join(lines[:2])
    full = _Narrow(compact=False)
    full.width_cells = 60
    full._gpus = gpus
    lines = _text(full)
    assert len(lines) == 9 and all(len(ln) <= 60 for ln in lines), lines  # header + one row a GPU, cut to width
