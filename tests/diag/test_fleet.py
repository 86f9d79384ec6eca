"""Per-replica verdicts from one capture's engine series (``ttft analyze --by instance``): each
replica is judged on its own rows, the hot one is the bottleneck with the highest TTFT p95, and
a capture with nothing to split is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pandas as pd
import pytest

from diag import stages as S
from diag.capture import CaptureWriter
from diag.cli import main
from diag.exit_codes import BAD_INPUT
from diag.fleet import analyze_fleet
from diag.report.jsondoc import SCHEMA_PATH

QUEUE = {S.SERIES_REQUESTS_PER_S: 4.0, S.SERIES_TTFT_S: 2.0, S.SERIES_QUEUE_TIME_S: 1.8, S.SERIES_PREFILL_TIME_S: 0.15,
         "ttft_s_p50": 1.9, "ttft_s_p95": 3.0, "queue_time_s_p95": 2.8, S.SERIES_WAITING: 12.0,
         S.SERIES_KV_USAGE: 0.4, S.SERIES_PREEMPTIONS: 0.0, "itl_s_p50": 0.02, S.SERIES_GENERATION_TOKENS_PER_S: 200.0}
CALM = {S.SERIES_REQUESTS_PER_S: 4.0, S.SERIES_TTFT_S: 0.05, S.SERIES_QUEUE_TIME_S: 0.001, S.SERIES_PREFILL_TIME_S: 0.03,
        "ttft_s_p50": 0.05, "ttft_s_p95": 0.08, S.SERIES_WAITING: 0.0, S.SERIES_KV_USAGE: 0.1,
        "itl_s_p50": 0.02, S.SERIES_GENERATION_TOKENS_PER_S: 200.0}


def _capture(tmp_path: Path, replicas: dict[str, dict[str, float]], windows: int = 8) -> Path:
    rows = []
    for name, w in replicas.items():
        rows.append((1000.0, "prometheus", S.SERIES_WAITING, name, 0.0))
        rows += [(1000.0 + 5.0 * k, "prometheus", series, name, v) for k in range(1, windows + 1) for series, v in w.items()]
    out = tmp_path / "fleet"
    with CaptureWriter(out, meta={"command": "test"}) as w:
        w.write_series("prometheus", pd.DataFrame(rows, columns=list(S.SERIES_COLUMNS)))
    return out


def test_each_replica_is_judged_on_its_own_rows_and_the_hot_one_is_named(tmp_path: Path) -> None:
    cap = _capture(tmp_path, {"10.0.0.1:8000": CALM, "10.0.0.2:8000": QUEUE, "10.0.0.3:8000": CALM})
    f = analyze_fleet([str(cap)])
    by_name = {r.name: r for r in f.replicas}
    assert set(by_name) == {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
    assert by_name["10.0.0.2:8000"].category == "queue"
    assert by_name["10.0.0.2:8000"].ttft_p95_s == pytest.approx(3.0)
    assert by_name["10.0.0.1:8000"].category != "queue"
    assert f.hot == "10.0.0.2:8000"
    # one replica's rows only: the calm ones' TTFT is their own, not the fleet's mix
    assert by_name["10.0.0.1:8000"].ttft_p95_s == pytest.approx(0.08)


def test_fleet_json_matches_the_schema_and_the_text_marks_the_hot_row(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cap = _capture(tmp_path, {"a:1": CALM, "b:1": QUEUE})
    main(["analyze", str(cap), "--by", "instance", "--json"])
    doc = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))).validate(doc)
    assert doc["schema"] == "fleet" and doc["hot"] == "b:1"
    main(["analyze", str(cap), "--by", "instance"])
    out = capsys.readouterr().out
    assert next(line for line in out.splitlines() if line.startswith("b:1")).endswith("<- hot")
    assert "hot replica: b:1" in out and "verdict: queue" in out


def test_nothing_to_split_and_an_unreachable_prometheus_are_one_line_errors(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    cap = _capture(tmp_path, {"": QUEUE})
    assert main(["analyze", str(cap), "--by", "instance"]) == BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "no engine series with a replica (instance) label" in err and len(err.splitlines()) == 1
    assert main(["analyze", "--from-prometheus", "http://127.0.0.1:9", "--duration", "60"]) == BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "unreachable" in err and len(err.splitlines()) == 1
