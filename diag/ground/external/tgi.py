"""TGI (text-generation-inference): the router's request span fields, Rust ``Debug`` durations
(huggingface/text-generation-inference ``router/src/server.rs`` @db931fcf L370-375, L612-616).

Pure data (``docs/engines.md`` has the table); the durations are parsed by
:func:`diag.ground.external_engines.parse_rust_duration_s`. The ``/metrics`` names are in
:mod:`collectors.adapters.tgi`.
"""

from __future__ import annotations

#: the engine's name in request rows and notes
NAME = "tgi"

#: span fields, each a Rust ``Debug`` duration string
TOTAL = "total_time"
VALIDATION = "validation_time"
QUEUE = "queue_time"
INFERENCE = "inference_time"
TIME_PER_TOKEN = "time_per_token"
#: Router handler spans that carry the timing fields (tracing's span name = the function name).
SPAN_NAMES = frozenset(
    {"generate", "generate_stream", "generate_internal", "generate_stream_internal",
     "compat_generate", "completions", "chat_completions"}
)
FIELDS = (TOTAL, VALIDATION, QUEUE, INFERENCE, TIME_PER_TOKEN)
#: what to check next in TGI's terms, by rule id: none, so a TGI capture gets every engine's line
#: (:func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {}
#: which of our stages its spans cannot separate (shown next to its verdicts)
NOTE = (
    "TGI gives validation (incl. tokenization, reported as tokenize), queue and inference; "
    "inference is prefill + decode together, so prefill, decode and server TTFT are not "
    "separable (NaN); output tokens are inference_time / time_per_token."
)
