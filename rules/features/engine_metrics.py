"""Theme: the engine's own /metrics series (canonical names of ``collectors.prometheus_adapters``).

``engine_metrics`` computes windowed, request-weighted means (TTFT, queue and prefill time,
their shares of TTFT, busy seconds per second, prompt throughput) and decides the series-only
mode (writes ``ctx.series_only``); ``series_fallback`` then stands in TTFT percentiles, stage
shares and the request count from those series when no request has a TTFT.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext


def engine_metrics(ctx: FeatureContext) -> None:
    """Engine-wide numbers from the canonical series of ``collectors.prometheus_adapters``.

    Windowed means (``queue_time_s``, ``ttft_s``, ...) are weighted by the requests in each
    scrape window (``requests_per_s`` x window length) when the engine exports a request
    count, else every window counts the same. Always computed; the request-level features
    fall back to them only when no request has a TTFT (:func:`series_fallback`).
    """
    S = stages
    rate_series = (S.SERIES_REQUESTS_PER_S, S.SERIES_TTFT_S, S.SERIES_QUEUE_TIME_S, S.SERIES_PREFILL_TIME_S,
                   S.SERIES_ITL_S, S.SERIES_PREFILL_BUSY, S.SERIES_PROMPT_TOKENS_PER_S,
                   S.SERIES_GENERATION_TOKENS_PER_S)
    ts = [pd.to_numeric(ctx.series_values(n)["ts_s"], errors="coerce") for n in rate_series]
    windows = pd.concat(ts).dropna().unique() if any(len(t) for t in ts) else np.array([])
    ctx.add("metrics_windows_n", float(len(windows)))
    src = "prometheus"
    # requests in each window: requests_per_s x the time since the entity's previous scrape
    rq = ctx.series_values(S.SERIES_REQUESTS_PER_S)
    if len(rq):
        allrows = ctx.series.loc[ctx.series["source"].astype(str) == str(rq["source"].iloc[0])]
        all_ts = pd.DataFrame({"entity": allrows["entity"].astype(str).to_numpy(),
                               "ts_s": pd.to_numeric(allrows["ts_s"], errors="coerce").to_numpy()}).dropna()
        prev: dict[tuple[str, float], float] = {}
        for ent, g in all_ts.drop_duplicates().groupby("entity"):
            t = np.sort(g["ts_s"].to_numpy())
            for a, b in zip(t[:-1], t[1:]):
                prev[(str(ent), float(b))] = float(b - a)
        ents = rq["entity"].astype(str).to_numpy()
        tsv = pd.to_numeric(rq["ts_s"], errors="coerce").to_numpy(dtype="float64")
        dt = np.array([prev.get((e, float(t)), np.nan) for e, t in zip(ents, tsv)])
        n = pd.to_numeric(rq["value"], errors="coerce").to_numpy(dtype="float64") * dt
        ctx.add("metrics_requests_n", float(np.nansum(n)) if np.isfinite(n).any() else None,
                None if np.isfinite(n).any() else "no window length for the requests_per_s series", source=src)
    else:
        ctx.add("metrics_requests_n", None,
                "the engine exports no request count (no requests_per_s series from a TTFT/queue histogram)")
    w = S.SERIES_REQUESTS_PER_S
    ttft = ctx.wmean(S.SERIES_TTFT_S, w)
    queue = ctx.wmean(S.SERIES_QUEUE_TIME_S, w)
    pre = ctx.wmean(S.SERIES_PREFILL_TIME_S, w)
    no = "no {} series (the engine's {} histogram)"
    ctx.add("metrics_ttft_mean_s", ttft, None if ttft is not None else no.format("ttft_s", "TTFT"), source=src)
    ctx.add("metrics_queue_time_mean_s", queue,
            None if queue is not None else no.format("queue_time_s", "queue-time"), source=src)
    q95 = ctx.wmean(stages.SERIES_QUEUE_TIME_S + "_p95", w)
    ctx.add("metrics_queue_time_p95_s", q95,
            None if q95 is not None else "no queue_time_s_p95 series (queue-time histogram buckets)", source=src)
    ctx.add("metrics_prefill_time_mean_s", pre,
            None if pre is not None else no.format("prefill_time_s", "prefill-time"), source=src)
    # a front end's own tokenizer latency (NVIDIA Dynamo's tokenizer_latency_ms{operation="tokenize"}):
    # one tokenize call per request, before the engine sees it
    tok = ctx.wmean(S.SERIES_TOKENIZE_TIME_S, w)
    ctx.add("metrics_tokenize_time_mean_s", tok,
            None if tok is not None else "no tokenize_time_s series (a front end's tokenizer latency)", source=src)
    for stage, mean, feat in ((stages.QUEUE, queue, "metrics_queue_share"), (stages.PREFILL, pre, "metrics_prefill_share"),
                              (stages.TOKENIZE, tok, "metrics_tokenize_share")):
        share = mean / ttft if (mean is not None and ttft is not None and ttft > 0) else None
        ctx.add(feat, share,
                None if share is not None else f"needs {stage} and TTFT means from the engine's metrics", source=src)
    # engine busy with prompts / tokens (llama.cpp's prompt seconds, TGI's batch step sums).
    # llama.cpp adds a request's prompt seconds when its prompt is done (one window may hold
    # 3 s/s, its neighbours 0), and sums its slots, which share one batched forward: so the
    # run's mean per replica is clipped at 1 s/s (always busy), never read as "4x busy"
    for series, feat in ((S.SERIES_PREFILL_BUSY, "prefill_busy_ratio"), (S.SERIES_DECODE_BUSY, "decode_busy_ratio")):
        d = ctx.weighted(series)
        if len(d):  # time mean per entity (replica), clipped, then the mean over entities
            per_entity = d.groupby("entity")["value"].mean()
            val = float(per_entity.clip(upper=1.0).mean())
            ctx.add(feat, val, source=src + ("; above 1 s/s (slots summed) clipped at 1"
                                                             if bool((per_entity > 1.0).any()) else ""))
        else:
            ctx.add(feat, None, f"no {series} series (engine counters of busy seconds)")
    spt = ctx.wmean(S.SERIES_PREFILL_S_PER_TOKEN, S.SERIES_PROMPT_TOKENS_PER_S)
    ctx.add("prefill_s_per_token", spt, None if spt is not None else
            "no prefill_s_per_token series (engine counters of prompt seconds and prompt tokens)", source=src)
    # prompt work: the tokens the engine computed where it says (vLLM prompt_tokens_by_source
    # {source="local_compute"}); its prompt_tokens_total adds whole prompts, cached tokens included
    computed = ctx.wmean(S.SERIES_PROMPT_TOKENS_COMPUTED_PER_S)
    ptps = computed if computed is not None else ctx.wmean(S.SERIES_PROMPT_TOKENS_PER_S)
    ctx.add("prompt_tokens_per_s", ptps, None if ptps is not None else "no prompt_tokens_per_s series",
            source=src + ("; computed prompt tokens (prefix-cache hits left out)" if computed is not None else ""))
    # no request has a TTFT, but the engine's metrics describe the run: the series-only mode
    total = int(ctx.features.value("requests_total_n", 0) or 0)
    failed = int(ctx.features.value("requests_failed_n", 0) or 0)
    all_failed = total > 0 and failed == total
    have = any(len(ctx.series_values(n)) for n in (S.SERIES_TTFT_S, S.SERIES_QUEUE_TIME_S, S.SERIES_PREFILL_TIME_S,
                                                     S.SERIES_ITL_S, S.SERIES_PREFILL_BUSY, S.SERIES_KV_USAGE,
                                                     S.SERIES_PREEMPTIONS, S.SERIES_WAITING))
    ctx.series_only = len(ctx.steady) == 0 and not all_failed and have and len(windows) > 0
    ctx.add("series_only", 1.0 if ctx.series_only else 0.0,
            source="from engine metrics only, no per-request spans" if ctx.series_only else None)


def series_fallback(ctx: FeatureContext) -> None:
    """Series-only mode: TTFT percentiles, stage shares and the request count from the engine's
    metrics (source "prometheus"). Never replaces a feature computed from requests."""
    if not ctx.series_only:
        return
    S = stages
    src = "prometheus"
    w = S.SERIES_REQUESTS_PER_S
    n = ctx.features.value("metrics_requests_n")
    if n is not None:
        ctx.add("requests_n", float(round(n)), source=src)
    else:
        ctx.add("requests_n", None, ctx.features.get("metrics_requests_n").reason)
    # TTFT percentiles: request-weighted mean of the windowed percentiles (histogram bucket
    # deltas); without buckets (TTFT derived from means, e.g. TGI) percentiles of the window means
    for q, name, pct_series in ((50, "ttft_p50_s", S.SERIES_TTFT_S + "_p50"), (95, "ttft_p95_s", S.SERIES_TTFT_S + "_p95"),
                                (99, "ttft_p99_s", S.SERIES_TTFT_S + "_p99")):
        val = ctx.wmean(pct_series, w)
        if val is None:
            means = pd.to_numeric(ctx.series_values(S.SERIES_TTFT_S)["value"], errors="coerce").dropna()
            val = float(np.percentile(means, q)) if len(means) else None
        if val is not None:
            ctx.add(name, val, source=src)
        else:
            ctx.add(name, None, "no request has a TTFT and the engine's metrics have no TTFT histogram")
    ttft = ctx.features.value("metrics_ttft_mean_s")
    if ttft is not None:
        ctx.add("ttft_mean_s", ttft, source=src)
    shares: dict[str, float] = {}
    means: dict[str, float] = {}
    for stage, share, mean, median_name, tail_name in (
            (S.QUEUE, "metrics_queue_share", "metrics_queue_time_mean_s", "queue_share_median", "queue_share_tail"),
            (S.PREFILL, "metrics_prefill_share", "metrics_prefill_time_mean_s", "prefill_share_median", "prefill_share_tail"),
            (S.TOKENIZE, "metrics_tokenize_share", "metrics_tokenize_time_mean_s", "tokenize_share_median",
             "tokenize_share_tail")):
        v = ctx.features.value(share)
        if v is None:
            continue
        shares[stage] = min(max(float(v), 0.0), 1.0)
        means[stage] = float(ctx.features.value(mean))
        # one number for both: the metrics give means per window, not the slowest 5% of requests
        ctx.add(median_name, shares[stage], source=src)
        ctx.add(tail_name, shares[stage], source=src)
    if shares:
        ctx.add("stage_shares_median", dict(shares), source=src)
        ctx.add("stage_shares_tail", dict(shares), source=src)
        ctx.add("stage_tail_mean_s", means, source=src)
        ctx.add("unattributed_share_tail", max(0.0, 1.0 - sum(shares.values())), source=src)
