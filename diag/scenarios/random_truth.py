"""A mix's ground truth by the engine's own accounting, where the engine has it.

A mix injects two causes, the family's sized to dominate (the second at 5-25% of its cost).
Where both causes have a stage of their own in the engine's spans (``queue``, ``tokenize``,
``prefill``, and ``network``: the client's TTFT less the server's), the ground truth of that
run is the cause whose stage holds more of the measured requests' TTFT (mean seconds), as the
engine recorded it. Read from the span tables (:mod:`diag.tables`), never from the rules.
Other draws keep the truth they were drawn with. Pure functions; the calling thread only.
"""

from __future__ import annotations

import math
from pathlib import Path

from diag import stages
from diag.capture import load_capture
from diag.scenarios.random_draws import Draw
from diag.tables import build_tables

#: a cause -> the engine's stage that holds its time
STAGE_OF: dict[str, str] = {"queue": stages.QUEUE, "tokenize": stages.TOKENIZE, "prefill_compute": stages.PREFILL,
                            "network": stages.NETWORK}


def accounted_truth(d: Draw, captures: list[Path]) -> tuple[str, dict[str, float]]:
    """(ground truth, mean stage seconds per cause) for one run of ``d`` (its capture dirs)."""
    second = d.params.get("mix_second", "")
    if d.kind != "mix" or d.family not in STAGE_OF or second not in STAGE_OF:
        return d.expected, {}
    req = build_tables([load_capture(p) for p in captures if Path(p).exists()]).requests
    if "warmup" in req.columns:
        req = req[~req["warmup"].fillna(False).astype(bool)]
    means: dict[str, float] = {}
    for cause in (d.family, second):
        col = stages.stage_column(STAGE_OF[cause])
        vals = req[col].dropna() if col in req.columns else []
        means[cause] = float(vals.mean()) if len(vals) else math.nan
    if any(math.isnan(v) for v in means.values()):
        return d.expected, means  # the engine did not account for one of them: keep the design's truth
    return (d.family if means[d.family] >= means[second] else second), means
