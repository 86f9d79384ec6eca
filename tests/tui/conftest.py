"""Fixtures for the TUI tests; the capture builders live in tui_captures.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.tui_captures import HEALTHY, QUEUED, write_capture  # noqa: F401


@pytest.fixture
def queue_capture(tmp_path: Path) -> Path:
    """30 healthy requests, then 30 that wait ~400 ms in the queue."""
    return write_capture(tmp_path / "cap", [HEALTHY, QUEUED])
