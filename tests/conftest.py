"""Shared fixtures: build captures through the real span helpers."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "false")


@pytest.fixture
def capture_dir(tmp_path):
    """A fresh capture directory path (not yet created)."""
    return tmp_path / "capture"
