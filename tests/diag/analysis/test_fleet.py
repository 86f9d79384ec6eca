"""Per-replica verdicts from one capture's engine series (``ttft analyze --by instance``): each
replica is judged on its own rows, the hot one is the bottleneck with the highest TTFT p95, and
a capture with nothing to split is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from diag.cli import main
from diag.ground.exit_codes import BAD_INPUT
from diag.analysis.fleet import analyze_fleet
from diag.analysis.report.jsondoc import SCHEMA_PATH

from support.fleet_captures import CALM, QUEUE, fleet_capture


def test_each_replica_is_judged_on_its_own_rows_and_the_hot_one_is_named(tmp_path: Path) -> None:
    cap = fleet_capture(tmp_path, {"10.0.0.1:8000": CALM, "10.0.0.2:8000": QUEUE, "10.0.0.3:8000": CALM})
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
    cap = fleet_capture(tmp_path, {"a:1": CALM, "b:1": QUEUE})
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
    cap = fleet_capture(tmp_path, {"": QUEUE})
    assert main(["analyze", str(cap), "--by", "instance"]) == BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "no engine series with a replica (instance) label" in err and len(err.splitlines()) == 1
    assert main(["analyze", "--from-prometheus", "http://127.0.0.1:9", "--duration", "60"]) == BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "unreachable" in err and len(err.splitlines()) == 1
