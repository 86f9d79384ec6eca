"""vLLM: what its request spans carry, read from vllm-project/vllm at the commits cited beside each name.

Pure data (``docs/engines.md`` has the table); the span names and attributes the request table
also reads are in :mod:`diag.ground.stages` (``VLLM_*``). Its py-spy frames are :data:`FRAMES`; the ``/metrics``
names are in :mod:`collectors.adapters.vllm`.
"""

from __future__ import annotations

from diag.ground import stages as S
from diag.ground.external import DECODE_FUNCS, FrameRule

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
