"""TensorRT-LLM (``trtllm-serve``, and Triton with the TensorRT-LLM backend): its ``/metrics`` names
and what to check next in its terms when a rule fires.

Pure data (``docs/engines.md`` has the table): :data:`METRICS` (trtllm-serve) and
:data:`TRITON_METRICS` (Triton), evaluated by :mod:`collectors.prometheus_adapters`, and
:data:`NEXT_CHECKS`. Where the ``/metrics`` names were read:

* ``trtllm-serve`` answers ``/metrics`` with **JSON** iteration stats and serves Prometheus text
  at ``/prometheus/metrics`` (mounted only with ``return_perf_metrics``):
  NVIDIA/TensorRT-LLM ``tensorrt_llm/serve/openai_server.py`` @e7f7345e (``register_routes``,
  ``mount_metrics``). :func:`collectors.prometheus.metrics_url` and the scraper's JSON fallback
  pick that path.
* Names: ``tensorrt_llm/metrics/collector.py`` @050f80de (``metric_prefix="trtllm_"``, 2026).
  Releases before 1.2 (@89fd9b74, 1.1.0rc5) export 5 metrics **without a prefix**
  (``request_success_total``, ``e2e_request_latency_seconds``, ``time_to_first_token_seconds``,
  ``time_per_output_token_seconds``, ``request_queue_time_seconds``); they are read as
  fallbacks and detected by their exact names (Dynamo adds ``trtllm_`` itself:
  ai-dynamo/dynamo ``docs/backends/trtllm/trtllm-prometheus.md`` @313a897b).
* ``trtllm_kv_cache_hit_rate`` (0..1) and ``trtllm_prompt_cached_tokens_total`` (tokens) are the
  cache signals (names from @050f80de as the reference read them; the hit rate's type was not
  re-read, so a histogram of that name is read too).
* Triton: ``nv_trt_llm_request_metrics{request_type="waiting"}`` and
  ``kv_cache_block_type="fraction"`` exist only in newer ``custom_metrics_reporter.cc``
  (absent @7f9aa468), so the older fallbacks stay. Triton's queue counter misses waiting inside
  the in-flight batcher; only ``request_type="waiting"`` shows it.
"""

from __future__ import annotations

from diag.ground import stages as S
from diag.ground.metric_sources import (CounterRate, CounterRatio, EngineAdapter, Gauge, GaugeRatio, Histogram,
                                        SeriesMap)

#: what to check next in TensorRT-LLM's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "kv_reservation": ("TensorRT-LLM: capacity_scheduler_policy -- GUARANTEED_NO_EVICT admits a request only if KV "
                       "holds its whole max_tokens (the model's max sequence length when unset); MAX_UTILIZATION "
                       "admits on what is used now (NVIDIA/TensorRT-LLM#1012, #2866)"),
    "prefix_cache": ("TensorRT-LLM: KvCacheConfig enable_block_reuse=True (trtllm-serve --extra_llm_api_options); "
                     "trtllm_kv_cache_hit_rate"),
}

#: where the trtllm-serve ``/metrics`` names were read, file @ commit (:data:`METRICS`' ``source``)
SOURCE = ("NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py @050f80de (unprefixed before 1.2: @89fd9b74); "
          "tensorrt_llm/serve/openai_server.py @e7f7345e (/prometheus/metrics)")
#: the names trtllm-serve exported before 1.2, without the trtllm_ prefix (collector.py @89fd9b74)
UNPREFIXED: frozenset[str] = frozenset({
    "request_success_total", "e2e_request_latency_seconds_bucket", "e2e_request_latency_seconds_sum",
    "e2e_request_latency_seconds_count", "time_to_first_token_seconds_bucket", "time_to_first_token_seconds_sum",
    "time_to_first_token_seconds_count", "time_per_output_token_seconds_bucket", "time_per_output_token_seconds_sum",
    "time_per_output_token_seconds_count", "request_queue_time_seconds_bucket", "request_queue_time_seconds_sum",
    "request_queue_time_seconds_count",
})


def _h(name: str) -> tuple[Histogram, Histogram]:
    """The 1.2+ name first, then the unprefixed one of older releases."""
    return Histogram("trtllm_" + name), Histogram(name)


#: the /metrics table of trtllm-serve (its Prometheus text) onto the canonical series
METRICS = EngineAdapter(
    engine="trtllm",
    prefixes=("trtllm_",),
    maps=(
        SeriesMap(S.SERIES_QUEUE_TIME_S, _h("request_queue_time_seconds")),
        SeriesMap(S.SERIES_PREFILL_TIME_S, (Histogram("trtllm_request_prefill_time_seconds"),)),
        SeriesMap(S.SERIES_DECODE_TIME_S, (Histogram("trtllm_request_decode_time_seconds"),)),
        SeriesMap(S.SERIES_TTFT_S, _h("time_to_first_token_seconds")),
        SeriesMap(S.SERIES_ITL_S, _h("time_per_output_token_seconds")),
        SeriesMap(S.SERIES_E2E_S, _h("e2e_request_latency_seconds")),
        SeriesMap(S.SERIES_KV_USAGE, (Gauge("trtllm_kv_cache_utilization"),)),
        SeriesMap(S.SERIES_PREFIX_CACHE_HIT_RATIO, (Gauge("trtllm_kv_cache_hit_rate"),
                                                    Histogram("trtllm_kv_cache_hit_rate")),
                  note="the engine's own KV-cache hit rate (a gauge; a histogram's windowed mean if so exported)"),
        SeriesMap(S.SERIES_WAITING, (Gauge("trtllm_num_requests_waiting"),)),
        SeriesMap(S.SERIES_RUNNING, (Gauge("trtllm_num_requests_running"),)),
        SeriesMap(S.SERIES_PAUSED, (Gauge("trtllm_num_paused_requests"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate("trtllm_prompt_tokens_total"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_CACHED_PER_S, (CounterRate("trtllm_prompt_cached_tokens_total"),),
                  note="prompt tokens served from the KV cache"),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("trtllm_generation_tokens_total"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate("trtllm_time_to_first_token_seconds_count"),
                                            CounterRate("time_to_first_token_seconds_count")),
                  note="Δ TTFT histogram count / Δt"),
    ),
    note="paused requests are a gauge (num_paused), not a preemption counter; Prometheus text is at "
    "/prometheus/metrics (/metrics is JSON); releases before 1.2 export 5 names without the trtllm_ prefix",
    exact_names=UNPREFIXED,
    source=SOURCE,
)

_NV_SUCCESS = CounterRate("nv_inference_request_success")
#: the /metrics table of Triton with the TensorRT-LLM backend onto the canonical series
TRITON_METRICS = EngineAdapter(
    engine="triton",
    prefixes=("nv_trt_llm_", "nv_inference_"),
    maps=(
        SeriesMap(S.SERIES_QUEUE_TIME_S, (CounterRatio(CounterRate("nv_inference_queue_duration_us"), _NV_SUCCESS, 1e-6),),
                  note="Δ cumulative queue µs / Δ successful requests, per model"),
        SeriesMap(S.SERIES_E2E_S, (CounterRatio(CounterRate("nv_inference_request_duration_us"), _NV_SUCCESS, 1e-6),),
                  note="Δ cumulative request µs / Δ successful requests, per model"),
        SeriesMap(S.SERIES_TTFT_S, (Histogram("nv_inference_first_response_histogram_ms", scale=1e-3),),
                  note="only with --metrics-config histogram_latencies=true"),
        SeriesMap(S.SERIES_KV_USAGE, (
            GaugeRatio(Gauge("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "used"),)),
                       Gauge("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "max"),))),
            Gauge("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "fraction"),)),
        ), note="used / max KV blocks"),
        SeriesMap(S.SERIES_WAITING, (Gauge("nv_trt_llm_request_metrics", (("request_type", "waiting"),)),
                                     Gauge("nv_inference_pending_request_count"))),
        SeriesMap(S.SERIES_RUNNING, (Gauge("nv_trt_llm_request_metrics", (("request_type", "scheduled"),)),)),
        SeriesMap(S.SERIES_PAUSED, (Gauge("nv_trt_llm_inflight_batcher_metrics",
                                          (("inflight_batcher_specific_metric", "paused_requests"),)),)),
    ),
    entity_labels=("model",),
    note="queue/e2e are per-request means of Triton's cumulative µs counters, kept apart per model "
    "(ensemble, preprocessing, tensorrt_llm, ...); no prefill/decode split, no token counters",
    source="triton-inference-server/tensorrtllm_backend inflight_batcher_llm/src/custom_metrics_reporter (newer; "
    "@7f9aa468 lacks waiting/fraction); Triton core nv_inference_* metrics",
)
