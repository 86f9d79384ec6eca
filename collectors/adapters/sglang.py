"""SGLang's /metrics names onto canonical series.

Names and meanings read from sgl-project/sglang ``python/sglang/srt/observability/metrics_collector.py``
@44cedc2b (the module was ``srt/metrics/collector.py`` before), ``scheduler_metrics_mixin.py``
@44cedc2b and ``req_time_stats.py`` @602413bc.

* Scheduler series carry ``tp_rank``, ``pp_rank`` and ``moe_ep_rank`` (``dp_rank`` only with
  data parallelism). With ``--enable-metrics-for-all-schedulers`` every rank of one scheduler
  reports the same queue and the same KV pool, so gauges and counters take the **max across
  ranks**, never the sum (two ranks at 0.6 KV usage are 0.6, not 1.2). ``dp_rank`` values are
  separate schedulers and stay apart as entities.
* The scheduler sets its gauges only in ``log_prefill_stats``/``log_decode_stats`` (once per
  ``decode_log_interval``): when the server goes idle they **freeze** at their last value. A
  window in which no token counter moved and no gauge changed is stale: its gauge rows are
  left out (unknown, not zero) and ``gauges_stale`` is 1.
* ``per_stage_req_latency_seconds{stage="prefill_forward"}`` is prefill finished minus first
  forward entry: the **whole prefill, all chunks** (``chunked_prefill`` is observed per chunk).
  Stages really observed: ``request_process``, ``prefill_forward``, ``chunked_prefill`` and the
  PD stages; ``prefill_waiting`` has ``metrics_is_observed=False``.
* ``realtime_tokens_total{mode=prefill_compute|prefill_cache|decode}`` counts tokens as the
  scheduler logs stats; ``cached_tokens_total{cache_source}`` counts prompt tokens served from a
  cache; ``prompt_tokens_total`` (tokenizer side) is counted at finish and includes cached ones.
"""

from __future__ import annotations

from diag.ground import stages as S
from diag.ground.metric_sources import (Combine, CounterRate, CounterSumRatio, CounterValue, EngineAdapter, Gauge,
                                        Histogram, SeriesMap)

SOURCE = ("sgl-project/sglang python/sglang/srt/observability/metrics_collector.py @44cedc2b; "
          "scheduler_metrics_mixin.py @44cedc2b; req_time_stats.py @602413bc")
#: labels naming ranks of one scheduler: gauges/counters take the max over them
RANKS: tuple[str, ...] = ("tp_rank", "pp_rank", "moe_ep_rank")

_STAGE = "sglang:per_stage_req_latency_seconds"
_STAGE_OLD = "sglang:request_latency_seconds"
_RT = "sglang:realtime_tokens_total"


def _rt(mode: str) -> CounterRate:
    return CounterRate(_RT, (("mode", mode),), max_over=RANKS)


SGLANG = EngineAdapter(
    engine="sglang",
    prefixes=("sglang:",),
    maps=(
        SeriesMap(S.SERIES_QUEUE_TIME_S, (Histogram("sglang:queue_time_seconds"),)),
        SeriesMap(S.SERIES_PREFILL_TIME_S, (Histogram(_STAGE, (("stage", "prefill_forward"),)),
                                            Histogram(_STAGE_OLD, (("stage", "prefill_forward"),))),
                  note="prefill_forward stage: first forward entry -> prefill finished, all chunks"),
        SeriesMap(S.SERIES_TTFT_S, (Histogram("sglang:time_to_first_token_seconds"),)),
        SeriesMap(S.SERIES_ITL_S, (Histogram("sglang:inter_token_latency_seconds"),)),
        SeriesMap(S.SERIES_E2E_S, (Histogram("sglang:e2e_request_latency_seconds"),)),
        SeriesMap(S.SERIES_DECODE_TIME_S, (Combine(((1.0, Histogram("sglang:e2e_request_latency_seconds")),
                                                    (-1.0, Histogram("sglang:time_to_first_token_seconds")))),),
                  note="mean e2e - mean TTFT over the window"),
        SeriesMap(S.SERIES_KV_USAGE, (Gauge("sglang:token_usage", max_over=RANKS),), note="max across ranks"),
        SeriesMap(S.SERIES_WAITING, (Gauge("sglang:num_queue_reqs", max_over=RANKS),)),
        SeriesMap(S.SERIES_RUNNING, (Gauge("sglang:num_running_reqs", max_over=RANKS),)),
        SeriesMap(S.SERIES_PREEMPTIONS, (CounterValue("sglang:num_retracted_requests_total", max_over=RANKS),),
                  note="retractions"),
        SeriesMap(S.SERIES_PREEMPTIONS_PER_S, (CounterRate("sglang:num_retracted_requests_total", max_over=RANKS),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate("sglang:prompt_tokens_total"),),
                  note="tokenizer side, counted at finish, cached tokens included"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_COMPUTED_PER_S, (_rt("prefill_compute"),),
                  note="realtime_tokens_total{mode=prefill_compute}, updated each log interval"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_CACHED_PER_S, (_rt("prefill_cache"),
                                                        CounterRate("sglang:cached_tokens_total", max_over=RANKS)),
                  note="realtime_tokens_total{mode=prefill_cache}, else cached_tokens_total (all cache sources)"),
        SeriesMap(S.SERIES_PREFIX_CACHE_HIT_RATIO, (
            CounterSumRatio(_rt("prefill_cache"), (_rt("prefill_compute"), _rt("prefill_cache"))),),
                  note="Δ prefill_cache tokens / Δ (prefill_compute + prefill_cache) tokens"),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("sglang:generation_tokens_total"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate("sglang:time_to_first_token_seconds_count"),),
                  note="Δ TTFT histogram count / Δt"),
    ),
    entity_labels=("dp_rank",),
    note="decode time = mean e2e - mean TTFT; prefill = prefill_forward stage histogram (all chunks); per-rank "
    "gauges take the max across tp/pp/moe_ep ranks; gauges freeze when the server is idle: such windows are "
    "marked gauges_stale and their gauge rows left out",
    activity=(CounterRate(_RT, max_over=RANKS), CounterRate("sglang:generation_tokens_total"),
              CounterRate("sglang:prompt_tokens_total"), CounterRate("sglang:time_to_first_token_seconds_count"),
              CounterRate("sglang:num_retracted_requests_total", max_over=RANKS)),
    source=SOURCE,
)
