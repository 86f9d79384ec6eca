"""``ttft export``: one row per request, client and server joined, in the format the suffix names,
with AIPerf's profile_export names beside ours; a bad suffix or nothing to export is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from diag.ground import stages
from diag.analysis import analyze_paths
from diag.cli import main
from diag.ground.exit_codes import BAD_INPUT, OK

ROOT = Path(__file__).resolve().parents[4]
SAMPLE = ROOT / "samples" / "queue"


def _read(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    return pd.read_json(path, lines=True)


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_one_row_per_request_joined_with_every_stage(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"requests{suffix}"
    assert main(["export", str(SAMPLE), "-o", str(out)]) == OK
    rows = _read(out)
    req = analyze_paths([SAMPLE], run_rules=False).tables.requests
    assert len(rows) == len(req)
    assert set(rows["trace_id"]) == set(req["trace_id"])
    joined = rows[rows["has_client"].astype(bool) & rows["has_server"].astype(bool)]
    assert len(joined) == len(rows)  # the sample has both sides of every request
    # AIPerf's names carry the same numbers as ours, in their units
    assert (rows["time_to_first_token_ms"] - rows["ttft_s"] * 1e3).abs().max() < 1e-6
    assert (rows["request_latency_ms"] - rows["e2e_s"] * 1e3).abs().max() < 1e-6
    itl = (rows["e2e_s"] - rows["ttft_s"]) / (rows["output_sequence_length"] - 1) * 1e3
    assert (rows["inter_token_latency_ms"] - itl).abs().max() < 1e-6
    assert (rows["request_end_ns"] - rows["request_start_ns"] - rows["e2e_s"] * 1e9).abs().max() < 1e3
    assert rows["request_start_ns"].is_monotonic_increasing
    # every TTFT stage is a column; server-side stages and the network gap add up to client TTFT
    for col in stages.STAGE_COLUMNS:
        assert col in rows.columns
    parts = rows[[stages.stage_column(s) for s in stages.TTFT_STAGES] + ["network_s"]].fillna(0.0).sum(axis=1)
    assert ((parts - rows["client_ttft_s"]).abs() / rows["client_ttft_s"]).median() < 0.1
    assert not any("prompt" in c and "tokens" not in c for c in rows.columns)


def test_no_warmup_leaves_the_warmup_out(tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    assert main(["export", str(SAMPLE), "-o", str(out), "--no-warmup"]) == OK
    rows = pd.read_csv(out)
    assert len(rows) and not rows["warmup"].any()
    assert len(rows) < len(analyze_paths([SAMPLE], run_rules=False).tables.requests)


def test_bad_suffix_and_empty_capture_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(SAMPLE), "-o", str(tmp_path / "r.xlsx")]) == BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "unknown export format" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r.xlsx").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "meta.json").write_text(json.dumps({"command": "test"}))
    assert main(["export", str(empty), "-o", str(tmp_path / "r.csv")]) == BAD_INPUT
    assert "no request" in capsys.readouterr().err
    assert not (tmp_path / "r.csv").exists()
