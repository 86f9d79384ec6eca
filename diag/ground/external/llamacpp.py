"""llama.cpp server (``llama-server``): its ``/metrics`` names and what to check next in its terms when a
rule fires.

Pure data (``docs/engines.md`` has the table): its ``/metrics`` table is :data:`METRICS` (evaluated by
:mod:`collectors.prometheus_adapters`).

``/metrics`` names read from ggml-org/llama.cpp ``tools/server/server-context.cpp`` (the ``/metrics``
handler; earlier ``tools/server/server.cpp``) @fb402660, and an index copy of a newer
``server-context.cpp`` for ``prompt_tokens_cached_total``.

* ``prompt_tokens_total`` counts prompt tokens *processed* (cached tokens excluded in the
  builds that also export ``prompt_tokens_cached_total``, "prompt tokens reused from the
  cache"); ``prompt_seconds_total`` the time spent on them.
* ``n_busy_slots_per_decode`` (typed "counter" in some builds, "gauge" in others) is an
  *average* busy slots per ``llama_decode()`` call since start, read here as a gauge.
* ``requests_deferred`` counts tasks waiting for a free slot. **Blind spot:** requests that wait
  in the HTTP thread pool for a worker thread never reach the task queue, so they are not
  counted (ggml-org/llama.cpp#5827: a load test stalled at ``--parallel N`` with the pool
  smaller than the slots). A client-side wait with ``requests_deferred`` at 0 points there.
* ``prompt_tokens_seconds``/``predicted_tokens_seconds`` reset on every scrape: not read.
"""

from __future__ import annotations

from diag.ground import stages as S
from diag.ground.metric_sources import CounterRate, CounterRatio, CounterSumRatio, EngineAdapter, Gauge, SeriesMap

#: what to check next in llama.cpp's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "frontend": "llama.cpp: --threads-http (below --parallel slots, requests stall before a slot)",
    "prefix_cache": ("llama.cpp: \"cache_prompt\": true in the request (the chat endpoint once ignored it, "
                     "ggml-org/llama.cpp#4329) and enough slots/--ctx-size that a slot keeps its prompt; "
                     "timings.cache_n per response"),
}

# --- /metrics -------------------------------------------------------------------------------

#: where the ``/metrics`` names were read, file @ commit (:data:`METRICS`' ``source``)
SOURCE = "ggml-org/llama.cpp tools/server/server-context.cpp @fb402660 (/metrics handler)"

_CACHED = CounterRate("llamacpp:prompt_tokens_cached_total")
_PROMPT = CounterRate("llamacpp:prompt_tokens_total")

#: the /metrics table: llama-server's names onto the canonical series
METRICS = EngineAdapter(
    engine="llamacpp",
    prefixes=("llamacpp:",),
    maps=(
        SeriesMap(S.SERIES_ITL_S, (CounterRatio(CounterRate("llamacpp:tokens_predicted_seconds_total"),
                                                CounterRate("llamacpp:tokens_predicted_total")),),
                  note="Δ generation seconds / Δ generated tokens"),
        SeriesMap(S.SERIES_KV_USAGE, (Gauge("llamacpp:kv_cache_usage_ratio"),), note="older builds only"),
        SeriesMap(S.SERIES_WAITING, (Gauge("llamacpp:requests_deferred"),),
                  note="tasks waiting for a slot; requests waiting in the HTTP thread pool are not counted"),
        SeriesMap(S.SERIES_RUNNING, (Gauge("llamacpp:requests_processing"),)),
        SeriesMap(S.SERIES_BUSY_SLOTS_PER_DECODE, (Gauge("llamacpp:n_busy_slots_per_decode"),),
                  note="mean busy slots per llama_decode() call since start"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (_PROMPT,), note="prompt tokens processed (computed)"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_COMPUTED_PER_S, (_PROMPT,), note="prompt tokens processed (computed)"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_CACHED_PER_S, (_CACHED,), note="prompt tokens reused from the cache"),
        SeriesMap(S.SERIES_PREFIX_CACHE_HIT_RATIO, (CounterSumRatio(_CACHED, (_PROMPT, _CACHED)),),
                  note="Δ cached / Δ (processed + cached) prompt tokens"),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("llamacpp:tokens_predicted_total"),)),
        SeriesMap(S.SERIES_PREFILL_BUSY, (CounterRate("llamacpp:prompt_seconds_total"),),
                  note="Δ prompt-processing seconds / Δt, summed over slots (can exceed 1 with --parallel)"),
        SeriesMap(S.SERIES_PREFILL_S_PER_TOKEN, (CounterRatio(CounterRate("llamacpp:prompt_seconds_total"),
                                                              CounterRate("llamacpp:prompt_tokens_total")),),
                  note="Δ prompt seconds / Δ prompt tokens (computed tokens; cache reuse excluded)"),
        SeriesMap(S.SERIES_DECODE_BUSY, (CounterRate("llamacpp:tokens_predicted_seconds_total"),),
                  note="Δ generation seconds / Δt, summed over slots"),
    ),
    note="no queue/prefill/TTFT/e2e histograms and no request counter (per-response timings.prompt_ms only); "
    "ITL = Δtokens_predicted_seconds / Δtokens_predicted; prefill busy = Δprompt_seconds / Δt; "
    "prefill s/token = Δprompt_seconds / Δprompt_tokens; requests_deferred misses requests waiting in the "
    "HTTP thread pool",
    source=SOURCE,
)
