"""SGLang: its request-stage slice spans and root (sgl-project/sglang ``RequestStage.stage_name``,
``python/sglang/srt/observability/trace.py`` @b8e5a7c3; see :mod:`diag.external_spans`).

Pure data (``docs/engines.md`` has the table). The ``/metrics`` names are in
:mod:`collectors.adapters.sglang`, the py-spy frames in :mod:`collectors.pyspy_engines`.
"""

from __future__ import annotations

import re

from diag import stages

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
