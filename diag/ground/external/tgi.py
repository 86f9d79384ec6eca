"""TGI (text-generation-inference): its router's ``/metrics`` names and request span fields, Rust ``Debug``
durations (huggingface/text-generation-inference ``router/src/server.rs`` @db931fcf L370-375, L612-616).

Pure data (``docs/engines.md`` has the table); the durations are parsed by
:func:`diag.ground.external_engines.parse_rust_duration_s`. Its ``/metrics`` table is :data:`METRICS`
(evaluated by :mod:`collectors.prometheus_adapters`).

``/metrics`` names read from huggingface/text-generation-inference @db931fcf: ``router/src/server.rs``
L415-423, ``backends/v3/src/backend.rs`` L170-171 and L305-381, ``backends/v3/src/queue.rs``
L143/158, ``router/src/lib.rs`` L138. ``describe_gauge`` (server.rs L2053) says
``tgi_batch_total_tokens`` but the gauge emitted is ``tgi_batch_max_total_tokens``, which is the
one read here. metrics-exporter-prometheus prints counters without ``_total``.
"""

from __future__ import annotations

from diag.ground import stages as S
from diag.ground.metric_sources import Combine, CounterRate, EngineAdapter, Gauge, GaugeRatio, Histogram, SeriesMap

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

# --- /metrics -------------------------------------------------------------------------------

#: where the ``/metrics`` names were read, file @ commit (:data:`METRICS`' ``source``)
SOURCE = ("huggingface/text-generation-inference @db931fcf router/src/server.rs, backends/v3/src/backend.rs, "
          "backends/v3/src/queue.rs, router/src/lib.rs")

_TGI_PREFILL = Histogram("tgi_batch_inference_duration", (("method", "prefill"),))
#: the /metrics table: TGI's router names onto the canonical series
METRICS = EngineAdapter(
    engine="tgi",
    prefixes=("tgi_",),
    maps=(
        SeriesMap(S.SERIES_QUEUE_TIME_S, (Histogram("tgi_request_queue_duration"),)),
        SeriesMap(S.SERIES_PREFILL_TIME_S, (_TGI_PREFILL,), note="router-side prefill step of a batch"),
        SeriesMap(S.SERIES_DECODE_TIME_S, (Combine(((1.0, Histogram("tgi_request_inference_duration")),
                                                    (-1.0, _TGI_PREFILL))),),
                  note="mean inference - mean prefill batch step"),
        SeriesMap(S.SERIES_TTFT_S, (Combine(((1.0, Histogram("tgi_request_validation_duration")),
                                             (1.0, Histogram("tgi_request_queue_duration")),
                                             (1.0, _TGI_PREFILL))),),
                  note="approximation: mean validation + mean queue + mean prefill step"),
        SeriesMap(S.SERIES_ITL_S, (Histogram("tgi_request_mean_time_per_token_duration"),)),
        SeriesMap(S.SERIES_E2E_S, (Histogram("tgi_request_duration"),)),
        SeriesMap(S.SERIES_KV_USAGE, (GaugeRatio(Gauge("tgi_batch_current_max_tokens"),
                                                 Gauge("tgi_batch_max_total_tokens")),),
                  note="proxy: tokens the current batch may reach / token budget"),
        SeriesMap(S.SERIES_WAITING, (Gauge("tgi_queue_size"),)),
        SeriesMap(S.SERIES_RUNNING, (Gauge("tgi_batch_current_size"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate("tgi_request_input_length_sum"),)),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("tgi_request_generated_tokens_sum"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate("tgi_request_queue_duration_count"),),
                  note="requests that left the queue for a prefill: Δ queue histogram count / Δt"),
        SeriesMap(S.SERIES_PREFILL_BUSY, (CounterRate("tgi_batch_inference_duration_sum", (("method", "prefill"),)),),
                  note="Δ seconds in prefill batch steps / Δt (the router runs one batch at a time)"),
        SeriesMap(S.SERIES_DECODE_BUSY, (CounterRate("tgi_batch_inference_duration_sum", (("method", "decode"),)),),
                  note="Δ seconds in decode batch steps / Δt"),
    ),
    note="TTFT and decode are derived (validation + queue + prefill step; inference - prefill step); "
    "prefill/decode busy from the batch step histograms' sums; no preemption counter",
    source=SOURCE,
)
