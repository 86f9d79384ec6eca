"""NVIDIA Dynamo (its front end before the workers): its ``/metrics`` names and what to check next in its
terms when a rule fires.

Pure data (``docs/engines.md`` has the table): its ``/metrics`` table is :data:`METRICS` (evaluated by
:mod:`collectors.prometheus_adapters`), front end (``dynamo_frontend_*``) and worker
(``dynamo_component_*``) together.

``/metrics`` names read from ai-dynamo/dynamo ``lib/runtime/src/metrics/prometheus_names.rs`` @04070c75
(``frontend_service`` and ``work_handler``; the work-handler names are exported under the
``dynamo_component_`` prefix).

Dynamo splits what no single engine exposes: the front end tokenizes, routes and streams; the
worker runs the engine. From the front end: TTFT, ITL and request duration (histograms, s),
``queued_requests`` (requests that have no first response yet), ``inflight_requests`` (sent
to engines, not finished), ``router_queue_pending_requests`` (waiting in the router's queue
before a worker), ``tokenizer_latency_ms{operation=tokenize|detokenize}`` (histogram, **ms**),
``kv_hit_rate`` (the router's *predicted* hit rate at routing time, 0..1) and
``cached_tokens`` (histogram of prefix-cache-hit tokens per request). From a worker:
``network_transit_seconds`` (front end send -> worker receive, two processes' wall clocks) and
``time_to_first_response_seconds`` (worker receive -> its first response). The engine's own
metrics pass through on the worker with ``dynamo_*``, ``model`` and ``worker_type`` labels and
are read by that engine's adapter.

``frontend_time_s`` = mean TTFT - mean transit - mean worker first response: tokenization,
routing, the router queue and streaming back, as means over one window (different requests
may finish in it). The front end and a worker are two scrape targets; their texts are read
together when both are in one capture or one Prometheus server.
"""

from __future__ import annotations

from diag.ground import stages as S
from diag.ground.metric_sources import Combine, CounterRate, EngineAdapter, Gauge, Histogram, SeriesMap

#: what to check next in Dynamo's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "frontend": "Dynamo: frontend replicas against the workers",
}

# --- /metrics -------------------------------------------------------------------------------

#: where the ``/metrics`` names were read, file @ commit (:data:`METRICS`' ``source``)
SOURCE = "ai-dynamo/dynamo lib/runtime/src/metrics/prometheus_names.rs @04070c75"
F = "dynamo_frontend_"
W = "dynamo_component_"

_TTFT = Histogram(F + "time_to_first_token_seconds")
_TRANSIT = Histogram(W + "network_transit_seconds")
_WORKER_TTFT = Histogram(W + "time_to_first_response_seconds")

#: the /metrics table: the front end's and workers' names onto the canonical series
METRICS = EngineAdapter(
    engine="dynamo",
    prefixes=(F, W),
    maps=(
        SeriesMap(S.SERIES_TTFT_S, (_TTFT,), note="front end: request received -> first token streamed"),
        SeriesMap(S.SERIES_ITL_S, (Histogram(F + "inter_token_latency_seconds"),)),
        SeriesMap(S.SERIES_E2E_S, (Histogram(F + "request_duration_seconds"),)),
        SeriesMap(S.SERIES_TOKENIZE_TIME_S, (Histogram(F + "tokenizer_latency_ms", (("operation", "tokenize"),),
                                                       scale=1e-3),), note="front-end tokenizer, per call"),
        SeriesMap(S.SERIES_DETOKENIZE_TIME_S, (Histogram(F + "tokenizer_latency_ms", (("operation", "detokenize"),),
                                                         scale=1e-3),), note="front-end detokenizer, per call"),
        SeriesMap(S.SERIES_WAITING, (Gauge(F + "router_queue_pending_requests"),),
                  note="waiting in the router's queue before a worker"),
        SeriesMap(S.SERIES_AWAITING_FIRST_TOKEN, (Gauge(F + "queued_requests"),),
                  note="front-end requests with no first response yet (router queue + engine queue + prefill)"),
        SeriesMap(S.SERIES_INFLIGHT, (Gauge(F + "inflight_requests"),)),
        SeriesMap(S.SERIES_PREFIX_CACHE_HIT_RATIO, (Histogram(F + "kv_hit_rate"), Gauge(F + "kv_hit_rate")),
                  note="the router's predicted KV hit rate at routing time"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_CACHED_PER_S, (CounterRate(F + "cached_tokens_sum"),),
                  note="Δ sum of the cached-tokens-per-request histogram / Δt"),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate(F + "input_sequence_tokens_sum"),)),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate(F + "output_tokens_total"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate(F + "time_to_first_token_seconds_count"),),
                  note="Δ TTFT histogram count / Δt"),
        SeriesMap(S.SERIES_TRANSIT_S, (_TRANSIT,), note="front end send -> worker receive"),
        SeriesMap(S.SERIES_WORKER_TTFT_S, (_WORKER_TTFT,), note="worker receive -> its first response"),
        SeriesMap(S.SERIES_FRONTEND_TIME_S, (Combine(((1.0, _TTFT), (-1.0, _TRANSIT), (-1.0, _WORKER_TTFT))),),
                  note="mean TTFT - mean transit - mean worker first response (tokenize, route, stream back)"),
    ),
    entity_labels=("model",),
    note="front end vs worker: frontend_time_s = TTFT - transit - worker first response (window means); "
    "tokenizer latency in ms; kv_hit_rate is the router's prediction; the engine's own metrics on the worker "
    "are read by its adapter",
    source=SOURCE,
)
