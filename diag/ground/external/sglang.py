"""SGLang: its ``/metrics`` names, and its request-stage slice spans and root (sgl-project/sglang
``RequestStage.stage_name``, ``python/sglang/srt/observability/trace.py`` @b8e5a7c3; see
:mod:`diag.ground.external_spans`).

Pure data (``docs/engines.md`` has the table). Its py-spy frames are :data:`FRAMES`; its ``/metrics``
table is :data:`METRICS` (evaluated by :mod:`collectors.prometheus_adapters`).

``/metrics`` names and meanings read from sgl-project/sglang
``python/sglang/srt/observability/metrics_collector.py`` @44cedc2b (the module was
``srt/metrics/collector.py`` before), ``scheduler_metrics_mixin.py`` @44cedc2b and
``req_time_stats.py`` @602413bc.

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

import re

from diag.ground import stages
from diag.ground.external import FrameRule
from diag.ground.metric_sources import (Combine, CounterRate, CounterSumRatio, CounterValue, EngineAdapter, Gauge,
                                        Histogram, SeriesMap)

#: the engine's name in request rows and notes
NAME = "sglang"

#: slice names by the stage each one is (the rest: lumped)
TOKENIZE = ("tokenize",)
QUEUE = ("prefill_waiting",)
PREFILL = ("prefill_forward", "chunked_prefill")
DECODE = ("decode_loop",)
OTHER = (
    "decode_forward", "dispatch", "api_server_dispatch", "dc_dispatch", "dpc_dispatch", "request_process",
    "prefill_prepare", "prefill_bootstrap", "prefill_transfer_kv_cache", "decode_prepare",
    "decode_bootstrap", "decode_waiting", "decode_transferred", "fake_output", "quick_finish",
    "mini_lb_launch", "wait_pd_finish",
)
SLICE_NAMES = frozenset(TOKENIZE + QUEUE + PREFILL + DECODE + OTHER)
#: Slice names only SGLang uses (``tokenize`` is also ours, so alone it proves nothing).
UNIQUE = SLICE_NAMES - frozenset(stages.ALL_STAGES)
ROOT_RE = re.compile(r"^\s*\w*\s*Req [0-9A-Za-z_-]{1,8}$")
LUMPED_NOTE = (
    "tokenizer -> scheduler dispatch (IPC) + request_process + PD bootstrap/KV transfer + "
    "first detokenize (= server TTFT - tokenize - queue - prefill)"
)
#: which of our stages its spans cannot separate (shown next to its verdicts)
NOTE = (
    "SGLang slices give tokenize, queue (prefill_waiting), prefill (prefill_forward over all chunks + "
    "chunked_prefill outside it) and decode (decode_loop); dispatch IPC, request processing, PD transfer "
    "and the first detokenize are lumped. Server TTFT is the root span's gen_ai.latency.time_to_first_token "
    "(the tokenizer manager's clock) when present, else the end of the last prefill slice minus the root's "
    "start (the scheduler's clock: it misses the detokenizer hop); token counts are not on the spans."
)

#: what to check next in SGLang's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "frontend": "SGLang: tokenizer workers (--tokenizer-worker-num)",
    "head_of_line": ("SGLang: --schedule-policy, and whether a waiting request that cannot be allocated stops the "
                     "admission walk for everything behind it (sgl-project/sglang#22831); --chunked-prefill-size"),
    "prefix_cache": ("SGLang: the radix cache is on unless --disable-radix-cache; sglang:cached_tokens_total against "
                     "prompt tokens"),
}

# --- py-spy frames --------------------------------------------------------------------------

_SRT = r"(^|/)sglang/srt/"
#: which of SGLang's own files and functions are which CPU stage, first match first
#: (:mod:`collectors.pyspy_engines` adds the shared rules)
FRAMES: tuple[FrameRule, ...] = (
    FrameRule(stages.DETOKENIZE, _SRT + r"managers/detokenizer_manager\.py$", why="DetokenizerManager"),
    FrameRule(stages.TOKENIZE, _SRT + r"managers/tokenizer_manager\w*\.py$", r"(^|\.)_?(\w*tokeni[sz]\w*|_create_tokenized_object)$",
              why="TokenizerManager._tokenize_one_request / batch tokenize"),
    FrameRule(stages.TOKENIZE, _SRT + r"managers/(async_dynamic_batch_tokenizer|multimodal_processor|mm_utils)\.py$"
                               + r"|" + _SRT + r"(utils/)?hf_transformers_utils\.py$|" + _SRT + r"(conversation|jinja_template_utils)\.py$"
                               + r"|" + _SRT + r"multimodal/",
              why="tokenizer helpers, chat templates, multimodal processing"),
    FrameRule(stages.TOKENIZE, _SRT + r"(entrypoints|openai_api)/", r"(^|\.)_?(process_messages|\w*chat_template\w*|\w*tokeni[sz]e\w*)$",
              why="OpenAI server applying the chat template"),
    FrameRule(stages.SAMPLE, _SRT + r"layers/sampler\.py$|" + _SRT + r"(sampling|constrained)/",
              why="sglang/srt/layers/sampler.py, sampling params, grammar"),
    FrameRule(stages.CPU_FORWARD, _SRT + r"(model_executor|models|layers|speculative|lora)/|" + _SRT + r"managers/tp_worker\w*\.py$",
              why="TpModelWorker / ModelRunner forward"),
    FrameRule(stages.COMM, _SRT + r"distributed/", why="sglang/srt/distributed collectives"),
    FrameRule(stages.CPU_SCHEDULER, _SRT + r"managers/(scheduler\w*|schedule_batch|schedule_policy|data_parallel_controller)\.py$"
                                    + r"|" + _SRT + r"mem_cache/",
              why="sglang/srt/managers/scheduler.py, radix cache, allocators"),
    FrameRule(stages.CPU_HTTP, _SRT + r"(entrypoints|openai_api)/|" + _SRT + r"managers/tokenizer_manager\w*\.py$",
              why="http_server.py / OpenAI serving; the rest of TokenizerManager is request handling"),
)

# --- /metrics -------------------------------------------------------------------------------

#: where the ``/metrics`` names were read, file @ commit (:data:`METRICS`' ``source``)
SOURCE = ("sgl-project/sglang python/sglang/srt/observability/metrics_collector.py @44cedc2b; "
          "scheduler_metrics_mixin.py @44cedc2b; req_time_stats.py @602413bc")
#: labels naming ranks of one scheduler: gauges/counters take the max over them
RANKS: tuple[str, ...] = ("tp_rank", "pp_rank", "moe_ep_rank")

_STAGE = "sglang:per_stage_req_latency_seconds"
_STAGE_OLD = "sglang:request_latency_seconds"
_RT = "sglang:realtime_tokens_total"


def _rt(mode: str) -> CounterRate:
    return CounterRate(_RT, (("mode", mode),), max_over=RANKS)


#: the /metrics table: SGLang's names onto the canonical series
METRICS = EngineAdapter(
    engine="sglang",
    prefixes=("sglang:",),
    maps=(
        SeriesMap(stages.SERIES_QUEUE_TIME_S, (Histogram("sglang:queue_time_seconds"),)),
        SeriesMap(stages.SERIES_PREFILL_TIME_S, (Histogram(_STAGE, (("stage", "prefill_forward"),)),
                                                 Histogram(_STAGE_OLD, (("stage", "prefill_forward"),))),
                  note="prefill_forward stage: first forward entry -> prefill finished, all chunks"),
        SeriesMap(stages.SERIES_TTFT_S, (Histogram("sglang:time_to_first_token_seconds"),)),
        SeriesMap(stages.SERIES_ITL_S, (Histogram("sglang:inter_token_latency_seconds"),)),
        SeriesMap(stages.SERIES_E2E_S, (Histogram("sglang:e2e_request_latency_seconds"),)),
        SeriesMap(stages.SERIES_DECODE_TIME_S, (Combine(((1.0, Histogram("sglang:e2e_request_latency_seconds")),
                                                         (-1.0, Histogram("sglang:time_to_first_token_seconds")))),),
                  note="mean e2e - mean TTFT over the window"),
        SeriesMap(stages.SERIES_KV_USAGE, (Gauge("sglang:token_usage", max_over=RANKS),), note="max across ranks"),
        SeriesMap(stages.SERIES_WAITING, (Gauge("sglang:num_queue_reqs", max_over=RANKS),)),
        SeriesMap(stages.SERIES_RUNNING, (Gauge("sglang:num_running_reqs", max_over=RANKS),)),
        SeriesMap(stages.SERIES_PREEMPTIONS, (CounterValue("sglang:num_retracted_requests_total", max_over=RANKS),),
                  note="retractions"),
        SeriesMap(stages.SERIES_PREEMPTIONS_PER_S,
                  (CounterRate("sglang:num_retracted_requests_total", max_over=RANKS),)),
        SeriesMap(stages.SERIES_PROMPT_TOKENS_PER_S, (CounterRate("sglang:prompt_tokens_total"),),
                  note="tokenizer side, counted at finish, cached tokens included"),
        SeriesMap(stages.SERIES_PROMPT_TOKENS_COMPUTED_PER_S, (_rt("prefill_compute"),),
                  note="realtime_tokens_total{mode=prefill_compute}, updated each log interval"),
        SeriesMap(stages.SERIES_PROMPT_TOKENS_CACHED_PER_S, (_rt("prefill_cache"),
                                                             CounterRate("sglang:cached_tokens_total", max_over=RANKS)),
                  note="realtime_tokens_total{mode=prefill_cache}, else cached_tokens_total (all cache sources)"),
        SeriesMap(stages.SERIES_PREFIX_CACHE_HIT_RATIO, (
            CounterSumRatio(_rt("prefill_cache"), (_rt("prefill_compute"), _rt("prefill_cache"))),),
                  note="Δ prefill_cache tokens / Δ (prefill_compute + prefill_cache) tokens"),
        SeriesMap(stages.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("sglang:generation_tokens_total"),)),
        SeriesMap(stages.SERIES_REQUESTS_PER_S, (CounterRate("sglang:time_to_first_token_seconds_count"),),
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
