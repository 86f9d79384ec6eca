"""A mix's ground truth by the engine's own accounting, where the engine has it.

A mix injects two causes, the family's sized to dominate (the second at 5-25% of its cost).
Where both causes have a stage of their own in the engine's spans (``queue``, ``tokenize``,
``prefill``, and ``network``: the client's TTFT less the server's), the ground truth of that
run is the cause whose stage holds more of the measured requests' TTFT (mean seconds), as the
engine recorded it. Read from the span tables (:mod:`diag.tables`), never from the rules.
Other draws keep the truth they were drawn with.

A draw designed ``healthy`` (plain or near-miss) is void in a run whose measured TTFT or TPOT
broke the users' SLO (:func:`slo_broken`, from the request table): the injection did not
make a healthy server there, so that run scores neither way and is listed apart.
Pure functions; the calling thread only.
"""

from __future__ import annotations

import math
from pathlib import Path

from diag import stages
from diag.capture import load_capture
from diag.scenarios.random_draws import Draw
from diag.slo import parse_slo
from diag.tables import build_tables

#: the truth of a run that did not come out as designed (scored neither way)
VOID = "void"
_PCT = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "max": 1.0}

#: a cause -> the engine's stage that holds its time
STAGE_OF: dict[str, str] = {"queue": stages.QUEUE, "tokenize": stages.TOKENIZE, "prefill_compute": stages.PREFILL,
                            "network": stages.NETWORK}


def accounted_truth(d: Draw, captures: list[Path]) -> tuple[str, dict[str, float]]:
    """(ground truth, mean stage seconds per cause) for one run of ``d`` (its capture dirs)."""
    second = d.params.get("mix_second", "")
    if d.kind != "mix" or d.family not in STAGE_OF or second not in STAGE_OF:
        return d.expected, {}
    req = _measured(captures)
    means: dict[str, float] = {}
    for cause in (d.family, second):
        col = stages.stage_column(STAGE_OF[cause])
        vals = req[col].dropna() if col in req.columns else []
        means[cause] = float(vals.mean()) if len(vals) else math.nan
    if any(math.isnan(v) for v in means.values()):
        return d.expected, means  # the engine did not account for one of them: keep the design's truth
    return (d.family if means[d.family] >= means[second] else second), means


def _measured(captures: list[Path]):  # -> pd.DataFrame: the measured (non-warm-up) requests
    req = build_tables([load_capture(p) for p in captures if Path(p).exists()]).requests
    if "warmup" in req.columns:
        req = req[~req["warmup"].fillna(False).astype(bool)]
    return req


def slo_broken(slo: str | None, captures: list[Path]) -> dict[str, tuple[float, float]]:
    """The SLO items (TTFT and TPOT; ITL is not checked here) the measured requests broke:
    {item: (measured s, target s)}."""
    if not slo:
        return {}
    req = _measured(captures)
    out: dict[str, tuple[float, float]] = {}
    for item, target_s in parse_slo(slo).items():
        metric, pct = item.rsplit("_", 1)
        col = {"ttft": "ttft_s", "tpot": "tpot_s"}.get(metric)
        if col is None or col not in req.columns:
            continue
        vals = req[col].dropna()
        if not len(vals):
            continue
        got = float(vals.mean()) if pct == "mean" else float(vals.quantile(_PCT.get(pct, 0.99)))
        if got > target_s:
            out[item] = (got, target_s)
    return out


def run_truth(d: Draw, slo: str | None, captures: list[Path]) -> tuple[str, dict[str, float]]:
    """One run's ground truth: the mix's by accounting; ``void`` for a designed-healthy run
    whose users' SLO broke; else the draw's. The dict holds the accounting or the broken items."""
    if d.expected == "healthy":
        broken = slo_broken(slo, captures)
        if broken:
            return VOID, {k: round(v[0], 6) for k, v in broken.items()}
        return d.expected, {}
    return accounted_truth(d, captures)
