"""The verdict contract: which finding answers "why is TTFT what it is", and what is said when none can.

1. **Candidates** are findings of a cause of TTFT (:attr:`rules.registry.Kind.TTFT`, a cold
   start that reached users), the measurement's own outcomes (``failures``, ``loadgen``), and
   findings about ITL (``decode``, ``interference``) only when an ITL or TPOT target given with
   ``--slo`` is broken. Every other finding stands beside the verdict, never as it.
2. The top-ranked candidate is **the verdict** when its confidence reaches the floor
   (``[general] verdict_floor``, 0.7: the level ``ttft diagnose`` calls confident).
   A load generator the machine starved (not its own work) yields to a cause at the floor that
   stands without client timing. A waiting cause (:data:`WAITS`) yields to ``healthy`` where the
   own-work floor sees no wait, its tail included (no SLO broken): demoted, the leading candidate.
3. Below the floor the candidate is the **leading candidate** (:attr:`rules.model.Diagnosis.leading`)
   and the verdict is ``healthy`` when healthy has positive evidence — nothing waits (each TTFT
   within ``[healthy]`` factors of the request's own work on this server, :mod:`rules.features.floor`)
   and the candidate is prompt work, which every request pays, under ``[general] strong_confidence``
   (a TTFT finding at least that sure says TTFT is not fine) — or else ``inconclusive``, naming the
   candidate and the experiment that would decide.

Pure functions over the engine's findings; called by :func:`rules.runner.run_rules` on its thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rules import evidence
from rules.config import load_thresholds
from rules.model import FAILURES, INCONCLUSIVE, NO_DATA, Evidence, Finding
from rules.overrides import demote, timing_free
from rules.registry import Kind, kind_of

#: measurement outcomes that can be the verdict: the run itself failed or the client was the limit
OUTCOME_CANDIDATES: frozenset[str] = frozenset({FAILURES, "loadgen"})
#: causes whose time is each request's own work at its own cost: below the floor, with nothing
#: waiting, they are a note under ``healthy`` (prompt work every request pays), not a bottleneck
OWN_WORK: frozenset[str] = frozenset({"prefill_compute"})
#: causes that are requests waiting (for admission, KV space, a front end, a long prompt ahead):
#: when the own-work floor says nothing waits, none of them is the verdict (:func:`settle`)
WAITS: frozenset[str] = frozenset({"queue", "kv_cache", "kv_reservation", "head_of_line", "frontend"})
#: the default verdict floor (``[general] verdict_floor`` of rules/defaults.toml; a rules file may change it)
VERDICT_FLOOR: float = float(load_thresholds(None)["general"]["verdict_floor"])
HEALTHY_ID = "healthy"
UNDECIDED_ID = "undecided"
#: verdicts that are not a cause: every SLO met or nothing waits (healthy), the data cannot decide, nothing to judge
VERDICT_ONLY: frozenset[str] = frozenset({HEALTHY_ID, INCONCLUSIVE, NO_DATA})


def itl_target_broken(feats: Any) -> bool:
    """Whether an ITL or TPOT target given with ``--slo`` is broken (incl. ttft diagnose's mixed follow-up)."""
    checks = feats.value("slo_checks") or {}
    mixed = feats.value("itl_mixed_slo") or {}
    return (any(k.startswith(("itl", "tpot")) and c.get("met") is False for k, c in checks.items())
            or any(c.get("met") is False for c in mixed.values()))


def machine_starved(feats: Any) -> bool:
    """Whether the client's lateness at first tokens was the machine's doing (its loop given no CPU)
    more than its own (features of :func:`rules.features.client.client_health`)."""
    starved = feats.value("client_first_token_starved_share")
    return starved is not None and starved > (feats.value("client_first_token_own_lag_share") or 0.0)


def is_candidate(f: Finding, itl_broken: bool) -> bool:
    """Whether ``f`` may be the verdict (point 1 of the contract)."""
    kind = kind_of(f.category)
    if kind is Kind.TTFT or f.category in OUTCOME_CANDIDATES or f.category == "cold_start":
        return True
    return kind is Kind.ITL and itl_broken


def floor_rows(feats: Any, th: Mapping[str, Any]) -> tuple[bool | None, list[Evidence]]:
    """(nothing waits, evidence rows) from the own-work floor: True when the median and the 90th
    percentile of TTFT / floor are within ``[healthy] floor_ratio_p50_max`` and ``floor_ratio_p90_max``,
    False when either is past it, None when the capture has no floor."""
    r50, r90 = feats.value("ttft_over_floor_p50"), feats.value("ttft_over_floor_p90")
    if r50 is None or r90 is None:
        return None, []
    lim50, lim90 = float(th["floor_ratio_p50_max"]), float(th["floor_ratio_p90_max"])
    src = feats.get("ttft_over_floor_p50").source or ""
    rows = [evidence.row(evidence.FLOOR_RATIO_P50, r50, lim50, "x",
                     f"own work: {src}", op="<=", crossed=r50 <= lim50),
            evidence.row(evidence.FLOOR_RATIO_P90, r90, lim90, "x",
                     "the slowest requests against theirs: a wait shows here first", op="<=", crossed=r90 <= lim90),
            evidence.row(evidence.FLOOR_P50, feats.value("ttft_floor_p50_s"), None, "s",
                     f"measured on {feats.value('ttft_floor_n', 0):g} requests in this capture")]
    return r50 <= lim50 and r90 <= lim90, rows


def unsplit_spread(feats: Any, th: Mapping[str, Any]) -> bool:
    """Client only: lone requests many decode steps long (``[healthy] long_lone_steps_min``) whose
    prompts do vary, yet the prompt fit does not resolve them (R² under ``long_lone_r2_max``): prompt
    work (or a slow stage per token) may hold them back and nothing here says, so the floor vouches
    for nothing and the verdict is inconclusive with the prompt sweep first. One prompt length (no
    fit) stays healthy, said less surely (:func:`healthy_by_floor`)."""
    steps, r2 = feats.value("ttft_in_itl_steps_p50"), feats.value("ttft_prompt_r2")
    return (steps is not None and steps >= float(th["long_lone_steps_min"]) and r2 is not None
            and r2 < float(th["long_lone_r2_max"]) and not feats.available("stage_shares_median"))


def decomposition_rows(feats: Any, top: int = 3) -> list[Evidence]:
    """The largest stage shares of the median request's TTFT (server spans), as context rows."""
    shares = feats.value("stage_shares_median") or {}
    return [evidence.row(evidence.stage_share_median(stage), share, None, "share", "where a typical TTFT goes")
            for stage, share in sorted(shares.items(), key=lambda kv: -kv[1])[:top]]


def healthy_by_floor(feats: Any, th: Mapping[str, Any], sample_factor: float,
                     leading: Finding | None = None) -> Finding | None:
    """``healthy`` with the floor and the decomposition as its evidence, when nothing waits; else None."""
    waits_not, rows = floor_rows(feats, th)
    if not waits_not or unsplit_spread(feats, th):
        return None
    rows = rows + decomposition_rows(feats)
    rows.append(evidence.row(evidence.TTFT_P95, feats.value("ttft_p95_s"), None, "s", "over the steady requests"))
    note = "nothing waits: each TTFT is what the request's own work costs on this server"
    if leading is not None and leading.conditional:
        note += (f"; {leading.category} ({leading.confidence:.2f}) holds only for prompts like the tool's own test, "
                 "not a wait seen in this load (`--workload` says what your users send, to judge it for them)")
    elif leading is not None and leading.category in WAITS:
        note += (f"; {leading.category} ({leading.confidence:.2f}): requests do wait, but within the floor's factors "
                 "of their own work, not a bottleneck")
    elif leading is not None:
        note += (f"; {leading.category} ({leading.confidence:.2f}) is most of that time, a cost every request pays, "
                 "not a bottleneck")
    checks = ["give an SLO (--slo ttft_p99=…) to judge whether that own work is fast enough for your users",
              "what the own work is made of: the stage decomposition below (or, client only, a prompt sweep "
              "splits prompt work from a fixed part)"]
    confidence = float(th["floor_confidence"]) * sample_factor
    steps = feats.value("ttft_in_itl_steps_p50")
    split = not feats.available("stage_shares_median") and not feats.available("ttft_prompt_r2")
    if steps is not None and steps >= float(th["long_lone_steps_min"]) and split:
        # a lone request takes many decode steps and nothing here says of what: a fixed part (network,
        # a proxy, the server's per-request work) or prompt work; healthy, said less surely
        rows.insert(0, evidence.row(evidence.TTFT_P50_STEPS, steps, float(th["long_lone_steps_min"]), "steps",
                                "a lone request's first token takes this many decode steps: prompt work or a fixed "
                                "part, which only a prompt sweep (or the server's spans) tells apart", op=">=",
                                crossed=True))
        note += f"; a lone request's TTFT is {steps:.0f} decode steps, of what this capture cannot say"
        checks.insert(0, "run `ttft probe URL --sweep prompt` (a few requests per length): TTFT growing with the "
                         "prompt is prompt work; a fixed part many decode steps long is outside the engine's prompt "
                         "work (network, a proxy, the server's per-request overhead); or join the server's spans "
                         "(`ttft analyze CLIENT SERVER`)")
        confidence *= float(th["long_lone_scale"])
    return Finding(HEALTHY_ID, HEALTHY_ID, "Healthy: nothing waits; TTFT is each request's own work on this server",
                   round(confidence, 3), None, None, rows, checks, note=note, tier=5)


def deciding_experiment(f: Finding, feats: Any, min_requests: int) -> list[str]:
    """The experiment that would decide whether ``f`` is the cause, first; then its own next checks."""
    out: list[str] = []
    n = feats.value("requests_n")
    if f.black_box:
        out.append("join the server's view: its OTLP spans (`ttft analyze CLIENT SERVER`, `ttft instrument`) or its "
                   "/metrics (`--metrics URL`) measure the stages the client only infers")
    if n is not None and n < min_requests:
        out.append(f"more requests: {n:g} completed, the rules want {min_requests} (`-n`, or a longer --budget)")
    own = f.next_checks[:2]
    if (f.black_box and not feats.available("ttft_by_inflight") and f.category in ("queue", "kv_cache", "frontend",
                                                                                     "kv_reservation")
            and not any("--sweep concurrency" in c for c in own)):
        out.append("`ttft probe URL --sweep concurrency`: TTFT rising from the lowest level while decode speed holds "
                   "is requests waiting to be admitted")
    out.extend(c for c in own if c not in out)
    return out


def undecided(leading: Finding, feats: Any, th: Mapping[str, Any], floor: float, min_requests: int) -> Finding:
    """``inconclusive`` naming the leading candidate below the floor and the experiment that decides."""
    _, rows = floor_rows(feats, th)
    shown = [evidence.row(evidence.LEADING_CONFIDENCE, leading.confidence, floor, "",
                          f"{leading.category}: {leading.title}", op=">=", crossed=False)]
    shown += leading.evidence[:4] + rows
    return Finding(UNDECIDED_ID, INCONCLUSIVE,
                   f"Inconclusive: {leading.category} leads ({leading.confidence:.2f}) but is not sure enough to name "
                   f"(a verdict needs {floor:g})", float(th["undecided_confidence"]), leading.explained_s,
                   leading.explained_pct, shown, deciding_experiment(leading, feats, min_requests),
                   note="the leading candidate, not a verdict to act on alone: the first check is the experiment "
                   "that would decide", tier=leading.tier, black_box=leading.black_box)


def near_tie(findings: list[Finding], frac: float, itl_broken: bool) -> None:
    """Settle a near tie between the two top candidates (scores within ``frac`` of the higher), in
    place: the one that overrode the other (``demoted_by``) ranks first; otherwise the one whose time is
    the larger share of every request's TTFT (``population_share``, else its share of TTFT p95); each
    names the other in its note, since noise alone can swap them. Candidates of different tiers never
    tie."""
    cands = [f for f in findings if is_candidate(f, itl_broken)]
    if len(cands) < 2:
        return
    a, b = cands[0], cands[1]
    if a.tier != b.tier or a.score <= 0 or (a.score - b.score) > frac * a.score:
        return

    def reach(f: Finding) -> float:
        return f.population_share if f.population_share is not None else (f.explained_pct or 0.0) / 100.0

    if b.category in a.demoted_by or a.category in b.demoted_by:
        # the override table already said which owns the time: the winner ranks first
        first, second = (b, a) if b.category in a.demoted_by else (a, b)
    else:
        first, second = (b, a) if reach(b) > reach(a) else (a, b)
    first.add_note(f"near tie with {second.category} ({second.confidence:.2f}): both hold here; ranked first as "
                   + ("the one that overrides it" if first.category in second.demoted_by
                      else "the larger share of all requests' TTFT"))
    second.add_note(f"near tie with {first.category} ({first.confidence:.2f}), ranked after it")
    if first is b:
        i, j = findings.index(a), findings.index(b)
        findings[i], findings[j] = b, a


def _tail_waits(feats: Any, th: Mapping[str, Any]) -> bool:
    """Whether the slowest 5% of TTFT sit beyond ``[healthy] wait_p95_over_floor_max`` times the
    median request's own work (or either is unknown): a wait in the tail that the floor's median
    and 90th percentile do not reach, as when some requests wait long behind others."""
    p95, own = feats.value("ttft_p95_s"), feats.value("ttft_floor_p50_s")
    return p95 is None or not own or p95 / own > float(th["wait_p95_over_floor_max"])


def _wait_unseen(top: Finding, feats: Any, th: Mapping[str, Any], sample_factor: float) -> Finding | None:
    """``healthy`` over a waiting cause the own-work floor does not see, with ``top`` demoted; else
    None. TTFT within the floor's factors of each request's own work (the median and the 90th
    percentile), its tail included, is what "nothing waits" means, whatever share of the slowest
    TTFTs the wait is (a few ms of queue in a fast TTFT)."""
    hth = th["healthy"]
    nothing_waits, _ = floor_rows(feats, hth)
    if not nothing_waits or unsplit_spread(feats, hth) or _tail_waits(feats, hth):
        return None
    demote(top, HEALTHY_ID, "TTFT is within the own-work floor's factors (median and 90th percentile): "
           "these waits are not a material part of what users wait", float(th["general"]["demote_factor"]))
    return healthy_by_floor(feats, hth, sample_factor, leading=top)


def settle(findings: list[Finding], feats: Any, th: Mapping[str, Any], sample_factor: float,
           itl_broken: bool, slo_broken: bool = False) -> tuple[Finding, Finding | None]:
    """(verdict, leading candidate or None) from ``findings`` ranked best first. The verdict is put
    first in ``findings`` (a verdict made here, healthy or inconclusive, is inserted there). With an
    SLO broken (``slo_broken``) the verdict is never healthy."""
    general = th["general"]
    floor = float(general["verdict_floor"])
    top = next((f for f in findings if is_candidate(f, itl_broken)), None)
    if top is not None and top.category == "loadgen" and machine_starved(feats):
        # the machine, not the client, made the client late: a cause that stands without client
        # timing (the server's spans or /metrics, counts of streams) and reaches the floor is the verdict
        sure = next((f for f in findings if f is not top and is_candidate(f, itl_broken) and timing_free(f)
                     and f.category != "loadgen" and f.confidence >= floor), None)
        if sure is not None:
            sure.add_note("the verdict over loadgen: the machine starved the client's loop, and this cause stands "
                          "on what the server measured or on counts of streams, not on client timing")
            top = sure
    # a verdict the engine already made: every SLO met (healthy), no cause and TTFT far above (inconclusive)
    made = next((f for f in findings if f.category in VERDICT_ONLY), None)
    failing = any(f.category == FAILURES for f in findings)
    if top is None or (made is not None and findings.index(made) < findings.index(top)):
        verdict, leading = (made or findings[0]), None
    elif (top.category in WAITS and not failing and not slo_broken
          and (waits_unseen := _wait_unseen(top, feats, th, sample_factor)) is not None):
        verdict, leading = waits_unseen, top
    elif top.confidence >= floor:
        verdict, leading = top, None
    else:
        leading = top
        verdict = None
        # prompt work every request pays, or a finding that holds only if the users' prompts are like the
        # tool's own test (conditional): neither is a wait, so the floor may still say nothing waits
        if ((top.category in OWN_WORK or top.conditional) and top.confidence < float(general["strong_confidence"])
                and not failing and not slo_broken):
            verdict = healthy_by_floor(feats, th["healthy"], sample_factor, leading=top)
        if verdict is None:
            verdict = undecided(top, feats, th["healthy"], floor, int(general["min_requests"]))
    rest = [f for f in findings if f is not verdict]
    findings[:] = [verdict, *rest]
    return verdict, leading


__all__ = ["HEALTHY_ID", "OUTCOME_CANDIDATES", "OWN_WORK", "UNDECIDED_ID", "VERDICT_FLOOR", "VERDICT_ONLY", "WAITS",
           "decomposition_rows", "deciding_experiment", "floor_rows", "healthy_by_floor", "is_candidate",
           "itl_target_broken", "machine_starved", "near_tie", "settle", "undecided", "unsplit_spread"]
