"""``ttft view`` takes captures as ``ttft analyze`` does (several, or a directory of them) and,
without a terminal, prints the same analysis with the same exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.cli import main

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


def test_view_reads_a_directory_of_captures_like_analyze(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's example, ``ttft view samples/interference``, said "not a capture"."""
    assert main(["view", str(SAMPLES / "interference"), "--no-tui"]) == 0
    viewed = capsys.readouterr().out
    assert main(["analyze", str(SAMPLES / "interference")]) == 0
    assert capsys.readouterr().out == viewed
    assert "verdict: interference" in viewed


def test_view_joins_client_and_server(capsys: pytest.CaptureFixture[str]) -> None:
    cap = SAMPLES / "interference"
    assert main(["view", str(cap / "client"), str(cap / "server-0"), "--no-tui", "--slo", "ttft_p99=1ms"]) == 1
    out = capsys.readouterr()
    # a TTFT target broken and no TTFT rule naming why: inconclusive; interference stands beside it
    assert "verdict: inconclusive" in out.out and "interference" in out.out and "SLO broken" in out.err
