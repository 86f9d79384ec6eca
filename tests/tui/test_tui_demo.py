"""``ttft demo --no-tui``: the bundled engine, the scripted phases, a verdict per phase."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_headless_prints_a_verdict_per_phase(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "diag", "demo", "--no-tui", "--duration", "40", "-o", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    phases = [ln for ln in lines if ln.startswith("phase ")]
    verdicts = [ln for ln in lines if ln.strip().startswith("verdict:")]
    assert len(phases) == 4, proc.stdout
    assert len(verdicts) == 4, proc.stdout
    assert "tokenize" in verdicts[-1] or "tokeniz" in proc.stdout.lower()
    assert (out / "spans.otlp.jsonl").stat().st_size > 0
    assert (out / "meta.json").exists()


def test_demo_parser_has_its_flags() -> None:
    import argparse

    from diag.commands import demo, view, watch

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    for mod in (demo, view, watch):
        mod.add_parser(sub)
    a = parser.parse_args(["demo", "--no-tui", "--duration", "8", "-o", "x"])
    assert a.no_tui and a.duration == 8 and a.output == "x"
    a = parser.parse_args(["view", "cap", "--window", "5"])
    assert a.capture == "cap" and a.window == 5
    a = parser.parse_args(["watch", "http://h:1", "--metrics", "http://h:2/metrics", "--otlp-port", "0",
                           "--probe-rate", "2", "--gpu", "-o", "c"])
    assert a.gpu and a.probe_rate == 2 and a.otlp_port == 0 and a.output == "c"
