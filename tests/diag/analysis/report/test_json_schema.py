"""The JSON documents other tools read carry their schema and version, and match the JSON Schema
file shipped in the package (analyze --json, report -o .json, diff --json)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from diag.ground.capture import tool_version
from diag.cli import main
from diag.analysis.report.jsondoc import SCHEMA_PATH, SCHEMA_VERSION

SAMPLES = Path(__file__).resolve().parents[4] / "samples"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _check(validator: jsonschema.Draft202012Validator, doc: dict, kind: str) -> None:
    assert doc["schema"] == kind and doc["schema_version"] == SCHEMA_VERSION and doc["tool_version"] == tool_version()
    errors = [f"{list(e.absolute_path)}: {e.message[:120]}" for e in validator.iter_errors(doc)]
    assert not errors, errors


def test_analyze_report_and_diff_documents_match_the_schema(validator, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(SAMPLES / "kv_cache"), "--json"]) == 0
    _check(validator, json.loads(capsys.readouterr().out), "analysis")
    out = tmp_path / "r.json"
    assert main(["report", str(SAMPLES / "kv_cache"), "-o", str(out), "--slo", "ttft_p99=100ms"]) == 1
    _check(validator, json.loads(out.read_text()), "report")
    capsys.readouterr()
    assert main(["diff", str(SAMPLES / "interference"), str(SAMPLES / "interference_chunked"), "--json",
                 "--fail-on", "itl_p99=+10%"]) == 0
    _check(validator, json.loads(capsys.readouterr().out), "diff")


def test_an_slo_evidence_row_matches_the_schema(validator, capsys: pytest.CaptureFixture[str]) -> None:
    """The decode sample records an ITL SLO: its rows carry the target as a number (seconds) with the
    comparison that breaks it, and whether it did."""
    main(["analyze", str(SAMPLES / "decode"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    rows = [e for e in doc["verdict"]["evidence"] if e["name"].startswith("SLO ")]
    assert rows
    for e in rows:
        assert isinstance(e["threshold"], float) and e["op"] == ">" and e["unit"] == "s"
        assert e["crossed"] is (e["value"] > e["threshold"])
    _check(validator, doc, "analysis")


@pytest.mark.slow
@pytest.mark.parametrize("sample", sorted(p.parent.parent.name if p.parent.name == "client" else p.parent.name
                                          for p in SAMPLES.glob("*/client/meta.json")))
def test_every_sample_analysis_matches_the_schema(validator, sample: str, capsys: pytest.CaptureFixture[str]) -> None:
    main(["analyze", str(SAMPLES / sample), "--json"])
    _check(validator, json.loads(capsys.readouterr().out), "analysis")


def test_the_schema_rejects_a_document_without_its_version(validator) -> None:
    assert not validator.is_valid({"schema": "analysis", "tool_version": "0.1.0"})
    assert not validator.is_valid({"schema": "diff", "schema_version": SCHEMA_VERSION, "tool_version": "x"})
