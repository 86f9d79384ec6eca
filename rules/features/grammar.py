"""Theme: structured-output grammar compilation. A request constrained to a JSON schema waits,
before it can be scheduled, while the server compiles the schema into a grammar; a server that
caches grammars by schema makes only each schema's first use wait.

* client (designed probe, ``ttft probe --response-format schema[:R]``, or ttft diagnose's grammar
  follow-up): each request's role on
  its client span (``ttft.client.schema_role``: ``first``, ``repeat`` or ``concurrent``, see
  :mod:`collectors.probe.schemas`). ``schema_first_ttft_p50_s`` / ``schema_repeat_ttft_p50_s``
  (s) and their ratio ``schema_first_ttft_x`` (x); ``schema_wait_share_of_ttft`` (share): the
  first and concurrent uses' TTFT beyond the repeats' median, summed, over all the schema
  requests' TTFT (what a cached grammar would have spared); ``schema_first_above_repeat_frac``
  (share): first uses slower than the repeats' 90th percentile (chance: 10%); ``schema_first_n``,
  ``schema_repeat_n``, ``schema_concurrent_n`` (requests).
* server (the bundled engine's request spans, ``ttft.grammar.*``): ``grammar_requests_n``
  (requests), ``grammar_miss_frac`` (share of them whose grammar was not cached),
  ``grammar_wait_p50_s`` (s, over the requests that waited), ``grammar_wait_share_of_ttft`` and
  ``grammar_wait_share_of_ttft_tail`` (share: grammar wait over TTFT, summed over all schema
  requests and over the slowest ``tail_quantile`` of them).

Runs on the feature computation's thread, on the shared :class:`~rules.features.context.FeatureContext`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rules.features.context import FeatureContext
from rules.features.numeric import num_col

CLIENT_NAMES = ("schema_first_ttft_p50_s", "schema_repeat_ttft_p50_s", "schema_first_ttft_x", "schema_wait_share_of_ttft",
                "schema_first_above_repeat_frac")
SERVER_NAMES = ("grammar_miss_frac", "grammar_wait_p50_s", "grammar_wait_share_of_ttft", "grammar_wait_share_of_ttft_tail")
NO_DESIGN = ("no request is marked with a schema role: only a designed probe (ttft probe --response-format "
             "schema:R) tells a schema's first use from its repeats")
SERVER_SOURCE = "request spans (ttft.grammar.*)"


def grammar(ctx: FeatureContext) -> None:
    """``schema_*`` from the designed probe's roles, ``grammar_*`` from the engine's request spans."""
    st = pd.concat([d for d in (ctx.steady, ctx.grammar_design) if d is not None and len(d)], ignore_index=True) \
        if len(ctx.grammar_design) else (ctx.steady if ctx.steady is not None else pd.DataFrame())
    _client(ctx, st)
    _server(ctx, st)


def _client(ctx: FeatureContext, st: pd.DataFrame) -> None:
    roles = st["schema_role"] if len(st) and "schema_role" in st.columns else pd.Series(dtype=object)
    n = {r: int((roles == r).sum()) for r in ("first", "repeat", "concurrent")}
    ctx.add("schema_first_n", float(n["first"]))
    ctx.add("schema_repeat_n", float(n["repeat"]))
    ctx.add("schema_concurrent_n", float(n["concurrent"]))
    min_n = int(ctx.params["schema_min_role_requests"])
    if n["first"] < 1 or n["repeat"] < min_n:
        if not any(n.values()):
            why = NO_DESIGN
        elif n["first"] < 1:
            why = (f"no schema's first use among the measured requests ({n['repeat']} repeats): every grammar "
                   "was compiled before (in the warm-up) or the design sends one schema")
        else:
            why = (f"{n['repeat']} repeats of a schema after its first use had its first token (< {min_n}): with "
                   "groups no larger than the concurrency, uses run at once; raise R in --response-format schema:R")
        ctx.na(CLIENT_NAMES, why)
        return
    ttft = num_col(st, "ttft_s")
    first = float(np.nanmedian(ttft[roles == "first"]))
    repeat = float(np.nanmedian(ttft[roles == "repeat"]))
    ctx.add("schema_first_ttft_p50_s", first)
    ctx.add("schema_repeat_ttft_p50_s", repeat)
    ctx.add("schema_first_ttft_x", first / repeat if repeat > 0 else None,
            None if repeat > 0 else "the repeats' TTFT median is 0")
    firsts = ttft[roles == "first"].dropna()
    ctx.add("schema_first_above_repeat_frac", float((firsts > np.nanquantile(ttft[roles == "repeat"], 0.9)).mean()))
    waited = roles.isin(["first", "concurrent"])
    excess = (ttft[waited] - repeat).clip(lower=0).sum()
    total = ttft[roles.notna()].sum()
    ctx.add("schema_wait_share_of_ttft", float(excess / total) if total > 0 else None,
            None if total > 0 else "no TTFT among the schema requests")


def _server(ctx: FeatureContext, st: pd.DataFrame) -> None:
    has = st["grammar_key"].notna() if len(st) and "grammar_key" in st.columns else pd.Series(False, index=st.index)
    ctx.add("grammar_requests_n", float(has.sum()), source=SERVER_SOURCE)
    if not has.any():
        ctx.na(SERVER_NAMES, "no request span carries a grammar (ttft.grammar.key): no structured-output request "
                             "reached an engine that reports its grammar waits")
        return
    g = st.loc[has]
    hit = g["grammar_cache_hit"].map(lambda v: v is True or v == 1 or str(v).lower() == "true")
    ctx.add("grammar_miss_frac", float((~hit).mean()), source=SERVER_SOURCE)
    wait = num_col(g, "grammar_wait_s").fillna(0.0)
    waited = wait[wait > 0]
    ctx.add("grammar_wait_p50_s", float(waited.median()) if len(waited) else None,
            None if len(waited) else "no request waited for its grammar", source=SERVER_SOURCE)
    ttft = num_col(g, "ttft_s")
    ok = ttft.notna() & (ttft > 0)
    if ok.sum() < 3:
        ctx.na(SERVER_NAMES[2:], "fewer than 3 completed structured-output requests")
        return
    w, t = wait[ok].clip(upper=ttft[ok]), ttft[ok]
    ctx.add("grammar_wait_share_of_ttft", float(w.sum() / t.sum()), source=SERVER_SOURCE)
    tail = t >= t.quantile(float(ctx.params["tail_quantile"]))
    ctx.add("grammar_wait_share_of_ttft_tail", float(w[tail].sum() / t[tail].sum()), source=SERVER_SOURCE)
