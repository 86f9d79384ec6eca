"""The dashboard's fleet table (key f): one verdict per replica of the engine series, the hot
one marked; a capture of one replica says there is no fleet."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import Static

from tui.app import TTFTApp
from tui.sources import CaptureSource
from tui.widgets import FleetScreen, StatusBar

from support.fleet_captures import CALM, QUEUE, fleet_capture


async def _until(pilot, cond, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    end = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < end, "timed out waiting for the app"
        await pilot.pause(0.05)


@pytest.mark.parametrize("layout_size", [(80, 24), (160, 48)])
def test_f_opens_the_fleet_table_with_the_hot_replica(tmp_path: Path, layout_size: tuple[int, int]) -> None:
    cap = fleet_capture(tmp_path, {"10.0.0.1:8000": CALM, "10.0.0.2:8000": QUEUE, "10.0.0.3:8000": CALM})

    async def main() -> None:
        app = TTFTApp(CaptureSource(cap), refresh_s=0.2)
        async with app.run_test(size=layout_size) as pilot:
            await _until(pilot, lambda: app.last_snapshot is not None)
            await pilot.press("f")
            await _until(pilot, lambda: isinstance(app.screen, FleetScreen))
            text = str(app.screen.query_one("#fleet-text", Static).render())
            hot = next(line for line in text.splitlines() if line.startswith("10.0.0.2:8000"))
            assert "queue" in hot and hot.rstrip().endswith("<- hot")
            assert "fleet (3 replicas by instance)" in text
            await pilot.press("escape")
            await _until(pilot, lambda: not isinstance(app.screen, FleetScreen))

    asyncio.run(main())


def test_one_replica_is_no_fleet(tmp_path: Path) -> None:
    cap = fleet_capture(tmp_path, {"10.0.0.1:8000": QUEUE})

    async def main() -> None:
        app = TTFTApp(CaptureSource(cap), refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await _until(pilot, lambda: app.last_snapshot is not None)
            await pilot.press("f")
            await _until(pilot, lambda: "no fleet" in str(app.query_one(StatusBar).render()))
            assert not isinstance(app.screen, FleetScreen)

    asyncio.run(main())
