"""The rule ``frontend``: TTFT spent before the engine sees a request (front-end saturation).

Real cases (``/work/shared/reference`` §3, the threads named there): llama.cpp's HTTP thread pool
smaller than its slots stalls a load test at the thread count, invisible in the engine's
``requests_deferred`` (ggml-org/llama.cpp#5827); SGLang's TokenizerManager/detokenizer bound to
one core (sgl-project/sglang#6553, fixed by tokenizer workers); vLLM's API server <-> engine
IPC (vllm-project/vllm#8918, ``--api-server-count``). In each, the engine's own queue is
empty: the time goes before the engine, or connections are shed.

Evidence, most direct first: the bundled server's front-end wait on its request spans; the
client-server gap growing with load (a network delay is the same at every level); client
requests in flight that the engine never counted; Dynamo's front-end time against its TTFT.
Told apart from ``network`` (a gap that does not grow with load) and ``tokenize`` (a cost per
prompt token at concurrency 1: a tokenizer thread busy with slow tokenization is that rule's).
"""

from __future__ import annotations

from diag.ground.external import next_checks
from rules import evidence
from rules.base import Outcome, RuleContext, Triage, check, checked_rule, checks_of, engine_checks, finding, reason
from rules.registry import Kind

#: what to check next whatever the engine, after the engines' own lines (:func:`diag.ground.external.next_checks`)
CHECKS = [
    "the API server's CPU under load (ttft profile PID): tokenizer, chat template, JSON/SSE serialization and "
    "API-server <-> engine IPC on one core (vLLM --disable-frontend-multiprocessing to compare)",
    "connections shed or refused under load (503, resets): listen backlog, HTTP worker pool, proxy limits",
]
SHED_KINDS = ("http_5xx", "server_disconnected", "connect_refused", "connect_error")


def _shed_rows(ctx: RuleContext, t: Triage) -> None:
    kinds: dict[str, int] = ctx.v("errors_by_kind") or {}
    shed = {k: v for k, v in kinds.items() if k in SHED_KINDS}
    if shed:
        t.context(evidence.FRONTEND_SHED, float(sum(shed.values())), "requests",
                  ", ".join(f"{k} x{v}" for k, v in shed.items()) + " (front-end limits under load)")


def _engine_queue_row(ctx: RuleContext, t: Triage) -> None:
    q = ctx.v("queue_share_tail")
    if q is not None:
        t.context(evidence.ENGINE_QUEUE_SHARE_TAIL, q, "share", "the engine's own queue: it did not hold them")


# measured directly, the front end's own wait answers alone; the other paths each add their reason
@check("frontend.spans", needs=("frontend_wait_share_tail",), before=("frontend.gap",),
       reads=("wait_share_min", "tokenize.share_min"))
def _server_side(ctx: RuleContext) -> Outcome:
    th = ctx.th
    share = ctx.v("frontend_wait_share_tail")
    http = ctx.v("frontend_http_wait_frac")
    tok_th = ctx.th_of("tokenize")
    tok_share = ctx.v("tokenize_share_tail")
    if http is not None and http < 0.5 and tok_share is not None and tok_share >= tok_th["share_min"] \
            and share is not None and share >= th["wait_share_min"]:
        return reason("requests waited for the tokenizer thread ({share:.0%} of TTFT) because tokenization itself "
                      "is slow ({tok_share:.0%} of TTFT): see tokenize", share=share, tok_share=tok_share)
    t = Triage(ctx)
    if not t.crossed(evidence.FRONTEND_WAIT_SHARE_TAIL, share, "wait_share_min", "share",
                     "parsed request -> the engine has it: waiting for an HTTP worker or a tokenizer thread",
                     miss="front-end wait {value:.0%} of TTFT (< {threshold:.0%})"):
        return t.pass_reason("no request waited in the front end")
    if http is not None:
        t.context(evidence.FRONTEND_HTTP_PART, http, "share",
                  f"{1 - http:.0%} of it waited for a tokenizer thread")
    med = ctx.v("frontend_wait_share_median")
    if med is not None:
        t.context(evidence.FRONTEND_WAIT_SHARE_P50, med, "share", "")
    _engine_queue_row(ctx, t)
    _shed_rows(ctx, t)
    s, pct = ctx.explained(share)
    where = ("HTTP workers" if (http or 0) >= 0.5 else "tokenizer threads")
    return finding(f"Front end saturated: requests wait for {where} before the engine sees them",
                   t.confidence(0.9), s, pct, t.evidence, engine_checks(ctx, next_checks("frontend"), CHECKS))


@check("frontend.gap", needs=("client_server_gap_concurrency_ratio",), before=("frontend.unseen",), final=False,
       reads=("gap_rise_ratio_min", "gap_rise_itl_min", "network.gap_share_min"))
def _gap_grows(ctx: RuleContext) -> Outcome:
    ratio = ctx.v("client_server_gap_concurrency_ratio")
    rise = ctx.v("client_server_gap_rise_per_itl")
    t = Triage(ctx)
    grows = t.crossed(evidence.GAP_RISE_X, ratio, "gap_rise_ratio_min", "x",
                      f"by in-flight level: {_curve(ctx.v('client_server_gap_by_inflight'))}",
                      miss="the client-server gap grows {value:.2f}x with load (< {threshold:g}x): a fixed latency")
    if not grows:
        return t.pass_reason("the client-server gap does not grow with load")
    if not t.crossed(evidence.GAP_RISE_STEPS, rise, "gap_rise_itl_min", "steps", "in proportion to a decode step",
                     miss="the gap rises by {value:.1f} decode steps (< {threshold:g})"):
        return t.pass_reason()
    gap_share = ctx.v("network_share_tail")
    if not t.crossed(evidence.GAP_SHARE_TAIL, gap_share, None, "share",
                     "time outside the engine's clock", threshold=ctx.th_of("network")["gap_share_min"],
                     miss="the gap is {value:.0%} of TTFT (< {threshold:.0%})"):
        return t.pass_reason()
    _engine_queue_row(ctx, t)
    _shed_rows(ctx, t)
    s, pct = ctx.explained(gap_share)
    return finding("Front end saturated: the time outside the engine's clock grows with load (the network's would not)",
                   t.confidence(0.75), s, pct, t.evidence, engine_checks(ctx, next_checks("frontend"), CHECKS),
                   note="the engine's TTFT starts after its front end: what grows with concurrency there is "
                   "queueing in the API server (workers, tokenizer, IPC), not the network")


@check("frontend.unseen", needs=("engine_unseen_inflight", "engine_unseen_share", "ttft_concurrency_ratio"),
       before=("frontend.dynamo",), final=False,
       reads=("queue.bb_ttft_rise_min", "unseen_inflight_min", "unseen_share_min"))
def _unseen(ctx: RuleContext) -> Outcome:
    qth = ctx.th_of("queue")
    unseen = ctx.v("engine_unseen_inflight")
    rise = ctx.v("ttft_concurrency_ratio")
    t = Triage(ctx)
    if not t.crossed(evidence.FRONTEND_TTFT_RISE_X, rise, None, "x",
                     "TTFT grows with load", threshold=qth["bb_ttft_rise_min"],
                     miss="TTFT grows {value:.2f}x with load (< {threshold:g}x)"):
        return t.pass_reason("TTFT does not grow with load")
    if not t.crossed(evidence.UNSEEN_INFLIGHT, unseen,
                     "unseen_inflight_min", "requests",
                     "the client's requests in flight at each scrape less the engine's running + waiting gauges",
                     miss="the engine counted the client's requests in flight (unseen {value:g})"):
        return t.pass_reason()
    if not t.crossed(evidence.UNSEEN_SHARE, ctx.v("engine_unseen_share"), "unseen_share_min", "share",
                     "most of what the client had in flight was not in the engine",
                     miss="{value:.0%} of the client's requests in flight were unseen (< {threshold:.0%})"):
        return t.pass_reason()
    t.context(evidence.ENGINE_WAITING_MAX, ctx.v("waiting_seqs_max"), "requests", "its own queue stayed empty")
    _shed_rows(ctx, t)
    s, pct = ctx.explained(1.0 - 1.0 / rise if rise else None)
    return finding("Front end saturated: TTFT grows with load while the engine's queue is empty (requests wait "
                   "before the engine)", t.confidence(0.7), s, pct, t.evidence,
                   engine_checks(ctx, next_checks("frontend"), CHECKS),
                   note="from the client and the engine's gauges: where before the engine is not observed")


@check("frontend.dynamo", needs=("metrics_frontend_share",), before=("frontend.client_only",), final=False,
       reads=("wait_share_min",))
def _dynamo(ctx: RuleContext) -> Outcome:
    total = ctx.v("metrics_frontend_share")
    tok = ctx.v("metrics_tokenize_share")
    # the front end's tokenizer time is the tokenize rule's (a cost per prompt); the rest is waiting
    # and routing in the front end (router queue, workers, IPC, streaming back)
    share = max(0.0, total - tok) if total is not None and tok is not None else total
    t = Triage(ctx)
    if tok is not None:
        t.context(evidence.DYNAMO_FRONTEND_SHARE, total, "share",
                  "mean TTFT - mean transit - mean worker first response")
    if not t.crossed(evidence.DYNAMO_FRONTEND_LESS_TOKENIZE_SHARE if tok is not None else
                     evidence.DYNAMO_FRONTEND_SHARE, share, "wait_share_min", "share",
                     "routing, the router queue, waiting for front-end workers, streaming back",
                     miss="front-end time other than tokenization {value:.0%} of TTFT (< {threshold:.0%})"
                     + (f"; its tokenizer holds {tok:.0%}: see tokenize" if tok else "")):
        return t.pass_reason()
    s, pct = ctx.explained(share)
    return finding("Front end saturated: Dynamo's front end holds a large share of TTFT before its workers",
                   t.confidence(0.7), s, pct, t.evidence, engine_checks(ctx, next_checks("frontend"), CHECKS),
                   note="window means of histograms that cover different requests")


def _curve(c: dict[str, float] | None) -> str:
    return ", ".join(f"{k}: {v * 1e3:.0f} ms" for k, v in (c or {}).items()) or "n/a"


checked_rule("frontend", "frontend",
             "Requests wait before the engine sees them (HTTP workers, tokenizer threads, API-server IPC) while the "
             "engine's own queue is empty; connections shed under load", kind=Kind.TTFT)


def _no_path_applies(ctx: RuleContext) -> bool:
    """Whether none of the checks that measure the front end applies (a client alone, nothing else)."""
    return not any(c.applies(ctx) for c in checks_of("frontend") if c.id != "frontend.client_only")


@check("frontend.client_only", needs=("client_only",), when=_no_path_applies)
def _client_only(ctx: RuleContext) -> Outcome:
    """What the client alone cannot tell apart, and the experiment that would."""
    if not ctx.has("ttft_concurrency_ratio"):
        return ("client only at one load level: a fixed latency cannot be split into front end and network; "
                "a concurrency sweep (`ttft probe URL --sweep concurrency`) with the engine's /metrics (--metrics URL) "
                "decides: TTFT that grows with load while the engine's queue stays empty is the front end")
    return ("client only: TTFT growing with load looks the same whether requests wait in the engine's queue or before "
            "it; the engine's /metrics (--metrics URL) or its spans tell them apart")
