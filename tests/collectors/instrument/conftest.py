"""Instrument tests: ``tests/thirdparty`` (the tiny-Llama builder for ``transformers serve``) on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

_THIRDPARTY = str(Path(__file__).resolve().parents[2] / "thirdparty")
if _THIRDPARTY not in sys.path:
    sys.path.insert(0, _THIRDPARTY)
