"""Rules at the edges of a request: start-up, the network, and the load generator itself.

cold_start's checks, tried in order: ``cold_start.first_requests``, the first requests' TTFT above
comparable later ones with the requests that arrived during start-up and waited for it (one finding
of both); ``cold_start.startup``, without completed requests to compare, the requests that waited
alone. Start-up is reported apart and never counted as TTFT.
network's paths, tried in order: the client-server gap beside the engine's spans, the detokenize
share of TTFT, and, client only, the fixed part of TTFT against prompt length (in decode steps).
Times in seconds; pure functions of the features, run on the caller's thread."""

from __future__ import annotations

from rules import evidence
from rules.base import Outcome, RuleContext, Triage, check, checked_rule, finding, reason, rule
from rules.queueing import served_in_line
from rules.registry import Kind


def startup_note(ctx: RuleContext) -> str | None:
    """The start-up line reported apart, e.g. "start-up 0.41 s: load 0.32 s, warm-up 0.10 s — not TTFT";
    a server the probe waited for first ("not serving for 41.0 s at first contact (connection refused)")."""
    load = ctx.v("cold_start_s", 0.0) or 0.0
    n_out = ctx.v("cold_start_outliers_n", 0) or 0
    excess = ctx.v("cold_start_outlier_excess_s", 0.0) or 0.0
    not_serving = ctx.v("cold_start_not_serving_s", 0.0) or 0.0
    if not load and not n_out and not not_serving:
        return None
    parts = []
    if not_serving:
        seen = ctx.features.get("cold_start_not_serving_s").source
        parts.append(reason("not serving for {s:.1f} s at first contact" + (" ({seen})" if seen else ""),
                            s=not_serving, seen=seen))
    if load:
        phases = ctx.v("cold_start_by_phase_s") or {}
        parts.append(reason("start-up {s:.2f} s", s=load) + (": " + ", ".join(
            reason("{phase} {s:.2f} s", phase=k, s=v) for k, v in phases.items()) if phases else ""))
    if n_out:
        parts.append(reason("first request(s) +{ms:.0f} ms over comparable ones (x{n:g}, left out of TTFT)",
                            ms=excess * 1e3, n=n_out))
    return "; ".join(parts) + " — not TTFT"


checked_rule("cold_start", "cold_start",
             "Start-up (model load, warm-up) reached users materially: requests that arrived during it and "
             "waited, or a first-request penalty large against the steady TTFT and any TTFT SLO.", tier=4,
             kind=Kind.OTHER)


@check("cold_start.first_requests", needs=("cold_start_outliers_n",), before=("cold_start.startup",),
       reads=("waited_min", "outliers_min", "penalty_vs_ttft_p95_min", "penalty_min_s", "dominant_vs_ttft_p95_min"))
def _cold_first_requests(ctx: RuleContext) -> Outcome:
    """The first requests against comparable later ones: a penalty material against the steady TTFT
    p95 (relative and absolute) and any TTFT SLO, with the requests that arrived during start-up
    and waited for it beside it; one finding of both."""
    t = Triage(ctx)
    _waited_rows(ctx, t)
    _penalty_rows(ctx, t)
    return _cold_outcome(ctx, t, compared=True)


@check("cold_start.startup", needs=("cold_start_s", "ttft_p50_s"), reads=("waited_min",))
def _cold_startup(ctx: RuleContext) -> Outcome:
    """Without first requests to compare (no completed request): the requests that arrived during
    start-up and got their first token after it."""
    t = Triage(ctx)
    _waited_rows(ctx, t)
    return _cold_outcome(ctx, t, compared=False)


def _waited_rows(ctx: RuleContext, t: Triage) -> None:
    """Requests that arrived while the model loaded / warmed up and got their first token after it:
    a crossed row at full strength when at least ``waited_min``."""
    load = ctx.v("cold_start_s", 0.0) or 0.0
    if t.crossed(evidence.COLD_WAITED, ctx.v("cold_start_waited_n", 0) or 0, "waited_min", "requests",
                 f"they arrived while the model loaded / warmed up ({load:.3g} s of start-up) and got their first "
                 "token after it", weigh=False):
        t.add_strength(1.0)  # users waited for the start-up itself


def _penalty(ctx: RuleContext) -> tuple[float, float, float, float | None, list[float]]:
    """(first requests far above comparable ones, their excess in s, the worst one's TTFT in s, the
    excess over the steady TTFT p95 or None, the TTFT SLO targets in s)."""
    n_out = ctx.v("cold_start_outliers_n", 0) or 0
    excess = ctx.v("cold_start_outlier_excess_s", 0.0) or 0.0
    worst = ctx.v("cold_start_outlier_ttft_s", 0.0) or 0.0
    p95 = ctx.v("ttft_p95_s")
    penalty = excess / p95 if (n_out and p95) else None
    return n_out, excess, worst, penalty, [v for k, v in ctx.slo.items() if k.startswith("ttft")]


def _penalty_rows(ctx: RuleContext, t: Triage) -> None:
    """The first-request penalty's rows when it is material: at least ``penalty_vs_ttft_p95_min`` x the
    steady TTFT p95, at least ``penalty_min_s``, and past the TTFT SLO when one is given."""
    th = ctx.th
    n_out, excess, worst, penalty, slo_targets = _penalty(ctx)
    breaks_slo = None if not slo_targets else worst > min(slo_targets)
    material_penalty = (penalty is not None and penalty >= th["penalty_vs_ttft_p95_min"]
                        and excess >= th["penalty_min_s"] and breaks_slo is not False)
    if material_penalty:
        t.crossed(evidence.COLD_OUTLIERS, n_out, "outliers_min", "requests",
                  f"worst {worst:.3g} s, {excess:.3g} s above comparable requests; excluded from TTFT statistics",
                  weigh=False)
        t.crossed(evidence.COLD_PENALTY_X, penalty, "penalty_vs_ttft_p95_min", "x",
                  "the start-up cost a first user paid against what every later one waits")
        t.crossed(evidence.COLD_PENALTY, excess, "penalty_min_s", "s", "an absolute floor: a few ms more is noise")
        contact = ctx.v("cold_start_first_contact_s")
        if contact is not None and contact >= worst:
            t.context(evidence.COLD_FIRST_CONTACT, contact, "s",
                      "API detection / compatibility check, before the run: the server was still starting")
        if breaks_slo:
            t.context(evidence.COLD_FIRST_VS_SLO, worst, "s", f"breaks the TTFT SLO ({min(slo_targets):.3g} s)")


def _cold_outcome(ctx: RuleContext, t: Triage, compared: bool) -> Outcome:
    """The finding from the rows so far (start-up cost, reported apart, never TTFT; ranked with the
    TTFT findings when the first requests waited ``dominant_vs_ttft_p95_min`` x the steady TTFT p95),
    or, without rows, the start-up note with the penalty against what a material one needs.
    ``compared``: the first requests were compared with later ones (else none are counted)."""
    th = ctx.th
    n_out, excess, _, penalty, slo_targets = _penalty(ctx) if compared else (0, 0.0, 0.0, None, [])
    if not t.evidence:
        why = startup_note(ctx) or "no start-up seen"
        if n_out and penalty is not None:
            why += reason(" (penalty {ms:.0f} ms = {x:.1f}x TTFT p95; material needs >= {x_min:g}x and >= "
                          "{ms_min:.0f} ms" + (", and past the TTFT SLO" if slo_targets else "") + ")",
                          ms=excess * 1e3, x=penalty, x_min=th["penalty_vs_ttft_p95_min"],
                          ms_min=th["penalty_min_s"] * 1e3)
        return why
    load = ctx.v("cold_start_s", 0.0) or 0.0
    waited = ctx.v("cold_start_waited_n", 0) or 0
    p95 = ctx.v("ttft_p95_s")
    if load:
        phases = ctx.v("cold_start_by_phase_s") or {}
        t.context(evidence.STARTUP_SPANS, load, "s", ", ".join(f"{k} {v:.3g} s" for k, v in phases.items()) or "cold_start spans")
    title = (f"Cold start: {waited:g} request(s) arrived during start-up and waited for it" if waited
             else f"Cold start: {n_out:g} first request(s) paid model load / warm-up")
    # Requests that really waited for the start-up, far longer than any steady TTFT: this is
    # what users felt, so it ranks with the TTFT findings (still never counted as TTFT).
    dominant = bool(n_out) and p95 and excess >= th["dominant_vs_ttft_p95_min"] * p95
    # its sample is every request, the first ones too (the steady ones alone leave them out)
    n_all = (ctx.v("requests_n", 0) or 0) + n_out
    return finding(title + " (start-up cost, reported apart, not TTFT)",
                   t.confidence(0.9, n_requests=n_all), None, None, t.evidence,
                   ["warm the server up before it takes traffic (a warm-up request, compile ahead of time)",
                    "model load, GPU initialisation and weight reads are start-up / scale-out cost: with weights "
                    "resident in GPU memory, faster SSDs do nothing for TTFT",
                    "keep replicas warm (minimum replicas) when scale-out cold starts reach users"],
                   note="not counted as TTFT: these requests are excluded from the TTFT statistics"
                   + (f"; they waited {excess / p95:.0f}x the steady TTFT p95, so it ranks with the TTFT findings"
                      if dominant else ""), tier=2 if dominant else 4)


#: error kind -> what it points to
FAILURE_CAUSES: dict[str, str] = {
    "server_disconnected": "front-end limits: the server closed connections before answering (HTTP worker or "
                           "connection pool full, listen backlog, keep-alive limits)",
    "connect_refused": "front-end limits or a server down: connections refused",
    "connect_error": "front-end limits or the network: connections could not be made or were reset",
    "timeout": "timeouts: the server held requests past --timeout (a queue longer than the client waits)",
    "http_5xx": "overload shedding or server errors (503 queue full, 500)",
    "http_4xx": "requests refused (429 rate limit, 413/400 context too long, 422 unsupported fields)",
    "closed_mid_stream": "streams cut off: the server or a proxy dropped running streams (timeouts, restarts, OOM)",
}


@rule("failures", "failures", needs=(("error_rate", "errors_by_kind"),), tier=2, kind=Kind.OTHER)
def failures(ctx: RuleContext) -> Outcome:
    """A material share of requests failed, was refused or cut off: say what, when and what it
    points to. Prompts a designed experiment chose past the server's context and had refused
    (feature ``context_limit_refused_n``) are the experiment's limit: said apart, never failures."""
    th = ctx.th
    rate = ctx.v("error_rate")
    kinds: dict[str, int] = ctx.v("errors_by_kind") or {}
    limit_n = ctx.v("context_limit_refused_n")
    apart = (f"{limit_n:.0f} request(s) the probe sent past the server's context "
             f"({ctx.v('context_limit_tokens') or 0:.0f} tokens) were refused: the experiment's limit, not failures"
             if limit_n else "")
    t = Triage(ctx)
    if not t.crossed(evidence.FAILED_SHARE, rate, "share_min", "share",
                     ", ".join(f"{k} x{v}" for k, v in kinds.items()) or "failed requests",
                     miss="{value:.0%} of requests failed (< {threshold:.0%})"):
        return "; ".join(x for x in (t.pass_reason("no request failed"), apart) if x)
    by_seg = ctx.v("error_rate_by_segment") or {}
    if by_seg and (len(by_seg) > 1 or "(none)" not in by_seg):
        t.context(evidence.FAILED_SHARE_BY_LEVEL, max(by_seg.values()), "share",
                  "; ".join(f"{k}: {v:.0%}" for k, v in sorted(by_seg.items(), key=lambda kv: -kv[1])[:6]))
    inflight = ctx.v("failed_inflight_p50")
    if inflight is not None:
        t.context(evidence.FAILED_INFLIGHT_P50, inflight, "requests",
                  f"against {ctx.v('inflight_at_arrival_p50', 0) or 0:g} for the completed ones")
    points = [FAILURE_CAUSES.get(k, f"{k}: see the probe's error kinds") for k in kinds]
    top = max(kinds.items(), key=lambda kv: kv[1])[0] if kinds else "unknown"
    worst = max(by_seg.items(), key=lambda kv: kv[1])[0] if by_seg else ""
    where = f" under {worst}" if worst and worst != "(none)" else ""
    return finding(f"{rate:.0%} of requests failed ({', '.join(f'{k} x{v}' for k, v in kinds.items())}){where}: "
                   "the run is not healthy", t.confidence(0.9, n_requests=ctx.v("requests_total_n")), None, None,
                   t.evidence,
                   [*points, "the failed requests are left out of TTFT: the TTFT of the others is not the users' "
                    "whole experience; lower the load or raise the limit, then measure again"],
                   note=f"mostly {top}; failures are not counted as TTFT" + (f"; {apart}" if apart else ""))


NETWORK_CHECKS = [
    "detokenization, transfer back to the serving process and the network send (the article's last "
    "stage): incremental detokenizer, SSE flush per chunk",
    "proxies, load balancers or gateways that buffer streamed responses; TLS and connection reuse",
]


checked_rule("network", "network",
             "Client TTFT well above server TTFT, or detokenize / serialization share high; client only: a fixed "
             "latency many decode steps long that prompt length does not explain", kind=Kind.TTFT)

#: the thresholds the spans' paths read (:func:`_network_spans`)
SPANS_READS = ("gap_itl_min", "gap_share_min", "ttft_ratio_min", "detokenize_share_min")


@check("network.gap", needs=("client_server_gap_p50_s", "client_server_ttft_ratio"), before=("network.detokenize",),
       reads=SPANS_READS)
def _network_spans(ctx: RuleContext) -> Outcome:
    """The engine's spans beside the client's: the client-server gap (a share of TTFT, or client TTFT
    over server TTFT) in proportion to a decode step, or the detokenize share of TTFT."""
    th = ctx.th
    gap_share = ctx.v("network_share_tail")
    ratio = ctx.v("client_server_ttft_ratio")
    det = ctx.v("detokenize_share_tail")
    gap_p50, itl = ctx.v("client_server_gap_p50_s"), ctx.v("itl_p50_s")
    if gap_p50 is not None and itl and gap_p50 / itl < th["gap_itl_min"]:
        # in proportion: a gap shorter than a decode step or two is the hand-off to the stream, not a cause
        gap_share = ratio = None
    t = Triage(ctx)
    t.crossed(evidence.GAP_SHARE_TAIL, gap_share, "gap_share_min", "share",
              "network, serialization, HTTP and client parsing between the two TTFT boundaries",
              miss="client-server gap {value:.0%} of TTFT")
    t.crossed(evidence.CLIENT_SERVER_TTFT_X, ratio, "ttft_ratio_min", "x",
              f"median gap {ctx.v('client_server_gap_p50_s', 0) * 1e3:.1f} ms")
    t.crossed(evidence.DETOKENIZE_SHARE_TAIL, det, "detokenize_share_min", "share",
              "first token id -> text, ready for the stream", miss="detokenize {value:.0%} of TTFT")
    if not t.evidence:
        if gap_share is None and ratio is None and gap_p50 is not None and itl:
            return reason("the client-server gap p50 {ms:.1f} ms is {steps:.1f} decode steps (< {min:g}): the "
                          "hand-off to the stream, not a network problem", ms=gap_p50 * 1e3, steps=gap_p50 / itl,
                          min=th["gap_itl_min"])
        return t.pass_reason("client and server TTFT agree")
    shares = [x for x in (gap_share, det) if x is not None]
    s, pct = ctx.explained(sum(shares) if shares else (1 - 1 / ratio if ratio else None))
    by_gap = gap_share is not None and gap_share >= th["gap_share_min"] or (ratio or 0) >= th["ttft_ratio_min"]
    frontend = (ctx.v("client_server_gap_frontend_frac") or 0.0) >= 0.5
    if by_gap and frontend:
        # the engine's TTFT starts after its own API server tokenized the prompt (vLLM): the gap
        # holds that front-end work as well as the network, and the spans cannot split them
        t.context(evidence.GAP_HOLDS_FRONTEND, ctx.v("client_server_gap_frontend_frac"),
                  "share", "the gap also holds the API server's chat template, tokenization and first detokenize")
        return finding("Between the client and the engine's clock: the network, or the API server's chat template "
                       "and tokenization before the engine's TTFT starts", t.confidence(0.6), s, pct, t.evidence,
                       ["a prompt sweep (`ttft probe URL --sweep prompt`): a gap growing with prompt length is "
                        "tokenization in the API server, a fixed gap is the network or proxy",
                        "the API server's CPU (tokenizer, chat template) and its process count (vLLM "
                        "--api-server-count)", *NETWORK_CHECKS[:2]],
                       note="the engine's TTFT starts after its front end (vLLM arrival_time is set after the chat "
                       "template and tokenization): client - server TTFT is front end + network, not network alone")
    title = ("Network / serialization: the client sees the first token well after the server produced it"
             if by_gap else "Detokenization / response streaming takes a large share of TTFT")
    return finding(title, t.confidence(0.9), s, pct, t.evidence,
                   [*NETWORK_CHECKS,
                    "the TTFT boundary: client TTFT includes the network, server TTFT ends at the hand-off to the stream"],
                   population_share=ctx.stage_population(("network",) if by_gap else ("detokenize",)))


# a detokenize share alone: the same spans judge it
check("network.detokenize", needs=("detokenize_share_tail",), before=("network.black_box",),
      reads=SPANS_READS)(_network_spans)


@check("network.black_box", needs=("ttft_prompt_intercept_ms", "itl_p50_s"),
       reads=SPANS_READS + ("bb_intercept_se_k", "bb_fit_alone_min", "bb_intercept_itl_min", "bb_intercept_share_min",
                            "prefill_compute.r2_contradicts_max", "prefill_compute.explained_frac_min",
                            "queue.bb_inline_ratio_min", "queue.bb_inline_ratio_max", "queue.bb_decode_alone_min",
                            "queue.bb_after_end_p_max", "queue.bb_after_end_min", "head_of_line.ttft_ratio_min"))
def _network_black_box(ctx: RuleContext) -> Outcome:
    """Client only: a fixed per-request latency that neither prompt length nor load explains.

    The engine's own per-request work for a short prompt costs about one decode step; a TTFT
    intercept many decode steps long that makes up most of TTFT lies outside its compute. A
    client-server gap known without its TTFT ratio is the spans' to judge (:func:`_network_spans`).
    """
    if ctx.has("client_server_gap_p50_s"):
        return _network_spans(ctx)
    th = ctx.th
    intercept_s = ctx.v("ttft_prompt_intercept_ms", 0.0) / 1e3
    # in decode steps of the requests the fit is made of (lone ones): a ramp's batched steps are longer
    itl = ctx.v("ttft_prompt_fit_itl_p50_s") or ctx.v("itl_p50_s")
    # the fixed part is judged against the TTFT of the requests it was fitted on: a capture that
    # also holds a load ramp (ttft diagnose) has TTFTs that waiting inflated, not the fit's; and
    # when the users' prompt lengths are known, against the fit's TTFT at their typical prompt (the
    # ladder's rungs are the design's lengths: a long rung's prompt work is not the users' share)
    p50 = ctx.v("ttft_prompt_fit_ttft_p50_s") or ctx.v("ttft_p50_s")
    users_mid, slope = ctx.v("users_prompt_mid_tokens"), ctx.v("ttft_prompt_slope_ms_per_token")
    at_users = users_mid is not None and slope is not None and slope > 0 and intercept_s > 0
    if at_users:
        p50 = intercept_s + slope / 1e3 * users_mid
    if not itl or not p50:
        return "needs ITL and TTFT to judge a fixed latency"
    r2 = ctx.v("ttft_prompt_r2")
    pth = ctx.th_of("prefill_compute")
    mean_s = ctx.v("ttft_mean_s")
    if r2 is not None and slope is not None and mean_s and r2 < float(pth["r2_contradicts_max"]) \
            and abs(mean_s - intercept_s) < float(pth["explained_frac_min"]) * mean_s:
        # prompts vary and TTFT ignores them: the slope, of either sign, moves TTFT by less than
        # half over these prompts (|mean - intercept| = |slope| x mean prompt): all of TTFT is the
        # fixed part, up to the median itself
        intercept_s = min(intercept_s, p50)
        slope = max(slope, 0.0)
    steps = intercept_s / itl
    share = intercept_s / p50
    # the fixed part is an extrapolation to zero tokens: as far below it as the fit's scatter
    # allows (k standard errors) it must still be many decode steps long, or the points do not
    # show that there is one (how much of TTFT it is stays the point estimate's)
    se_s = (ctx.v("ttft_prompt_intercept_se_ms") or 0.0) / 1e3
    low_s = intercept_s - float(th["bb_intercept_se_k"]) * se_s
    if (slope is not None and slope < 0) or share > 1.05:
        # TTFT falling with the prompt, or an intercept above TTFT itself: the fit over this prompt
        # range is noise, and its intercept is an extrapolation, not a latency
        return reason("the TTFT-vs-prompt fit has no meaningful fixed part (intercept {ms:.1f} ms = {share:.0%} of "
                      "TTFT p50, slope {slope:.3g} ms/token)", ms=intercept_s * 1e3, share=share, slope=slope)
    qth = ctx.th_of("queue")
    inline = ctx.v("ttft_inline_ratio")
    line_explains = inline is not None and qth["bb_inline_ratio_min"] <= inline <= qth["bb_inline_ratio_max"]
    # fitted on lone requests (nearly all alone in flight at arrival): no line was ahead of them
    alone = (ctx.v("ttft_prompt_fit_alone_frac") or 0.0) >= float(th["bb_fit_alone_min"])
    if not alone and any(served_in_line(ctx)) and line_explains and (ctx.v("inflight_at_arrival_p50") or 1) > 1:
        # waiting in line is also a fixed part no prompt token explains: it is the queue's (see queue)
        return reason("TTFT's fixed part ({ms:.1f} ms) is waiting in line: requests are served one after another "
                      "(see queue)", ms=intercept_s * 1e3)
    hol, hol_min = ctx.v("hol_short_ttft_ratio"), ctx.th_of("head_of_line")["ttft_ratio_min"]
    if not alone and hol is not None and hol >= hol_min:
        # short prompts that waited behind a long one's prefill pull the fit's intercept up: their
        # TTFT is waiting, at zero tokens as at eight, not a latency outside the server
        return reason("TTFT's fixed part ({ms:.1f} ms) is short prompts waiting behind long ones ahead of them "
                      "({hol:.1f}x the TTFT of short requests with none ahead, >= {min:g}x): see head_of_line",
                      ms=intercept_s * 1e3, hol=hol, min=hol_min)
    blocked, unblocked = ctx.v("hol_blocked_short_n"), ctx.v("hol_unblocked_short_n")
    if not alone and blocked is not None and blocked >= float(ctx.general.get("min_requests", 20)) / 4 \
            and blocked > 3 * (unblocked or 0):
        # nearly every short prompt arrived behind an unfinished long one: with no short request left to
        # compare, their waiting behind the long prefills is as good a fixed part as any latency
        return reason("TTFT's fixed part ({ms:.1f} ms) may be short prompts waiting behind long ones: {blocked:g} "
                      "of {short:g} short requests arrived behind an unfinished long prompt, too few with none ahead "
                      "to compare (a run without the long prompts, or at concurrency 1, decides)",
                      ms=intercept_s * 1e3, blocked=blocked, short=blocked + (unblocked or 0))
    if steps < th["bb_intercept_itl_min"] or share < th["bb_intercept_share_min"]:
        return reason("TTFT's fixed part (prompt-fit intercept {ms:.1f} ms) is {steps:.1f} decode steps and "
                      "{share:.0%} of TTFT p50: no outside latency stands out", ms=intercept_s * 1e3, steps=steps,
                      share=share)
    if low_s / itl < th["bb_intercept_itl_min"]:
        n = ctx.v("ttft_prompt_fit_n")
        return reason("TTFT's fixed part is not resolved: the prompt fit's intercept {ms:.1f} ms could be as low as "
                      "{low_ms:.1f} ms ({k:g} standard errors of {se_ms:.1f} ms), {low_steps:.1f} decode steps (< "
                      "{min:g}; over {n:g} requests, prompts too close together or TTFT too scattered to pin it): a "
                      "prompt sweep from short prompts with a few requests per length (`ttft probe URL --sweep "
                      "prompt`) decides", ms=intercept_s * 1e3, low_ms=low_s * 1e3, k=th["bb_intercept_se_k"],
                      se_ms=se_s * 1e3, low_steps=max(low_s, 0.0) / itl, min=th["bb_intercept_itl_min"], n=n)
    t = Triage(ctx)
    t.crossed(evidence.INTERCEPT_STEPS, steps, "bb_intercept_itl_min", "steps",
              f"the TTFT-vs-prompt intercept {intercept_s * 1e3:.1f} ms: latency no prompt token explains")
    t.crossed(evidence.INTERCEPT_SHARE, share, "bb_intercept_share_min", "share",
              "most of what users wait for is not prompt processing"
              + (f" (the fit's TTFT at your users' {users_mid:g}-token prompts)" if at_users
                 else " (TTFT of the lone requests the fit is over)" if alone else ""))
    t.context(evidence.INTERCEPT_LOW, low_s, "s",
              f"the intercept less {th['bb_intercept_se_k']:g} of its standard errors: what the fit's points show at least")
    s, pct = ctx.explained(min(share, 1.0))
    if alone and ctx.ttft_p95_s:  # a fixed latency is that many seconds of every request's TTFT, no more
        s, pct = intercept_s, min(100.0, 100.0 * intercept_s / ctx.ttft_p95_s)
    # directness: a fixed part fitted on requests alone in flight is a latency no line and no prompt explains,
    # measured as directly as a client can; the place (network, proxy, front end) stays the checks' to tell.
    # Fitted over requests that met others in flight, waiting in some line may still hide in it
    return finding("A fixed latency outside the engine's compute dominates TTFT: network, proxy or front end (black box)",
                   t.confidence(0.8 if alone else 0.7, black_box=True), s, pct, t.evidence,
                   NETWORK_CHECKS + ["join a server capture (OTLP spans) to split network from the server's front end"],
                   note="client-only evidence: the split between network and the server's front end is not "
                        "observed; confidence lowered", black_box=True)


@rule("loadgen", "loadgen", needs=(("client_first_token_lag_share",), ("client_loop_stall_frac",),
                                   ("client_loop_lag_p99_s",), ("client_cpu_pct_p95",), ("client_send_lateness_p95_s",),
                                   ("client_saturated_flag",)), tier=0, kind=Kind.OTHER)
def loadgen(ctx: RuleContext) -> Outcome:
    """The load generator was the limit of the measurement: its timing is invalid.

    With per-request client timing, the lag counts only where it could inflate TTFT: the stalls
    under way at the measured requests' sends and first tokens must add
    ``first_token_lag_share_min`` of their TTFT (stalls while requests wait on the server, or
    between requests, delay nothing). The finding says whose doing they were: the client's own
    (its loop busy, its threads on the CPU or holding the GIL) or the machine's (the loop given
    no CPU while every CPU was busy, e.g. with the server beside the probe); then the stall share,
    the lag and the client's CPU are its context and strength. Without per-request timing (an old
    capture), the run's stall share and CPU as the probe recorded them. Sends late against an
    open-loop schedule stand on their own: the offered load was not what was asked."""
    p50 = ctx.v("ttft_p50_s")
    t = Triage(ctx)
    lag = ctx.v("client_loop_lag_p99_s")
    stall = ctx.v("client_loop_stall_frac")
    total = ctx.v("client_first_token_lag_share")
    own = ctx.v("client_first_token_own_lag_share")
    starved = ctx.v("client_first_token_starved_share")
    machine = False
    # the client's CPU weighs with a lag that crossed its bound, or alone where no lag was measured
    cpu_weighs = False
    if total is not None:
        if t.crossed(evidence.CLIENT_FIRST_TOKEN_LAG, total, "first_token_lag_share_min", "share",
                     "TTFT the client's event-loop stalls could have added at the requests' sends and first tokens "
                     "(an upper bound): chunks sat unread, TTFT is inflated",
                     miss="the client's stalls at the requests' sends and first tokens could add {value:.0%} of "
                          "their TTFT (< {threshold:.0%})"):
            machine = starved is not None and starved > (own or 0.0)
            if starved is not None:
                t.context(evidence.CLIENT_OWN_PART, own, "share",
                          "its loop busy, its other threads on the CPU or holding the GIL")
                t.context(evidence.CLIENT_MACHINE_PART, starved, "share",
                          "the loop runnable but given no CPU while every CPU was busy (the server on this machine, "
                          "other work): not the client's own work")
            t.crossed(evidence.CLIENT_LOOP_STALLED_WAITING, stall, "loop_stall_frac_min", "share",
                      "share of the time requests waited for their first token that the probe's event loop ran late")
            if lag is not None and p50:
                t.context(evidence.CLIENT_LAG_OVER_TTFT, lag / p50, "share",
                          f"lag p99 {lag * 1e3:.1f} ms while requests waited, against the TTFT being measured")
            cpu_weighs = True
    elif t.crossed(evidence.CLIENT_LOOP_STALLED, stall, "loop_stall_frac_min", "share",
                   "share of the run the probe's event loop ran late: chunks sat unread, TTFT is inflated"):
        if lag is not None and p50:
            t.context(evidence.CLIENT_LAG_OVER_TTFT, lag / p50, "share",
                      f"lag p99 {lag * 1e3:.1f} ms against the TTFT being measured")
        cpu_weighs = True
    else:
        cpu_weighs = stall is None
    gap, local = ctx.v("client_server_gap_p50_s"), ctx.v("client_server_local")
    read_late = None  # the share of TTFT the probe read late, when the engine's spans measure it
    if (total is not None and not t.evidence and local and gap and p50 and stall is not None and lag is not None
            and (ctx.v("client_server_gap_frontend_frac") or 0.0) < 0.5 and stall >= ctx.th["loop_stall_frac_min"]
            and lag >= ctx.th["gap_lag_min"] * gap):
        # the engine's spans say when the first token left it, and on this machine's loopback the network
        # adds microseconds: a gap that the loop's own lag covers is the probe reading late (its lag
        # samples under-count a loop that stalls between them, so the share above can miss it)
        if t.crossed(evidence.GAP_SHARE_LOCAL, gap / p50, "first_token_lag_share_min",
                     "share", "the first token left the engine this long before the client read it, over a loopback "
                     "connection"):
            read_late = min(gap / p50, 1.0)
            t.crossed(evidence.CLIENT_LOOP_STALLED_WAITING, stall, "loop_stall_frac_min", "share",
                      "share of the time requests waited for their first token that the probe's event loop ran late")
            t.context(evidence.CLIENT_LAG_OVER_GAP, lag / gap, "x",
                      f"lag p99 {lag * 1e3:.1f} ms against a gap of {gap * 1e3:.1f} ms: the loop's stalls cover it")
            cpu_weighs = True
    if cpu_weighs:
        t.crossed(evidence.CLIENT_CPU_P95, ctx.v("client_cpu_pct_p95"), "cpu_pct_min", "%", "the client process is CPU-bound")
    late = ctx.v("client_send_lateness_p95_s")
    t.crossed(evidence.SEND_LATENESS_SHARE, late / p50 if late is not None and p50 else None,
              "send_lateness_vs_ttft_min", "share", "the client cannot keep the arrival schedule")
    if ctx.v("client_saturated_flag") and stall is None and total is None and not t.evidence:
        t.context(evidence.CLIENT_SATURATED, "yes", "", "the probe's own health check (meta.json)")
        t.add_strength(1.0)
    if not t.evidence:
        return t.pass_reason(_kept_up(ctx, lag is not None or stall is not None or total is not None, late))
    s, pct = ctx.explained(read_late if read_late is not None else total if total is not None else (
        min(lag / ctx.ttft_p95_s, 1.0) if lag is not None and ctx.ttft_p95_s else None))
    if machine:
        return finding("The machine starved the load generator: every CPU was busy (the server on this machine?), the "
                       "probe's loop got no CPU when first tokens arrived; client timing is invalid, not the client's "
                       "own work", t.confidence(0.9), s, pct, t.evidence,
                       ["probe from another machine, or give the probe a CPU of its own: pin the server off it "
                        "(taskset, the engine's thread count or CPU binding) and the probe onto it (`ttft probe --cpus`)",
                        "the server's CPU use at idle and under load: an engine that spins (busy-polls) on every core "
                        "starves whatever shares the machine",
                        "findings from the server's own numbers (its /metrics, its spans, the streams decoding at once) "
                        "do not depend on client timing"], tier=0,
                       note="lag the machine caused: the loop's run-queue wait while the client's own threads were "
                            "idle (the probe's health monitor)")
    return finding("The load generator was the bottleneck: the measurement is invalid, do not blame the server yet",
                   t.confidence(0.9), s, pct, t.evidence,
                   ["run the probe with more worker processes, fewer streams per process, or on another machine",
                    "re-run until client event-loop lag and CPU stay low, then diagnose the server",
                    "the connection pool size against the concurrency"], tier=0)


def _kept_up(ctx: RuleContext, loop_measured: bool, late: float | None) -> str:
    """The loadgen rule's pass reason, naming only what was measured: a capture without the probe's
    health (its series and meta.json; e.g. client spans read back from a trace store) has the send
    schedule at most, and must not read as a client whose loop and CPU were checked."""
    checked = [name for name, seen in (("event-loop lag", loop_measured),
                                       ("CPU", ctx.v("client_cpu_pct_p95") is not None),
                                       ("send schedule", late is not None)) if seen]
    missing = [name for name in ("event-loop lag", "CPU") if name not in checked]
    if not missing:
        return reason("the client kept up ({checked} within bounds)", checked=", ".join(checked))
    head = (reason("{checked} within bounds", checked=", ".join(checked)) if checked
            else "nothing the client measured crossed a bound")
    return reason("{head}; the client's {missing} are not in this capture (the probe records them in its own "
                  "capture's series and meta.json: analyze that to check the client)", head=head,
                  missing=" and ".join(missing))
