"""The report as strict JSON: ``analysis.to_dict()`` plus the report's percentiles, resources
and SLO results. Numbers stay numbers (seconds, shares 0..1); :func:`diag.units.json_safe` turns
NaN/inf into null. Pure function, any thread.
"""

from __future__ import annotations

import json

from diag.report.gather import ReportData
from diag.units import json_safe


def render_json(r: ReportData) -> str:
    """The report document as JSON text (``allow_nan=False``: strict JSON)."""
    doc = dict(r.analysis.to_dict())
    doc["percentiles"] = r.percentiles
    doc["resources"] = r.resources
    doc["slo"] = [s.to_dict() for s in r.slo]
    doc["slo_passed"] = all(s.passed for s in r.slo)
    doc["report"] = {"title": r.title, "generated": r.generated, "verdict_line": r.verdict_line}
    return json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"


__all__ = ["render_json"]
