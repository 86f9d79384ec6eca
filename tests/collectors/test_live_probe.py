"""collectors.live_probe: a probe session that cannot open says why on screen and is retried."""

from __future__ import annotations

import time
from pathlib import Path

from collectors.live_probe import ProbePlan, ProbeThread, steady_plan
from diag.ground.capture import CaptureWriter


def test_a_probe_that_cannot_open_says_why_and_retries_until_stopped(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path / "cap")
    probe = ProbeThread("ftp://127.0.0.1:1", writer, steady_plan(ProbePlan()), retry_s=0.1)
    probe.start()
    try:
        deadline = time.monotonic() + 10
        while probe.check() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        why = probe.check() or ""
        assert why.startswith("probe cannot reach ftp://127.0.0.1:1") and "bad URL" in why, why
        assert probe.alive() and probe.opens == 0  # still trying, not dead
    finally:
        probe.stop(timeout_s=5)
        writer.close()
    assert not probe.alive() and probe.check() is None  # stopped on purpose: nothing to report
