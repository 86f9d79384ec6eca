"""Rules for admission order and admission by reservation: head-of-line blocking behind long
prompts, and KV admission by worst-case reservation.

Both are queue time that capacity could have served: the requests wait while KV and batch slots
are free. ``head_of_line`` shows it as short requests' TTFT jumping while a long prompt ahead of
them is unfinished (vllm-project/vllm#10235: one partial prefill at a time; sgl-project/sglang#22831:
a head that cannot be allocated stops the admission walk). ``kv_reservation`` shows it as requests
waiting while KV usage stays low and the batch has room (NVIDIA/TensorRT-LLM#1012:
``GUARANTEED_NO_EVICT`` reserves ``max_tokens``, the model's max length when unset; its
``GuaranteedNoEvictScheduler::impl`` reserves what in-progress requests need to complete before it
admits more, ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`` @cf6abc45). Features:
:mod:`rules.features.admission`.

``head_of_line``'s checks, tried in this order: ``head_of_line.server`` (the short requests' lost
TTFT spent in the engine's queue), then ``head_of_line.black_box`` (the client's TTFT alone).
``kv_reservation``'s checks, tried in this order: ``kv_reservation.server`` (the engine's steps
while requests waited, with their KV usage), then ``kv_reservation.client``, which passes when the
engine's KV usage while waiting is unknown (few waits in the engine's steps, or a client capture
that cannot tell a reservation from a running cap). Pure functions of the features, run on the
caller's thread.
"""

from __future__ import annotations

from diag.ground.external import next_checks
from rules import evidence
from rules.base import (ABOVE_P90_CHANCE, Outcome, RuleContext, Triage, beyond_chance, chance_row, check,
                        checked_rule, engine_checks, finding, more_often_p, reason)
from rules.model import Evidence, Finding
from rules.registry import Kind

#: what to check next whatever the engine, after the engines' own lines (:func:`diag.ground.external.next_checks`)
HOL_CHECKS = ["route long prompts to their own replicas or priority class when they are rare and large"]

#: what to check next whatever the engine, after the engines' own lines (:func:`diag.ground.external.next_checks`)
KVR_CHECKS = [
    "set max_tokens on every request: unset, the reservation is the context limit and requests run one after "
    "another while KV usage stays low",
    "the experiment that decides: rerun the same load with a small max_tokens -- concurrency rises under a "
    "reservation, not under a max_num_seqs / max_running cap",
]


checked_rule("head_of_line", "head_of_line",
             "Short requests wait behind an unfinished long prompt ahead of them while capacity exists.",
             kind=Kind.TTFT)


def _behind_long(ctx: RuleContext) -> tuple[Triage, bool, bool] | Outcome:
    """What both paths read first: short requests behind an unfinished long prompt against the
    others (the ratio, or part of them losing their turn beyond chance), the users' own prompt
    spread when the long prompts were ttft diagnose's, and the other streams' steps while they
    waited. Returns the triage so far, whether a long prompt was always unfinished (the baseline is
    the requests' own TTFT less their queue wait) and whether the engine stepped without them;
    else the pass reason, or the candidate of too few requests to tell (:func:`_too_few`)."""
    th = ctx.th
    ratio = ctx.v("hol_short_ttft_ratio")
    nb, nu = ctx.v("hol_blocked_short_n", 0), ctx.v("hol_unblocked_short_n", 0)
    lost, lost_other = ctx.v("hol_blocked_lost_frac"), ctx.v("hol_unblocked_lost_frac")
    chance = max(lost_other or 0.0, ABOVE_P90_CHANCE)
    some_lost = beyond_chance(lost, chance, nb, float(th["lost_chance_p_max"]))
    if ratio < th["ttft_ratio_min"] and not some_lost:
        hits, other_hits = round((lost or 0.0) * nb), round((lost_other or 0.0) * nu)
        p = more_often_p(hits, round(nb), other_hits, round(nu)) if hits else None
        if p is not None and p <= float(th["lost_hint_p_max"]) and _users_narrower(ctx) is None:
            return _too_few(ctx, ratio, (hits, round(nb)), (other_hits, round(nu)), p)
        return reason("short requests behind an unfinished long prompt have {ratio:.1f}x the TTFT of the others "
                      "(< {min:g}x), and {lost:.0%} of them lost it, not beyond the others' {chance:.0%}",
                      ratio=ratio, min=th["ttft_ratio_min"], lost=lost, chance=chance)
    t = Triage(ctx)
    always = bool(ctx.v("hol_baseline_own_wait"))
    if always:  # a long prompt was always unfinished: against their own TTFT without the queue wait
        t.judged(evidence.HOL_TTFT_X_NO_QUEUE, ratio, "ttft_ratio_min", "x",
                  f"median TTFT of {nb:g} short requests that arrived while a longer one ahead of them had no first "
                  f"token, against the same requests' TTFT less their queue wait (only {nu:g} arrived with none "
                  "in flight)", weigh=ratio >= th["ttft_ratio_min"])
    else:
        t.judged(evidence.HOL_TTFT_X, ratio, "ttft_ratio_min", "x",
                  f"median TTFT of {nb:g} short requests that arrived while a longer one ahead of them had no first "
                  f"token, against {nu:g} that arrived with none in flight", weigh=ratio >= th["ttft_ratio_min"])
    # part of them losing it all (the median between two groups) is as plain as the median losing it
    chance_row(t, evidence.HOL_LOST_FRAC, lost, nb, chance, float(th["lost_chance_p_max"]),
               f"took {ctx.th_of('features')['hol_lost_factor']:g}x the others' median TTFT or more: they lost "
               "their turn to the long prompt, beyond the spread of those with none ahead")
    lr = ctx.v("hol_long_prompt_ratio")
    if lr is not None:
        t.context(evidence.HOL_PROMPT_X, lr, "x", "median prompt of the long requests against the short ones")
    spread = _users_narrower(ctx)
    if spread is not None:
        return reason("short prompts wait {ratio:.1f}x behind ttft diagnose's own long ones, but your prompts do not "
                      "mix lengths that far (--workload prompt_tokens: longest {spread:.1f}x the shortest < {min:g}x): "
                      "none of yours waits for another's whole prefill", ratio=ratio, spread=spread,
                      min=th["users_spread_min"])
    others = ctx.v("hol_blocked_others_steps")
    stepped = others is not None and t.crossed(
        evidence.HOL_OTHERS_STEPS, others, "others_steps_min", "steps",
        "the engine kept stepping without them (median over those that lost over half their TTFT): admission "
        "order, not one long step", weigh=False)
    return t, always, stepped


def _users_narrower(ctx: RuleContext) -> float | None:
    """The users' prompt spread (longest / shortest, ``--workload``) when the long prompts were ttft
    diagnose's own and the users' prompts do not mix lengths that far (``users_spread_min``): none
    of theirs waits for another's whole prefill. None otherwise."""
    spread = ctx.v("users_prompt_spread_x")
    narrower = ctx.v("mixed_by_diagnose") and spread is not None and spread < ctx.th["users_spread_min"]
    return spread if narrower else None


def _too_few(ctx: RuleContext, ratio: float, behind: tuple[int, int], alone: tuple[int, int], p: float) -> Finding:
    """Short requests behind a long prompt lost their turn (``behind``: how many of how many) more
    often than those with none ahead (``alone``), at ``p`` (:func:`more_often_p`) within
    ``lost_hint_p_max``, but neither the median nor the chance test names it: too few of them to
    tell (never over ttft diagnose's own long prompts where the users' prompts do not mix lengths). A candidate under the verdict floor (``hint_confidence``) whose first check is the rerun
    with more requests, so the verdict says inconclusive rather than healthy while some waited."""
    th = ctx.th
    t = Triage(ctx)
    t.judged(evidence.HOL_TTFT_X, ratio, "ttft_ratio_min", "x",
             f"median TTFT of {behind[1]} short requests that arrived while a longer one ahead of them had no first "
             "token, against the others")
    t.add(Evidence(evidence.name_of(evidence.HOL_LOST_FRAC), behind[0] / behind[1],
                   f"more often than {alone[0]} of {alone[1]} with none ahead (p <= {th['lost_hint_p_max']:g})",
                   "share", f"{behind[0]} of {behind[1]} took {ctx.th_of('features')['hol_lost_factor']:g}x the "
                   f"others' median TTFT or more (one-sided Fisher exact p = {p:.3f}; too few to name it)",
                   crossed=True, key=evidence.HOL_LOST_FRAC), 0.5)
    more = max(4 * int(ctx.v("requests_n") or 0), 100)
    checks = [f"the experiment that decides: the same design with more requests (`-n {more}`): short requests "
              "behind a long prompt losing their turn beyond chance is head-of-line blocking; as often as the "
              "others, it is the spread of this server"] + engine_checks(ctx, next_checks("head_of_line"), HOL_CHECKS)
    s, pct = ctx.explained(max(0.0, 1.0 - 1.0 / ratio)) if ratio > 0 else (None, None)
    return finding(f"Short requests behind long prompts may lose their turn to them: {behind[0]} of {behind[1]} "
                   "did, too few to tell", float(th["hint_confidence"]), s, pct, t.evidence, checks,
                   black_box=ctx.black_box, population_share=ctx.v("hol_wait_share_all"))


#: the thresholds :func:`_behind_long` reads
_BEHIND_LONG_READS = ("ttft_ratio_min", "lost_chance_p_max", "lost_hint_p_max", "hint_confidence",
                      "features.hol_lost_factor", "users_spread_min", "others_steps_min")


@check("head_of_line.server", needs=("hol_short_ttft_ratio", "hol_blocked_queue_share"),
       before=("head_of_line.black_box",),
       reads=_BEHIND_LONG_READS + ("queue_share_min", "wait_steps_min", "kv_usage_max", "prefill_bound_min"))
def _server(ctx: RuleContext) -> Outcome:
    """The engine's account of the short requests behind long prompts: their lost TTFT spent in the
    queue, through engine steps that ran without them, while KV and batch slots were free."""
    behind = _behind_long(ctx)
    if not isinstance(behind, tuple):
        return behind
    t, always, _ = behind
    ratio = ctx.v("hol_short_ttft_ratio")
    qs = ctx.v("hol_blocked_queue_share")
    if not t.crossed(evidence.HOL_QUEUE_SHARE, qs, "queue_share_min", "share",
                     "their TTFT above the others', spent waiting to be admitted, not in a slow prefill batch",
                     miss="the short requests behind long prompts spent {value:.0%} of the TTFT they lost in the "
                     "queue (< {threshold:.0%}): they ran, slower, in batches beside the long prefill"):
        return t.pass_reason()
    steps = ctx.v("hol_blocked_wait_steps")
    if steps is not None and not t.crossed(evidence.HOL_QUEUED_STEPS, steps, "wait_steps_min", "steps",
                                           "the engine ran steps without them: admission order held them back",
                                           miss="the short requests waited through {value:.0f} engine step(s) (< "
                                           "{threshold:g}): the long prefill step in flight, not admission order"):
        return t.pass_reason()
    kv = ctx.v("hol_blocked_kv_usage_max")
    if kv is not None and not t.below(evidence.HOL_KV_USAGE_MAX, kv, "kv_usage_max", "share",
                                      "KV had room for them", op="<", weigh=False,
                                      miss="KV usage reached {value:.0%} while they queued: KV capacity, see kv_cache"):
        return t.pass_reason()
    bound = ctx.v("kvr_prefill_bound_while_waiting_frac")
    if always and not t.crossed(evidence.PREFILL_BOUND_STEPS, bound,
                                "prefill_bound_min", "share", "the prefill budget went to the requests ahead of them",
                                weigh=False, miss="with a long prompt always unfinished, only {value:.0%} of the "
                                "steps while requests waited had their prefill at its limit (< {threshold:.0%}): "
                                "not the long prompts' chunks, see queue"):
        return t.pass_reason() or ("a long prompt was always unfinished and the engine's prefill budget per step is "
                                   "unknown: a run with some short requests alone, or the engine's configuration, "
                                   "decides")
    run, cap = ctx.v("hol_blocked_running_max"), ctx.v("running_cap")
    if run is not None and cap is not None:
        if not t.below(evidence.HOL_RUNNING_MAX, run, None, "requests",
                       f"under the engine's running cap of {cap:g}: batch slots were free", op="<", threshold=cap,
                       weigh=False, miss="the batch was full ({value:g} of {threshold:g} running): see queue"):
            return t.pass_reason()
    s, pct = ctx.explained(min(qs, 1.0 - 1.0 / ratio))
    return finding("Short requests wait behind long prompts ahead of them while KV and batch slots are free: "
                   "head-of-line blocking in admission", t.confidence(0.8 if always else 0.9), s, pct, t.evidence,
                   engine_checks(ctx, next_checks("head_of_line"), HOL_CHECKS),
                   population_share=ctx.v("hol_wait_share_all"))


@check("head_of_line.black_box", needs=("hol_short_ttft_ratio",),
       reads=_BEHIND_LONG_READS + ("interference.itl_ratio_min",))
def _black_box(ctx: RuleContext) -> Outcome:
    """The client's account: short requests' TTFT against the others', told from a long prefill step
    that stalls every stream by whether the engine kept stepping without them."""
    behind = _behind_long(ctx)
    if not isinstance(behind, tuple):
        return behind
    t, _, stepped = behind
    ratio = ctx.v("hol_short_ttft_ratio")
    inter, lim = ctx.v("itl_interference_ratio"), ctx.th_of("interference")["itl_ratio_min"]
    if inter is not None and inter >= lim and not stepped:
        return reason("short requests behind a long prompt have {ratio:.1f}x the TTFT of the others, but running "
                      "streams stall while long prompts prefill ({inter:.1f}x ITL >= {lim:g}x): they wait for the "
                      "long prefill step itself, not for admission order (see interference; chunked prefill bounds "
                      "both)", ratio=ratio, inter=inter, lim=lim)
    s, pct = ctx.explained(1.0 - 1.0 / ratio)
    return finding("Short requests' TTFT jumps while a long prompt is in flight ahead of them: head-of-line "
                   "blocking behind long prefills (black box)",
                   t.confidence(0.7, black_box=True), s, pct, t.evidence,
                   engine_checks(ctx, next_checks("head_of_line"), HOL_CHECKS), black_box=True,
                   population_share=ctx.v("hol_wait_share_all"),
                   note=("the long prompts were ttft diagnose's own test (its mixed follow-up): what your short "
                         "prompts meet when long ones arrive among them; " if ctx.v("mixed_by_diagnose") else "")
                   + "client-only evidence: a client cannot tell admission order from a long prefill that "
                   "simply fills the step; a server capture (queue spans, engine steps) tells them apart")


checked_rule("kv_reservation", "kv_reservation",
             "Requests wait while KV usage stays low and the batch has room: admission reserves the worst case.",
             kind=Kind.TTFT)


@check("kv_reservation.server", needs=("kvr_kv_usage_while_waiting_p95", "queue_share_tail"),
       before=("kv_reservation.client",),
       reads=("queue_share_min", "waiting_steps_min", "kv_usage_max", "prefill_bound_max", "prefill_steps_max",
              "running_frac_max"))
def _kvr_server(ctx: RuleContext) -> Outcome:
    """The engine's steps while requests waited: the queue share of the slowest 5%, the share of
    steps that ran with a request waiting, KV usage then (p95), the prefill budget left in those
    steps, and the running sequences against the engine's running cap (or, the cap unknown, the
    largest batch seen)."""
    qs = ctx.v("queue_share_tail")
    t = Triage(ctx)
    if not t.crossed(evidence.QUEUE_SHARE_TAIL, qs, "queue_share_min", "share", "requests wait to be admitted",
                     miss="queue share of the slowest 5% is {value:.0%} (< {threshold:.0%})"):
        return t.pass_reason()
    wf = ctx.v("kvr_waiting_steps_frac")
    if not t.crossed(evidence.STEPS_WITH_WAITING, wf, "waiting_steps_min", "share",
                     "share of engine steps that ran while a request waited",
                     miss="a request waited in only {value:.0%} of engine steps (< {threshold:.0%})"):
        return t.pass_reason()
    kv = ctx.v("kvr_kv_usage_while_waiting_p95")
    if not t.below(evidence.KV_USAGE_WAITING_P95, kv, "kv_usage_max", "share",
                   "the blocks really in use stayed low while requests were refused",
                   miss="KV usage reached {value:.0%} while requests waited (> {threshold:.0%}): blocks in use, see "
                   "kv_cache"):
        return t.pass_reason()
    # did they wait for prefill budget (head_of_line) instead? Only if nearly every step's prefill was at its
    # per-step limit; without the engine's budget, any prefill work in most steps says so
    bound = ctx.v("kvr_prefill_bound_while_waiting_frac")
    pre = ctx.v("kvr_prefill_steps_while_waiting_frac")
    if bound is not None:
        ok = t.below(evidence.PREFILL_BOUND_STEPS, bound, "prefill_bound_max",
                     "share", "prefill budget was left in the steps while requests waited", weigh=False,
                     miss="{value:.0%} of the steps while requests waited had their prefill at its per-step limit "
                     "(> {threshold:.0%}): they waited for prefill budget, see head_of_line")
    else:
        ok = pre is None or t.below(evidence.PREFILL_STEPS_WAITING, pre, "prefill_steps_max",
                                    "share", "the engine was not busy prefilling others meanwhile", weigh=False,
                                    miss="{value:.0%} of the steps while requests waited ran prefill work (> "
                                    "{threshold:.0%}): they waited for prefill budget, see head_of_line")
    if not ok:
        return t.pass_reason()
    run, cap = ctx.v("kvr_running_while_waiting_p50"), ctx.v("running_cap")
    if run is not None and cap is not None:
        frac = run / cap
        if not t.below(evidence.RUNNING_OVER_CAP, frac, "running_frac_max", "share",
                       f"median {run:g} running against a cap of {cap:g}: batch slots were free",
                       miss="the batch ran at {value:.0%} of its cap while requests waited: a batch cap, see queue"):
            return t.pass_reason()
        directness, note = 0.9, None
    else:
        most = ctx.v("running_seqs_max")
        if run is not None and most:
            # no known cap: only a batch that ran larger at other times shows the limit is not a fixed cap
            if not t.below(evidence.RUNNING_OVER_MOST, run / most, "running_frac_max",
                           "share", f"median {run:g} running while requests waited, {most:g} at other times",
                           miss="requests waited while {value:.0%} of the largest batch ran and the engine's running "
                           "cap is unknown: a max_num_seqs / max_running cap looks the same (see queue); the "
                           "experiment that decides: rerun with a small max_tokens -- concurrency rises under a "
                           "reservation, not under a cap"):
                return t.pass_reason()
        elif run is not None:
            t.context(evidence.RUNNING_WAITING_P50, run, "requests", "the engine's running cap is unknown")
        directness = 0.6
        note = ("the engine's running cap is unknown here: a max_num_seqs cap at this count would look the same; "
                "rerun with a small max_tokens -- concurrency rises under a reservation, not under a cap")
    s, pct = ctx.explained(qs)
    return finding("Requests wait while KV usage stays low and the batch has room: admission reserves each "
                   "request's worst case (KV reservation)", t.confidence(directness), s, pct, t.evidence,
                   engine_checks(ctx, next_checks("kv_reservation"), KVR_CHECKS),
                   note=note)


@check("kv_reservation.client", needs=("ttft_concurrency_ratio", "decode_speed_hold_ratio"),
       when=lambda ctx: not ctx.has("kvr_kv_usage_while_waiting_p95"))
def _kvr_client(ctx: RuleContext) -> Outcome:
    """Without the engine's KV usage while requests waited: a pass. With the engine's steps, few of
    them ran while a request waited (no admission limit held); from the client alone, a reservation
    looks the same as a running cap."""
    if ctx.has("kvr_waiting_steps_frac"):
        return reason("a request waited in only {frac:.0%} of engine steps: no admission limit held",
                      frac=ctx.v("kvr_waiting_steps_frac"))
    return ("client-only: a reservation limit (each request admitted for its whole max_tokens) looks the same as "
            "a max_num_seqs / max_running cap from the client (see queue, kv_cache); the experiment that decides: "
            "rerun with a small max_tokens -- concurrency rises under a reservation, not under a cap")
