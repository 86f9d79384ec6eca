"""Fixtures of the report tests: captures written through the real span helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.report_workload import EVIL, Workload, write_capture


@pytest.fixture
def cap(tmp_path: Path) -> Path:
    return write_capture(tmp_path / "cap")


@pytest.fixture
def evil_cap(tmp_path: Path) -> Path:
    w = Workload(
        n=12,
        service=f"svc{EVIL}",
        model=f'tiny"><script>alert(2)</script>',
        request_id=lambda i: f"{EVIL}-{i}" if i % 2 else f"<img src=x onerror=alert({i})>",
        segment=lambda i: f"seg|{EVIL}" if i < 6 else "c=8 | `x` [y](http://evil.example)",
        error=lambda i: f"<b>boom</b>{EVIL}" if i == 3 else None,
    )
    return write_capture(tmp_path / "evil", w)


def _analysis(path: Path, diagnosis: Any = "none") -> Any:
    a = analyze_paths([path], run_rules=False)
    if diagnosis != "none":
        a.diagnosis = diagnosis
    return a
