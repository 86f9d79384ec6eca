"""Fixtures for the engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def traced_engine():
    from diag.bundled_engine import build_engine

    eng = build_engine(model="tiny", trace_memory=True, max_running=8)
    yield eng
    eng.shutdown()
