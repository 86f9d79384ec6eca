"""Per-engine py-spy frame tables: which of an engine's own files and functions are which CPU stage.

Each :class:`~collectors.pyspy_frames.PatternSet` is the engine's rules, then the shared
:data:`~collectors.pyspy_frames.COMMON_RULES` and :data:`~collectors.pyspy_frames.FALLBACK_RULES`
(the walk that picks a sample's stage is in :mod:`collectors.pyspy_frames`). Engines:
``bundled`` (diag/engine), ``vllm``, ``sglang``, ``transformers`` (``transformers serve``, plain and
``--continuous-batching``) and ``generic`` (shared frames plus naming conventions, for an engine
with no table). Immutable; thread-safe.
"""

from __future__ import annotations

from collectors.pyspy_frames import (
    _DECODE_FUNCS, COMMON_RULES, CPU_COMM, CPU_DETOKENIZE, CPU_FORWARD, CPU_HTTP, CPU_SAMPLE, CPU_SCHEDULER,
    CPU_SERIALIZATION, CPU_TOKENIZE, FALLBACK_RULES, GENERIC, PatternSet, _r,
)
from collectors.pyspy_transformers import TRANSFORMERS

_SHARED = COMMON_RULES + FALLBACK_RULES

_BUNDLED = r"(^|/)(diag/)?engine/"
BUNDLED = PatternSet("bundled", (
    _r(CPU_DETOKENIZE, _BUNDLED + r"tokenizer\.py$",
       r"^IncrementalDetokenizer\.|(^|\.)(decode\w*|_decode\w*|detokeni\w*)$",
       why="diag/engine/tokenizer.py decode / IncrementalDetokenizer"),
    _r(CPU_TOKENIZE, _BUNDLED + r"tokenizer\.py$", why="diag/engine/tokenizer.py (encode, chat template)"),
    _r(CPU_DETOKENIZE, _BUNDLED, r"(^|\.)_?detokeni\w*$", why="a detokenize function in the engine"),
    _r(CPU_TOKENIZE, _BUNDLED, r"(^|\.)_?tokeni[sz]e\w*$", why="a tokenize function in the engine"),
    _r(CPU_SAMPLE, _BUNDLED + r"sampler\.py$", why="diag/engine/sampler.py"),
    _r(CPU_COMM, _BUNDLED + r"tp\.py$", r"(^|\.)_?(all_reduce|all_gather\w*|broadcast\w*|barrier|reduce_scatter\w*)$",
       why="diag/engine/tp.py collectives"),
    _r(CPU_FORWARD, _BUNDLED + r"(model|model_config|tp)\.py$",
       why="diag/engine/model.py forward, model_config.py weights, tp.py runners"),
    _r(CPU_SCHEDULER, _BUNDLED + r"scheduler(_types)?\.py$", why="diag/engine/scheduler.py, scheduler_types.py"),
    _r(CPU_HTTP, _BUNDLED + r"(server|openai_protocol|delayed_writer)\.py$",
       why="diag/engine/server.py (HTTP, SSE), openai_protocol.py, delayed_writer.py"),
    _r(CPU_SCHEDULER, _BUNDLED + r"(engine|engine_load|step_loop|request_outputs|request)\.py$",
       why="diag/engine/engine.py, step_loop.py, request_outputs.py, engine_load.py: step loop bookkeeping"),
) + _SHARED)

VLLM = PatternSet("vllm", (
    _r(CPU_DETOKENIZE, r"(^|/)vllm/v1/engine/detokenizer\.py$|(^|/)vllm/(tokenizers|transformers_utils)/detokenizer\w*\.py$"
                       r"|(^|/)vllm/engine/output_processor/",
       why="vllm/v1/engine/detokenizer.py (IncrementalDetokenizer)"),
    _r(CPU_DETOKENIZE, r"(^|/)vllm/(tokenizers|transformers_utils)/", _DECODE_FUNCS, why="vLLM tokenizer decode"),
    _r(CPU_TOKENIZE, r"(^|/)vllm/v1/engine/(input_)?processor\.py$|(^|/)vllm/inputs/(preprocess|parse)\.py$"
                     r"|(^|/)vllm/(tokenizers|renderers|multimodal)/|(^|/)vllm/transformers_utils/tokenizer\w*"
                     r"|(^|/)vllm/entrypoints/(chat_utils|renderer)\.py$",
       why="input processing: tokenizer, chat template, multimodal"),
    _r(CPU_TOKENIZE, r"(^|/)vllm/entrypoints/", r"(^|\.)_?(\w*tokeni[sz]e\w*|preprocess\w*|normalize_prompt\w*|render\w*|\w*chat_template\w*)$",
       why="OpenAI server tokenizing/rendering the prompt"),
    _r(CPU_SAMPLE, r"(^|/)vllm/v1/sample/|(^|/)vllm/model_executor/layers/(sampler|rejection_sampler)\.py$"
                   r"|(^|/)vllm/v1/structured_output/|(^|/)vllm/model_executor/guided_decoding/",
       why="vllm/v1/sample (top-k/top-p, penalties, logprobs), structured output"),
    _r(CPU_FORWARD, r"(^|/)vllm/(v1/worker|worker|model_executor|attention|v1/attention|compilation"
                    r"|v1/executor|executor|v1/spec_decode|lora)/|(^|/)vllm/forward_context\.py$"
                    r"|(^|/)vllm/distributed/device_communicators/shm_broadcast\.py$",
       why="model runner / executor (shm_broadcast: engine waiting on the workers' forward)"),
    _r(CPU_COMM, r"(^|/)vllm/distributed/", why="vllm/distributed collectives"),
    _r(CPU_SCHEDULER, r"(^|/)vllm/v1/core/|(^|/)vllm/core/|(^|/)vllm/v1/engine/core\.py$",
       why="vllm/v1/core/sched/scheduler.py, KV-cache manager, EngineCore loop"),
    _r(CPU_SERIALIZATION, r"(^|/)vllm/v1/serial_utils\.py$", why="msgpack IPC between front end and engine core"),
    _r(CPU_HTTP, r"(^|/)vllm/entrypoints/", why="vllm/entrypoints/openai API server"),
) + _SHARED)

_SRT = r"(^|/)sglang/srt/"
SGLANG = PatternSet("sglang", (
    _r(CPU_DETOKENIZE, _SRT + r"managers/detokenizer_manager\.py$", why="DetokenizerManager"),
    _r(CPU_TOKENIZE, _SRT + r"managers/tokenizer_manager\w*\.py$", r"(^|\.)_?(\w*tokeni[sz]\w*|_create_tokenized_object)$",
       why="TokenizerManager._tokenize_one_request / batch tokenize"),
    _r(CPU_TOKENIZE, _SRT + r"managers/(async_dynamic_batch_tokenizer|multimodal_processor|mm_utils)\.py$"
                     + r"|" + _SRT + r"(utils/)?hf_transformers_utils\.py$|" + _SRT + r"(conversation|jinja_template_utils)\.py$"
                     + r"|" + _SRT + r"multimodal/",
       why="tokenizer helpers, chat templates, multimodal processing"),
    _r(CPU_TOKENIZE, _SRT + r"(entrypoints|openai_api)/", r"(^|\.)_?(process_messages|\w*chat_template\w*|\w*tokeni[sz]e\w*)$",
       why="OpenAI server applying the chat template"),
    _r(CPU_SAMPLE, _SRT + r"layers/sampler\.py$|" + _SRT + r"(sampling|constrained)/",
       why="sglang/srt/layers/sampler.py, sampling params, grammar"),
    _r(CPU_FORWARD, _SRT + r"(model_executor|models|layers|speculative|lora)/|" + _SRT + r"managers/tp_worker\w*\.py$",
       why="TpModelWorker / ModelRunner forward"),
    _r(CPU_COMM, _SRT + r"distributed/", why="sglang/srt/distributed collectives"),
    _r(CPU_SCHEDULER, _SRT + r"managers/(scheduler\w*|schedule_batch|schedule_policy|data_parallel_controller)\.py$"
                      + r"|" + _SRT + r"mem_cache/",
       why="sglang/srt/managers/scheduler.py, radix cache, allocators"),
    _r(CPU_HTTP, _SRT + r"(entrypoints|openai_api)/|" + _SRT + r"managers/tokenizer_manager\w*\.py$",
       why="http_server.py / OpenAI serving; the rest of TokenizerManager is request handling"),
) + _SHARED)


PATTERN_SETS: dict[str, PatternSet] = {p.engine: p for p in (BUNDLED, VLLM, SGLANG, TRANSFORMERS, GENERIC)}


def pattern_set(engine: str | PatternSet) -> PatternSet:
    """The rules for ``engine`` ("bundled", "vllm", "sglang", "transformers", "generic") or the set itself."""
    if isinstance(engine, PatternSet):
        return engine
    try:
        return PATTERN_SETS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(PATTERN_SETS)}") from None

