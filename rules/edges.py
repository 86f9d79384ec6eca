"""Rules at the edges of a request: start-up, the network, and the load generator itself."""

from __future__ import annotations

from rules.base import Outcome, RuleContext, Triage, finding, rule


@rule("cold_start", "cold_start", needs=(("cold_start_outliers_n",), ("cold_start_s", "ttft_p50_s")), tier=4)
def cold_start(ctx: RuleContext) -> Outcome:
    """First request(s) pay model load / warm-up: start-up cost, reported apart, never TTFT."""
    th = ctx.th
    n_out = ctx.v("cold_start_outliers_n", 0) or 0
    load = ctx.v("cold_start_s", 0.0) or 0.0
    p50 = ctx.v("ttft_p50_s")
    load_ratio = load / p50 if p50 else None
    t = Triage(ctx)
    if t.crossed("first requests far above comparable ones", n_out, "outliers_min", "requests",
                 f"worst {ctx.v('cold_start_outlier_ttft_s', 0):.3g} s, "
                 f"{ctx.v('cold_start_outlier_excess_s', 0):.3g} s above comparable requests; excluded from TTFT statistics",
                 weigh=False):
        t.add_strength(1.0)  # any outlier is the cause itself
    phases = ctx.v("cold_start_by_phase_s") or {}
    t.crossed("cold-start spans / TTFT p50", load_ratio, "load_vs_ttft_min", "x",
              f"{load:.3g} s of start-up (" + ", ".join(f"{k} {v:.3g} s" for k, v in phases.items()) + ")")
    if not t.evidence:
        return f"{n_out:g} cold-start outliers; start-up spans {load:.3g} s"
    title = (f"Cold start: {n_out:g} first request(s) paid model load / warm-up" if n_out
             else f"Cold start: {load:.3g} s of model load / warm-up before serving")
    # Requests that really waited for the start-up, far longer than any steady TTFT: this is
    # what users felt, so it ranks with the TTFT findings (still never counted as TTFT).
    excess = ctx.v("cold_start_outlier_excess_s", 0.0) or 0.0
    p95 = ctx.v("ttft_p95_s")
    dominant = bool(n_out) and p95 and excess >= th["dominant_vs_ttft_p95_min"] * p95
    return finding(title + " (start-up cost, reported apart, not TTFT)",
                   t.confidence(0.9), None, None, t.evidence,
                   ["warm the server up before it takes traffic (a warm-up request, compile ahead of time)",
                    "model load, GPU initialisation and weight reads are start-up / scale-out cost: with weights "
                    "resident in GPU memory, faster SSDs do nothing for TTFT",
                    "keep replicas warm (minimum replicas) when scale-out cold starts reach users"],
                   note="not counted as TTFT: these requests are excluded from the TTFT statistics"
                   + (f"; they waited {excess / p95:.0f}x the steady TTFT p95, so it ranks with the TTFT findings"
                      if dominant else ""), tier=2 if dominant else 4)


NETWORK_CHECKS = [
    "detokenization, transfer back to the serving process and the network send (the article's last "
    "stage): incremental detokenizer, SSE flush per chunk",
    "proxies, load balancers or gateways that buffer streamed responses; TLS and connection reuse",
]


def _network_black_box(ctx: RuleContext) -> Outcome:
    """Client only: a fixed per-request latency that neither prompt length nor load explains.

    The engine's own per-request work for a short prompt costs about one decode step; a TTFT
    intercept many decode steps long that makes up most of TTFT lies outside its compute.
    """
    th = ctx.th
    intercept_s = ctx.v("ttft_prompt_intercept_ms", 0.0) / 1e3
    itl = ctx.v("itl_p50_s")
    p50 = ctx.v("ttft_p50_s")
    if not itl or not p50:
        return "needs ITL and TTFT to judge a fixed latency"
    steps = intercept_s / itl
    share = intercept_s / p50
    if steps < th["bb_intercept_itl_min"] or share < th["bb_intercept_share_min"]:
        return (f"TTFT's fixed part (prompt-fit intercept {intercept_s * 1e3:.1f} ms) is {steps:.1f} decode steps "
                f"and {share:.0%} of TTFT p50: no outside latency stands out")
    t = Triage(ctx)
    t.crossed("fixed part of TTFT / ITL p50", steps, "bb_intercept_itl_min", "steps",
              f"the TTFT-vs-prompt intercept {intercept_s * 1e3:.1f} ms: latency no prompt token explains")
    t.crossed("fixed part of TTFT / TTFT p50", share, "bb_intercept_share_min", "share",
              "most of what users wait for is not prompt processing")
    s, pct = ctx.explained(min(share, 1.0))
    return finding("A fixed latency outside the engine's compute dominates TTFT: network, proxy or front end (black box)",
                   t.confidence(0.7, black_box=True), s, pct, t.evidence, NETWORK_CHECKS + ["join a server capture (OTLP spans) to split network from the "
                                                   "server's front end"],
                   note="client-only evidence: the split between network and the server's front end is not "
                        "observed; confidence lowered", black_box=True)


@rule("network", "network", needs=(("client_server_gap_p50_s", "client_server_ttft_ratio"), ("detokenize_share_tail",),
                                   ("ttft_prompt_intercept_ms", "itl_p50_s")))
def network(ctx: RuleContext) -> Outcome:
    """Client TTFT well above server TTFT, or detokenize / serialization share high; client
    only: a fixed latency many decode steps long that prompt length does not explain."""
    th = ctx.th
    if not ctx.has("client_server_gap_p50_s") and not ctx.has("detokenize_share_tail"):
        return _network_black_box(ctx)
    gap_share = ctx.v("network_share_tail")
    ratio = ctx.v("client_server_ttft_ratio")
    det = ctx.v("detokenize_share_tail")
    t = Triage(ctx)
    t.crossed("client-server gap share of TTFT (slowest 5%)", gap_share, "gap_share_min", "share",
              "network, serialization, HTTP and client parsing between the two TTFT boundaries",
              miss="client-server gap {value:.0%} of TTFT")
    t.crossed("client TTFT p50 / server TTFT p50", ratio, "ttft_ratio_min", "x",
              f"median gap {ctx.v('client_server_gap_p50_s', 0) * 1e3:.1f} ms")
    t.crossed("detokenize share of TTFT (slowest 5%)", det, "detokenize_share_min", "share",
              "first token id -> text, ready for the stream", miss="detokenize {value:.0%} of TTFT")
    if not t.evidence:
        return t.pass_reason("client and server TTFT agree")
    shares = [x for x in (gap_share, det) if x is not None]
    s, pct = ctx.explained(sum(shares) if shares else (1 - 1 / ratio if ratio else None))
    title = ("Network / serialization: the client sees the first token well after the server produced it"
             if gap_share is not None and gap_share >= th["gap_share_min"] or (ratio or 0) >= th["ttft_ratio_min"]
             else "Detokenization / response streaming takes a large share of TTFT")
    return finding(title, t.confidence(0.9), s, pct, t.evidence,
                   [*NETWORK_CHECKS,
                    "the TTFT boundary: client TTFT includes the network, server TTFT ends at the hand-off to the stream"])


@rule("loadgen", "loadgen", needs=(("client_loop_stall_frac",), ("client_loop_lag_p99_s",), ("client_cpu_pct_p95",), ("client_send_lateness_p95_s",),
                                   ("client_saturated_flag",)), tier=0)
def loadgen(ctx: RuleContext) -> Outcome:
    """The load generator was the bottleneck: the measurement is invalid."""
    p50 = ctx.v("ttft_p50_s")
    t = Triage(ctx)
    lag = ctx.v("client_loop_lag_p99_s")
    stall = ctx.v("client_loop_stall_frac")
    if t.crossed("client event loop stalled", stall, "loop_stall_frac_min", "share",
                 "share of the run the probe's event loop ran late: chunks sat unread, TTFT is inflated"):
        if lag is not None and p50:
            t.context("client event-loop lag p99 / TTFT p50", lag / p50, "share",
                      f"lag p99 {lag * 1e3:.1f} ms against the TTFT being measured")
    t.crossed("client CPU p95", ctx.v("client_cpu_pct_p95"), "cpu_pct_min", "%", "the client process is CPU-bound")
    late = ctx.v("client_send_lateness_p95_s")
    t.crossed("sends late against the schedule p95 / TTFT p50", late / p50 if late is not None and p50 else None,
              "send_lateness_vs_ttft_min", "share", "the client cannot keep the arrival schedule")
    if ctx.v("client_saturated_flag") and stall is None and not t.evidence:
        t.context("client health says saturated", "yes", "", "the probe's own health check (meta.json)")
        t.add_strength(1.0)
    if not t.evidence:
        return "the client kept up (event-loop lag, CPU and send schedule within bounds)"
    share = min(lag / ctx.ttft_p95_s, 1.0) if lag is not None and ctx.ttft_p95_s else None
    s, pct = ctx.explained(share)
    return finding("The load generator was the bottleneck: the measurement is invalid, do not blame the server yet",
                   t.confidence(0.9), s, pct, t.evidence,
                   ["run the probe with more worker processes, fewer streams per process, or on another machine",
                    "re-run until client event-loop lag and CPU stay low, then diagnose the server",
                    "the connection pool size against the concurrency"], tier=0)
