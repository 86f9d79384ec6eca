"""``ttft demo --no-tui``: the bundled engine, the scripted phases, a verdict per phase."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_headless_gets_the_expected_verdict_per_phase(tmp_path: Path) -> None:
    """Each phase runs on its own engine process; the rules over each phase's window name the
    bottleneck the phase causes. On a shared 2-core box one phase may be judged otherwise
    (another process starves the probe: a load-generator verdict), so 3 of 4 is the bar."""
    import json
    import re

    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "diag", "demo", "--no-tui", "--duration", "48", "-o", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    pat = re.compile(r"^phase (\d)/4 (.+?): expected (\S+), verdict (\S+) \(confidence ([0-9.]+)\) \[(ok|MISS)\]")
    rows = [m.groups() for m in map(pat.match, proc.stdout.splitlines()) if m]
    assert [r[1] for r in rows] == ["healthy", "long prompts", "KV pressure", "slow tokenizer"], proc.stdout
    assert [r[2] for r in rows] == ["healthy", "prefill_compute", "kv_cache", "tokenize"], proc.stdout
    hits = [r for r in rows if r[2] == r[3]]
    assert len(hits) >= 3, proc.stdout
    assert all(float(r[4]) > 0.3 for r in hits), proc.stdout
    assert (out / "spans.otlp.jsonl").stat().st_size > 0
    meta = json.loads((out / "meta.json").read_text())
    phases = meta["demo"]["phases"]
    assert [p["phase"] for p in phases] == [r[1] for r in rows]
    for p, r in zip(phases, rows):
        assert p["expected"] == r[2] and p["verdict"]["category"] == r[3]
        assert p["start_unix_s"] < p["end_unix_s"]
        assert isinstance(p["serve_args"], list)
    assert any("--kv-blocks" in p["serve_args"] for p in phases)
    assert (out / "calibration.json").exists()
    report = [ln.split("report: ", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("report: ")]
    assert len(report) == 1 and Path(report[0]).exists(), proc.stdout


def test_demo_parser_has_its_flags() -> None:
    import argparse

    from diag.cli.commands import demo, view, watch

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
