"""A file that is not a capture gets one line and exit 2; files beside a capture that it does not
read are named once, with the command that reads them (``ttft scrape --from-files``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from diag.analysis import analyze_paths
from diag.ground.capture import load_capture
from diag.cli import main

VLLM = Path(__file__).resolve().parents[3] / "samples" / "external" / "vllm"


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_saved_scrape_is_not_a_capture(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue: 32 "not valid JSON" warnings, no_data, exit 0."""
    assert main(["analyze", str(VLLM / "metrics.t0.prom")]) == 2
    line = _one_line(capsys)
    assert "not a capture" in line and "Prometheus text" in line and "ttft scrape --from-files" in line


def test_a_log_file_is_not_a_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "server.log"
    log.write_text("".join(f"INFO 2026-01-01 12:00:{i:02d} request {i} done in 12 ms\n" for i in range(171)))
    assert main(["analyze", str(log)]) == 2
    line = _one_line(capsys)
    assert "not a capture" in line and "server.log" in line and "INFO" in line


@pytest.fixture
def raw_export(tmp_path: Path) -> Path:
    """vLLM as a user saves it: its OTLP spans plus a /metrics text every few seconds."""
    d = tmp_path / "vllm"
    d.mkdir()
    shutil.copy(VLLM / "spans.otlp.jsonl", d)
    for f in VLLM.glob("metrics.t*.prom"):
        shutil.copy(f, d)
    return d


def test_unread_scrapes_are_named_once_and_scrape_reads_them(raw_export: Path) -> None:
    before = analyze_paths([raw_export])
    unread = [w for w in before.warnings if "not read" in w]
    assert len(unread) == 1
    assert "metrics.t0.prom" in unread[0] and "ttft scrape --from-files" in unread[0]
    assert before.diagnosis.verdict.category != "kv_cache"  # the spans alone tell another story

    files = [str(f) for f in raw_export.glob("metrics.t*.prom")]  # shell order: t10 before t2
    sample = load_capture(VLLM / "capture").meta["sample"]  # the times the scrapes were taken at
    assert main(["scrape", "--from-files", *files, "--interval", str(sample["scrape_interval_s"]),
                 "--start", str(sample["base_ts_s"]), "-o", str(raw_export)]) == 0
    after = analyze_paths([raw_export])
    assert not [w for w in after.warnings if "not read" in w]
    assert after.diagnosis.verdict.category == "kv_cache"
    # the same series the sample's own capture holds (made through the same adapters)
    mine = load_capture(raw_export).series.reset_index(drop=True)
    theirs = load_capture(VLLM / "capture").series.reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, theirs, check_dtype=False)


def test_from_files_needs_times_it_can_trust(raw_export: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(raw_export.glob("metrics.t*.prom"))
    for f in files:
        os.utime(f, (1767225600, 1767225600))  # a checkout: all one time
    assert main(["scrape", "--from-files", *map(str, files), "-o", str(raw_export / "out")]) == 2
    assert "--interval" in _one_line(capsys)
    for k, f in enumerate(sorted(files, key=lambda p: int(p.name.split(".")[1][1:]))):
        os.utime(f, (1767225600 + 5 * k, 1767225600 + 5 * k))
    assert main(["scrape", "--from-files", *map(str, files), "-o", str(raw_export / "out")]) == 0
    capsys.readouterr()
    assert load_capture(raw_export / "out").series["ts_s"].min() == pytest.approx(1767225600)


def test_from_files_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "m.prom"
    bad.write_text("vllm:num_requests_running{engine=\"0\" 1.0\n")
    assert main(["scrape", "--from-files", str(bad), "-o", str(tmp_path / "c")]) == 2
    assert "m.prom" in _one_line(capsys)
    assert main(["scrape", "http://127.0.0.1:9/metrics", "--from-files", str(bad), "-o", str(tmp_path / "c")]) == 2
    assert "not both" in _one_line(capsys)


def test_a_json_log_is_not_a_capture_but_a_spans_file_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "engine.jsonl"
    log.write_text("".join(f'{{"level": "info", "msg": "request {i} done"}}\n' for i in range(171)))
    assert main(["analyze", str(log)]) == 2
    assert "not OTLP" in _one_line(capsys)
    spans = tmp_path / "spans.jsonl"
    spans.write_text((VLLM / "spans.otlp.jsonl").read_text())
    assert main(["analyze", str(spans), "--json"]) == 0
