"""``ttft watch`` without a terminal exits as ``ttft analyze`` does: 0 while the server answers,
2 when it is down (every probe request refused), with the verdict about what the probe saw."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
from support.engine_testutil import free_port, ttft_serve


def _watch(url: str, out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "diag", "watch", url, "--duration", "5", "--probe-rate", "3", "--otlp-port", "-1",
           "-o", str(out)]
    return subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_headless_watch_exits_0_while_answered_and_2_when_the_server_is_down(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ttft_serve(port):
        up = _watch(url, tmp_path / "up")
    assert up.returncode == 0, up.stdout + up.stderr
    verdict = next(line for line in up.stdout.splitlines() if line.startswith("verdict: "))
    assert "failures" not in verdict and "no_data" not in verdict
    down = _watch(url, tmp_path / "down")
    assert down.returncode == 2, down.stdout + down.stderr
    verdict = next(line for line in down.stdout.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: failures") and "connect_refused" in verdict
    assert "feed down: /metrics" in down.stdout  # and the screen says which feeds are gone
    assert "nothing to judge: no request completed" in down.stderr
