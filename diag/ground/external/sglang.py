"""SGLang: its request-stage slice spans and root (sgl-project/sglang ``RequestStage.stage_name``,
``python/sglang/srt/observability/trace.py`` @b8e5a7c3; see :mod:`diag.ground.external_spans`).

Pure data (``docs/engines.md`` has the table). Its py-spy frames are :data:`FRAMES`; the ``/metrics``
names are in :mod:`collectors.adapters.sglang`.
"""

from __future__ import annotations

import re

from diag.ground import stages
from diag.ground.external import FrameRule

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
