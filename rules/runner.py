"""Runs the registered rules over a capture's features and ranks what they find.

Order of work: thresholds -> features -> each rule (or "skipped: needs …") -> cross-rule
adjustments (the table of :mod:`rules.overrides`: the load generator, KV admission,
TTFT-not-fine, SLO met) -> failures (never healthy) / inconclusive (:mod:`rules.inconclusive`)
/ healthy / fallback -> ranking by tier, then confidence x weight (the share of every request's
TTFT the cause explains when its rule measured it: who waits, and how many; else its share of
TTFT p95), near ties settled by :func:`rules.verdict.near_tie` -> the verdict contract
(:func:`rules.verdict.settle`). Overlapping explanations are never summed. Start-up that did not
reach users is a note ("start-up 0.41 s: … — not TTFT").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diag.ground import stages
from diag.ground.tables import Tables
# the order of these imports is the order the rules register in, which settles ties: keep it
from rules import admission, compute, queueing, tokenization, kv_cache, edges, itl  # noqa: F401  (register the rules)
from rules import pipeline  # noqa: F401  (registers pipeline_bubble)
from rules import frontend  # noqa: F401  (registers frontend)
from rules import prefix_cache  # noqa: F401  (registers prefix_cache)
from rules import loop  # noqa: F401  (registers engine_overhead)
from rules import grammar  # noqa: F401  (registers grammar_compile)
from rules import lora  # noqa: F401  (registers lora_adapters)
from rules import pd  # noqa: F401  (registers pd_transfer)
from rules import evidence
from rules.base import RuleContext, missing_reason, reason
from rules.config import load_thresholds
from rules.features import compute_features
from rules.edges import startup_note
from rules.inconclusive import inconclusive
from rules.model import FAILURES, HEALTHY, INCONCLUSIVE, NO_DATA, Diagnosis, Evidence, Finding, Passed, Skipped
from rules.overrides import apply_overrides, rank_after_winners
from rules.registry import REGISTRY, Kind, kind_of
from rules.verdict import (floor_rows, healthy_by_floor, is_candidate, itl_target_broken, near_tie, settle,
                           unsplit_spread)

HEALTHY_ID = "healthy"
#: the tier a conditional finding ranks at, at the earliest: after the rules' own (2)
CONDITIONAL_TIER = 3
_STAGE_CATEGORY = {
    stages.QUEUE: "queue", stages.TOKENIZE: "tokenize", stages.PREFILL: "prefill_compute", stages.COMM: "comm",
    stages.SAMPLE: "prefill_compute", stages.DETOKENIZE: "network", stages.NETWORK: "network",
    stages.KV_TRANSFER: "pd_transfer",
    # time the engine does not split (vLLM: input processing, API server <-> engine-core IPC,
    # bookkeeping; joined with a client, tokenization too): no one cause to name
    stages.LUMPED: INCONCLUSIVE,
}


def _slo_state(feats: Any) -> tuple[bool | None, bool | None, list[Evidence]]:
    """(all SLOs met, TTFT SLOs met) or None when no SLO applies; evidence rows."""
    checks = feats.value("slo_checks") or {}
    if not checks:
        return None, None, []
    rows = []
    all_met: bool | None = True
    ttft_met: bool | None = None
    for key, c in checks.items():
        met = c.get("met")
        # the target as a number with the comparison that breaks it; crossed = broken
        state = "met" if met else ("broken" if met is False else "not measurable")
        rows.append(evidence.row(evidence.slo(key), c.get("value_s"), c["target_s"], "s",
                             f"{state} over {c['over']}" if c.get("over") else state,
                             op=">", crossed=None if met is None else met is False))
        if met is False:
            all_met = False
        if key.startswith("ttft"):
            ttft_met = (ttft_met is not False) and bool(met)
    # an ITL target that ttft diagnose's mixed follow-up (long prompts among the streams) broke is broken
    for key, c in (feats.value("itl_mixed_slo") or {}).items():
        if c.get("met") is False:
            rows.append(evidence.row(evidence.slo_mixed(key), c.get("value_s"), c["target_s"], "s",
                                 "broken in ttft diagnose's mixed follow-up", op=">", crossed=True))
            all_met = False
    return all_met, ttft_met, rows


def run_rules(tables: Tables, rules_file: str | None = None, slo: Mapping[str, float] | None = None,
             window_ns: tuple[int, int] | None = None) -> Diagnosis:
    """Features + rules -> a ranked :class:`Diagnosis`. Raises RulesFileError on a bad rules file."""
    th = load_thresholds(rules_file)
    general = th["general"]
    feats = compute_features(tables, window_ns=window_ns, slo=slo, params=th["features"])
    black_box = bool(feats.value("client_only"))
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    passed: list[Passed] = []
    notes: list[str] = []
    n_ok = int(feats.value("requests_n", 0) or 0)
    series_only = bool(feats.value("series_only"))

    for rid, r in REGISTRY.items():
        why = missing_reason(r, feats)
        if why is not None:
            skipped.append(Skipped(rid, why))
            continue
        ctx = RuleContext(feats, th.get(rid, {}), general, dict(slo or {}), black_box, all_th=th)
        try:
            out = r.evaluate(ctx)
        except (TypeError, ZeroDivisionError, KeyError, ValueError) as exc:  # a rule bug must not hide the others
            skipped.append(Skipped(rid, f"skipped: rule failed on this capture ({type(exc).__name__}: {exc})"))
            continue
        if isinstance(out, Finding):
            out.rule_id, out.category = r.id, r.category  # declared once, by the rule's decorator
            # the rule's registered tier, unless the finding promoted itself (a dominant cold start)
            out.tier = min(out.tier, r.tier) if out.category == "cold_start" else r.tier
            if out.conditional:  # after the findings of what was measured (Finding.conditional)
                out.tier = max(out.tier, CONDITIONAL_TIER)
            if r.kind is Kind.ITL:
                out.weight = float(general["itl_weight"])
            elif r.kind is Kind.TTFT:
                share = out.population_share if out.population_share is not None else (out.explained_pct or 0.0) / 100.0
                out.weight = max(float(general["min_weight"]), share)
            else:
                out.weight = 1.0
            if series_only:
                _series_only(out, general)
            findings.append(out)
        else:
            passed.append(Passed(rid, str(out)))

    all_met, ttft_met, slo_rows = _slo_state(feats)
    apply_overrides(findings, all_met, ttft_met, general)

    min_conf = float(general["min_confidence"])
    for f in list(findings):
        if f.confidence < min_conf:
            findings.remove(f)
            passed.append(Passed(f.rule_id, reason("fired too weakly (confidence {c:.2f} < {min:g}): {title}",
                                                   c=f.confidence, min=min_conf, title=f.title)))

    p95 = feats.value("ttft_p95_s")
    hth = th["healthy"]
    if n_ok == 0 and not series_only:
        skipped.append(Skipped(HEALTHY_ID, "skipped: needs completed requests"))
        failed = [f for f in findings if f.category == FAILURES]
        if failed:  # every request failed: what the client saw (refused, timed out, 5xx) is the verdict
            notes.append("no request completed: there is no TTFT to decompose until the server answers")
            return Diagnosis(failed[0], findings, skipped, feats, passed, notes, th)
        verdict = _no_data(feats)
        return Diagnosis(verdict, [verdict] + findings, skipped, feats, passed, notes, th)
    itl_broken = itl_target_broken(feats)
    # the causes that may be the verdict (rules.verdict): ITL findings only against a broken ITL/TPOT target
    main = [f for f in findings if kind_of(f.category) in (Kind.TTFT, Kind.ITL) and is_candidate(f, itl_broken)]
    failing = any(f.category == FAILURES for f in findings)
    sample = RuleContext(feats, {}, general, {}, black_box).sample_factor()
    waits_not, _ = floor_rows(feats, hth) if not (main or failing or all_met) else (None, [])
    if waits_not and unsplit_spread(feats, hth):  # lone, long, prompts that vary unresolved: no floor to vouch
        waits_not = None
    undecided = None if main or failing or all_met or waits_not else inconclusive(
        feats, skipped, th, slo_rows, black_box, waits=waits_not is False, no_floor=waits_not is None)
    if failing:  # a run with a material share of failed requests is never healthy
        passed.append(Passed(HEALTHY_ID, "a material share of requests failed (see failures)"))
    elif undecided is not None:
        findings.append(undecided)
        passed.append(Passed(HEALTHY_ID, "TTFT is far above what this capture says it should be and no rule names "
                                         "why (see inconclusive)"))
    elif all_met:
        findings.append(Finding(HEALTHY_ID, HEALTHY, "Healthy: every SLO given is met",
                                float(hth["slo_confidence"]) * sample,
                                None, None, slo_rows, ["keep the SLOs in CI (`ttft report --slo …` exits non-zero when broken)"],
                                tier=1))
    elif not main and all_met is None and waits_not:
        findings.append(healthy_by_floor(feats, hth, sample))
    elif not main and all_met is None:
        findings.append(Finding(HEALTHY_ID, HEALTHY, "Healthy: no rule crossed its threshold",
                                float(hth["no_slo_confidence"]) * sample,
                                None, None, [evidence.row(evidence.TTFT_P95, p95, None, "s", "over the steady requests")],
                                ["give an SLO (--slo ttft_p99=…) for a firm judgement: without one, healthy means "
                                 "no bottleneck stands out", "a run at concurrency 1 (or a sweep from 1) measures each "
                                 "request's own work, which healthy is then judged against"],
                                note="no SLO given and no lone-request TTFT to compare with", tier=5))
    elif not main and all_met is False:
        findings.append(_fallback(feats, slo_rows))
    else:
        passed.append(Passed(HEALTHY_ID, "findings above explain the TTFT or ITL" if all_met is None else "an SLO is broken"))
    if series_only:
        for f in findings:
            if f.rule_id in (HEALTHY_ID, "slo_fallback"):
                _series_only(f, general)
    if all_met is False and not any(f.category == HEALTHY for f in findings):
        over = next((c["over"] for c in (feats.value("slo_checks") or {}).values() if c.get("over")), None)
        notes.append("an SLO is broken: " + ", ".join(f"{r.name} = {r.value if r.value is None else round(r.value * 1e3, 1)} ms"
                                                      for r in slo_rows if r.crossed)
                     + (f" (over {over})" if over else ""))
    if not any(f.category == "cold_start" for f in findings):
        line = startup_note(RuleContext(feats, th.get("cold_start", {}), general, dict(slo or {}), black_box))
        if line:
            notes.append(line)
    n_cold = int(feats.value("cold_start_outliers_n", 0) or 0)
    if n_cold:
        notes.append(f"{n_cold} first request(s) excluded from the TTFT statistics as cold-start outliers")
    err = feats.value("error_rate")
    if err:
        kinds = feats.value("errors_by_kind") or {}
        notes.append(f"{err:.0%} of requests failed (" + ", ".join(f"{k} x{v}" for k, v in kinds.items())
                     + "); they are left out of TTFT")
    if black_box:
        if feats.value("designed_by_diagnose"):
            notes.append("client-only capture of ttft diagnose's designed experiment: verdicts come from client timing, "
                         "one thing varied per step; what only the server tells apart (a KV limit from a batch cap, "
                         "a pipeline from prefill) is left to the next checks")
        else:
            notes.append("client-only capture: verdicts come from client timing (a sweep, or one load level) with "
                         "lowered confidence")
    if series_only:
        notes.append(f"{SERIES_ONLY_NOTE}: no request in the capture has a TTFT, so TTFT, stage shares and the "
                     "request count come from the engine's /metrics series (windowed means and percentiles); "
                     "confidence lowered")
    findings.sort(key=lambda f: (f.tier, -f.score))
    rank_after_winners(findings)
    near_tie(findings, float(general["near_tie_frac"]), itl_broken)
    verdict, leading = settle(findings, feats, th, sample, itl_broken, slo_broken=all_met is False)
    return Diagnosis(verdict, findings, skipped, feats, passed, notes, th, leading=leading)


SERIES_ONLY_NOTE = "from engine metrics only, no per-request spans"


def _series_only(f: Finding, general: Mapping[str, Any]) -> None:
    """A finding drawn from the engine's metrics alone: lower confidence, say why."""
    f.confidence = round(f.confidence * float(general["series_only_scale"]), 3)
    f.note = f"{f.note}; {SERIES_ONLY_NOTE}" if f.note else SERIES_ONLY_NOTE


def _no_data(feats: Any) -> Finding:
    total = int(feats.value("requests_total_n", 0) or 0)
    failed = int(feats.value("requests_failed_n", 0) or 0)
    if total and failed == total:
        kinds = feats.value("errors_by_kind") or {}
        title = f"Nothing to judge: all {total} requests failed (" + ", ".join(f"{k} x{v}" for k, v in kinds.items()) + ")"
        checks = ["the errors by kind: a server that refuses (503, queue full), times out, or an unreachable endpoint"]
    elif total:
        title = f"Nothing to judge: none of the {total} requests has a TTFT"
        checks = ["whether the capture holds the first-token times (ttft.first_token_ns / client first content)"]
    else:
        title = "Nothing to judge: the capture holds no requests"
        checks = ["that the engine or probe wrote spans into this capture (spans.otlp.jsonl)"]
    return Finding("no_data", NO_DATA, title, 0.0, None, None,
                   [evidence.row(evidence.REQUESTS_N, float(total), None, "requests", "requests in the capture"),
                    evidence.row(evidence.FAILED_N, float(failed), None, "requests", "requests that ended in an error")],
                   checks, tier=0)


def _fallback(feats: Any, slo_rows: list[Evidence]) -> Finding:
    """An SLO is broken but no rule fired: name the largest stage, with low confidence."""
    shares = feats.value("stage_shares_tail") or {}
    if shares:
        stage, share = max(shares.items(), key=lambda kv: kv[1])
        cat = _STAGE_CATEGORY.get(stage, "queue")
        p95 = feats.value("ttft_p95_s")
        return Finding("slo_fallback", cat,
                       f"An SLO is broken and no rule crossed its threshold; the largest stage is {stage} "
                       f"({share:.0%} of TTFT among the slowest 5%)", 0.3,
                       share * p95 if p95 else None, share * 100, slo_rows,
                       [f"the {stage} stage first; then lower the thresholds in a rules file to see what nearly fired"]
                       if cat != INCONCLUSIVE else
                       ["the engine's detailed traces (vLLM --collect-detailed-traces) or its own front-end metrics: "
                        "the lumped stage holds several steps the engine does not time apart"],
                       note="weak: picked by the largest stage share, not by a rule", tier=2)
    return Finding("slo_fallback", "prefill_compute" if feats.value("ttft_prompt_r2", 0) else "queue",
                   "An SLO is broken and no rule crossed its threshold (client-only: no stage breakdown)", 0.2,
                   None, None, slo_rows, ["capture the server side (spans or /metrics) to see where the time goes"],
                   note="weak: no rule fired", tier=2)
