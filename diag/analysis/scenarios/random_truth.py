"""A mix's ground truth by the engine's own accounting, where the engine has it.

A mix injects two causes, the family's sized to dominate (the second at 5-25% of its cost).
Where both causes have a stage of their own in the engine's spans (``queue``, ``tokenize``,
``prefill``, and ``network``: the client's TTFT less the server's), the ground truth of that
run is the cause whose stage holds more of the measured requests' TTFT (mean seconds), as the
engine recorded it. Read from the span tables (:mod:`diag.ground.tables`), never from the rules.
Other draws keep the truth they were drawn with.

A draw designed ``healthy`` (plain or near-miss) is void in a run whose measured TTFT, TPOT or
ITL broke the users' SLO (:func:`slo_broken`, from the request table and token times); an
``interference`` or ``decode`` run, whose bottleneck is the target it breaks, is void when its
SLO held; a ``decode`` run is void too when its TTFT target broke (decode is "TTFT fine, ITL
bad"). The injection did not make what it was designed to there, so that run scores
neither way and is listed apart. So is a run whose probe was starved by something else on the
machine (:func:`client_starved`: the probe's own ``client_health`` says saturated) in a family
that did not starve it by design (every family but ``loadgen``): its TTFTs carry the client's
delay, and ``loadgen`` is then the measurement's honest outcome, not the draw's cause.
Pure functions; the calling thread only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from diag.ground import stages
import numpy as np
import pandas as pd

from diag.ground.capture import attribute, load_capture
from diag.analysis.scenarios.random_draws import Draw
from diag.ground.slo import parse_slo
from diag.ground.tables import build_tables

#: client-only: verdicts that also count as right for a truth the client cannot observe. A KV
#: limit is not visible from the client: the requests it holds back wait in the engine's queue
#: stage (its own accounting), and TTFT against concurrency (or the line at one level) is the
#: same curve a batch cap or a saturated device gives. The queue findings say so and send the
#: user to the engine's KV gauges. For every such truth ``inconclusive`` is right too: the verdict
#: contract's answer when the data cannot decide, its first check the server's view that would
#: (docs/verdict.md). Scored right, and counted apart in the matrix output.
_CLIENT_SEES: dict[str, frozenset[str]] = {"kv_cache": frozenset({"queue"}),
                                           # requests held in a front end's line look, from the client,
                                           # like a line in the engine (queue), or under a sweep like any
                                           # admission limit at the pool's size (kv_cache's black-box knee,
                                           # which says a batch cap looks the same): only its /metrics or
                                           # spans tell; at light load its per-request work is a fixed
                                           # latency no prompt explains, which the client-only network
                                           # finding names as "network, proxy or front end"
                                           "frontend": frozenset({"queue", "kv_cache", "network"}),
                                           # pipeline stages are invisible to a client: it sees the
                                           # prefill they stretch (catalogue: Scenario.client_only_also);
                                           # with short prompts that prefill is still a few (long, PP)
                                           # decode steps, which the verdict contract calls healthy
                                           # ([prefill_compute] prompt_steps_min): no client tells it apart
                                           "pipeline_bubble": frozenset({"prefill_compute", "healthy"}),
                                           # a reservation limit looks, from the client, like a cap on
                                           # running requests (catalogue: Scenario.client_only_also)
                                           "kv_reservation": frozenset({"queue", "kv_cache"}),
                                           # a step loop idle between steps: a client sees slower
                                           # tokens and TTFT, as a slower device gives (catalogue:
                                           # Scenario.client_only_also)
                                           "engine_overhead": frozenset({"healthy"}),
                                           # the hand-off between prefill and decode instances: a client
                                           # sees a latency it cannot place, and one transfer at a time
                                           # on the link a line, or it says it cannot tell (inconclusive,
                                           # joining the server's spans first; catalogue:
                                           # Scenario.client_only_also)
                                           "pd_transfer": frozenset({"healthy", "network", "queue"})}
CLIENT_ONLY_ALSO: dict[str, frozenset[str]] = {truth: also | {"inconclusive"} for truth, also in _CLIENT_SEES.items()}


def scored_right(category: str, truth: str, mode: str) -> bool:
    """Whether a verdict ``category`` is right for ``truth`` in ``mode`` (``client-only`` accepts
    :data:`CLIENT_ONLY_ALSO`)."""
    return category == truth or (mode == "client-only" and category in CLIENT_ONLY_ALSO.get(truth, ()))


#: the truth of a run that did not come out as designed (scored neither way)
VOID = "void"
#: causes whose bottleneck is defined by the users' target it breaks (the catalogue's too)
SLO_DEFINED = ("interference", "decode")
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


def _token_gaps_s(captures: list[Path], measured_traces: set[str]) -> np.ndarray:
    """Every token gap (s) of the measured requests, pooled (the client's token times first)."""
    for cap in captures:  # the client capture comes first in a scenario run
        spans = load_capture(cap).spans if Path(cap).exists() else None
        if spans is None or spans.empty:
            continue
        times = attribute(spans, stages.ATTR_TOKEN_TIMES_NS)
        gaps = [np.diff(np.asarray(tt, dtype="int64")) / 1e9 for tid, tt in zip(spans["trace_id"], times)
                if str(tid) in measured_traces and isinstance(tt, (list, tuple, np.ndarray)) and len(tt) > 1]
        if gaps:
            return np.concatenate(gaps)
    return np.asarray([], dtype="float64")


def slo_broken(slo: str | None, captures: list[Path]) -> dict[str, tuple[float, float]]:
    """The SLO items (TTFT, TPOT, ITL over all token gaps pooled) the measured requests broke:
    {item: (measured s, target s)}."""
    if not slo:
        return {}
    req = _measured(captures)
    out: dict[str, tuple[float, float]] = {}
    for item, target_s in parse_slo(slo).items():
        metric, pct = item.rsplit("_", 1)
        if metric == "itl":
            vals = pd.Series(_token_gaps_s(captures, {str(t) for t in req.get("trace_id", [])}))
        else:
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


def client_starved(client: Path) -> float | None:
    """The share of the run the probe's event loop was stalled when its ``client_health`` (meta.json
    of the client capture, written by the probe) says it was saturated; None when it was not."""
    try:
        health = json.loads((Path(client) / "meta.json").read_text()).get("client_health") or {}
    except (OSError, ValueError):
        return None
    return float(health.get("loop_stall_frac") or 0.0) if health.get("saturated") else None


def run_truth(d: Draw, slo: str | None, captures: list[Path]) -> tuple[str, dict[str, float]]:
    """One run's ground truth: the mix's by accounting; ``void`` for a designed-healthy run
    whose users' SLO broke, or a run whose probe was starved outside the ``loadgen`` family; else
    the draw's. The dict holds the accounting, the broken items or the probe's stall share. The
    client capture comes first in ``captures``."""
    if d.family != "loadgen" and captures:
        stalled = client_starved(captures[0])
        if stalled is not None:
            return VOID, {"client_loop_stall_frac": round(stalled, 3)}
    if d.expected == "healthy":
        broken = slo_broken(slo, captures)
        if broken:
            return VOID, {k: round(v[0], 6) for k, v in broken.items()}
        return d.expected, {}
    if d.expected in SLO_DEFINED and slo:
        broken = slo_broken(slo, captures)
        if not broken:
            return VOID, {"slo_met": 1.0}  # the cause was there but did not hurt its users in this run
        ttft = {k: round(v[0], 6) for k, v in broken.items() if k.startswith("ttft")}
        if d.expected == "decode" and ttft:
            # decode is the article's "TTFT fine, ITL bad": a run whose users' TTFT target broke too (a
            # mix's second cause queued the many streams' prompts) has a TTFT cause, not the designed one
            return VOID, ttft
    return accounted_truth(d, captures)
