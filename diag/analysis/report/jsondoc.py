"""The JSON documents other tools read: ``analyze --json``, ``report -o .json`` and ``diff --json``
(and ``analyze --by LABEL --json``: :func:`diag.analysis.report.fleet.fleet_document`).

Every document starts with ``schema`` (which shape: ``analysis``, ``report``, ``diff`` or
``fleet``), ``schema_version`` (:data:`SCHEMA_VERSION`, raised when a field changes meaning or
goes away) and ``tool_version``; the shape is described by the JSON Schema file
:data:`SCHEMA_PATH` shipped in the package. Numbers stay numbers (seconds, shares 0..1);
:func:`diag.ground.units.json_safe` turns NaN/inf into null. Pure functions, any thread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diag.analysis import Analysis
from diag.ground.capture import tool_version
from diag.analysis.report.gather import ReportData
from diag.ground.units import json_safe

SCHEMA_VERSION = 1
#: the JSON Schema (draft 2020-12) of all three documents
SCHEMA_PATH = Path(__file__).with_name("schema") / "ttft-diag.schema.json"


def envelope(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` under the version header every document carries (``kind``: analysis/report/diff)."""
    head: dict[str, Any] = {"schema": kind, "schema_version": SCHEMA_VERSION, "tool_version": tool_version()}
    return json_safe({**head, **{k: v for k, v in body.items() if k not in head}})


def analysis_document(analysis: Analysis) -> dict[str, Any]:
    """``ttft analyze --json``: the analysis (decomposition, verdict, findings) with its header."""
    return envelope("analysis", dict(analysis.to_dict()))


def render_json(r: ReportData) -> str:
    """The report document as JSON text (``allow_nan=False``: strict JSON)."""
    doc = dict(r.analysis.to_dict())
    doc["percentiles"] = r.percentiles
    doc["resources"] = r.resources
    doc["slo"] = [s.to_dict() for s in r.slo]
    doc["slo_passed"] = all(s.passed for s in r.slo)
    doc["report"] = {"title": r.title, "generated": r.generated, "verdict_line": r.verdict_line}
    return json.dumps(envelope("report", doc), indent=2, allow_nan=False) + "\n"


__all__ = ["SCHEMA_PATH", "SCHEMA_VERSION", "analysis_document", "envelope", "render_json"]
