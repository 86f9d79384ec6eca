"""One exit-code contract for every command: 0 ok, 1 SLO broken or regression, 2 bad input or
nothing to judge; stated in every ``--help``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.ground.capture import CaptureWriter
from diag.cli import COMMANDS, build_parser, main

KV = ["samples/kv_cache/client", "samples/kv_cache/server-0"]


def test_every_help_states_the_contract() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert "exit codes" in parser.format_help()
    for name in COMMANDS:
        text = " ".join(sub.choices[name].format_help().split())
        assert "exit codes: 0 ok; 1 an SLO" in text, name
        assert "2 bad input" in text, name


def test_analyze_exits_1_on_a_broken_slo(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue: ``ttft analyze ... --slo ttft_p99=100ms`` exited 0 on a broken SLO."""
    assert main(["analyze", *KV, "--slo", "ttft_p99=100ms"]) == 1
    assert "SLO broken: ttft_p99" in capsys.readouterr().err
    assert main(["analyze", *KV, "--slo", "ttft_p99=600s"]) == 0


def test_analyze_and_report_exit_2_with_nothing_to_judge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    CaptureWriter(tmp_path / "empty", meta={"command": "test"}).close()
    assert main(["analyze", str(tmp_path / "empty")]) == 2
    assert "nothing to judge" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "empty"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["verdict"]["category"] == "no_data"


def test_report_on_nothing_is_written_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    CaptureWriter(tmp_path / "empty", meta={"command": "test"}).close()
    out = tmp_path / "r.json"
    assert main(["report", str(tmp_path / "empty"), "-o", str(out)]) == 2
    assert out.exists() and "nothing to judge" in capsys.readouterr().err


def test_diff_with_an_empty_side_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    CaptureWriter(tmp_path / "empty", meta={"command": "test"}).close()
    assert main(["diff", str(tmp_path / "empty"), "samples/healthy"]) == 2
    assert "nothing to judge on side A" in capsys.readouterr().err
