"""The one source of truth for stage names, span names, attribute keys and the TTFT boundary.

Every collector, the engine, the capture loader, the rules and the TUI import names from here.
Attribute keys follow the OpenTelemetry GenAI semantic conventions where one exists
(``gen_ai.*``) and use a ``ttft.`` prefix otherwise. Times on spans are Unix epoch
nanoseconds (OpenTelemetry's own convention); every derived duration in tables is seconds
and carries an ``_s`` suffix.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- stages ---------------------------------------------------------------------------------

TOKENIZE = "tokenize"
QUEUE = "queue"
PREFILL = "prefill"
COMM = "comm"
SAMPLE = "sample"
#: disaggregated prefill/decode: the request's KV (and first token) moving from the prefill side
#: to the decode side (bundled engine: ``diag.bundled_engine.pd``)
KV_TRANSFER = "kv_transfer"
DETOKENIZE = "detokenize"
DECODE = "decode"
NETWORK = "network"
COLD_START = "cold_start"
#: A stage an external engine cannot separate (e.g. vLLM's TTFT - queue - prefill, which is
#: tokenize + IPC + first detokenize). Rules treat it as one lumped stage.
LUMPED = "lumped"

#: Server-side stages that make up server TTFT, in request order. ``comm`` is *nested inside*
#: ``prefill`` (the all-reduces of the prefill forward passes); tables report ``prefill_s``
#: exclusive of comm so that the shares add up to TTFT. ``kv_transfer`` comes after ``sample``:
#: under disaggregated prefill/decode the prefill side samples the first token and it travels
#: with the KV; the decode side's admission wait is a second ``queue`` span
#: (``ATTR_PD_SIDE="decode"``), so ``queue_s`` holds both sides' waits and the columns still add up.
TTFT_STAGES: tuple[str, ...] = (TOKENIZE, QUEUE, PREFILL, COMM, SAMPLE, KV_TRANSFER, DETOKENIZE)
#: Stages shown in decompositions (server stages, the lumped remainder, then the client's gap).
DECOMPOSITION_STAGES: tuple[str, ...] = TTFT_STAGES + (LUMPED, NETWORK)
#: Everything that can be a stage span name.
ALL_STAGES: tuple[str, ...] = TTFT_STAGES + (DECODE, NETWORK, COLD_START, LUMPED)

STAGE_DESCRIPTIONS: dict[str, str] = {
    TOKENIZE: "prompt text -> token ids on the serving CPU (incl. chat template)",
    QUEUE: "waiting for the scheduler: admission, KV-cache blocks, a place in a batch (with disaggregated "
    "prefill/decode: on either side)",
    PREFILL: "forward passes over the prompt tokens (exclusive of comm)",
    COMM: "multi-GPU communication inside the prefill passes: tensor-parallel all-reduces, pipeline send/recv",
    SAMPLE: "last-position logits -> first token (temperature, top-k, top-p)",
    KV_TRANSFER: "disaggregated prefill/decode: the prompt's KV moving from the prefill side to the decode side",
    DETOKENIZE: "first token id -> text, ready to be written to the stream",
    DECODE: "one token per step after the first (reported as ITL, not TTFT)",
    NETWORK: "client TTFT - server TTFT: network, serialization, HTTP, client parsing",
    COLD_START: "model load, warm-up, first compile: start-up cost, never TTFT",
    LUMPED: "stages the engine does not separate (see the adapter's note)",
}

# --- CPU-profile stages (py-spy samples of a serving process; see collectors.pyspy) ---------
#: The request stages reuse the names above; these hold what a profile adds.
CPU_SCHEDULER = "scheduler"  # batch planning, KV-block allocation, engine-loop bookkeeping
CPU_SERIALIZATION = "serialization"  # json / msgspec / pickle / protobuf / pydantic
CPU_HTTP = "http"  # HTTP server, request handling, socket transports
CPU_FORWARD = "forward"  # model forward: Python side of the passes, launch overhead
CPU_IDLE = "idle"  # blocked in select/poll/queue.get/Condition.wait/...
CPU_OTHER = "other"  # no rule matched any frame
CPU_STAGES: tuple[str, ...] = (TOKENIZE, CPU_SCHEDULER, CPU_SERIALIZATION, CPU_HTTP, CPU_FORWARD, COMM, SAMPLE,
                               DETOKENIZE, CPU_IDLE, CPU_OTHER)

# --- span names -----------------------------------------------------------------------------

SPAN_REQUEST = "ttft.request"  # server-side root of one request
SPAN_CLIENT_REQUEST = "ttft.client.request"  # client-side root (probe); parent of the server's
SPAN_ENGINE_STEP = "ttft.engine.step"  # one forward over a batch
SPAN_COLD_START = "ttft.cold_start"  # model load / warm-up, outside any request
STAGE_SPAN_NAMES = frozenset(ALL_STAGES)

# --- attribute keys: OpenTelemetry GenAI semantic conventions -------------------------------

#: who serves the request, as the GenAI semantic conventions name it (the probe: ``openai``, the
#: API it speaks; the bundled engine: ``ttft-diag``); GEN_AI_SYSTEM is its deprecated name, sent beside it
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
#: prompt tokens served from a prefix cache (vLLM's name: vllm/tracing/utils.py @0bf3270f)
GEN_AI_USAGE_CACHED_TOKENS = "gen_ai.usage.cached_tokens"

# --- attribute keys: ttft.* (ours) ----------------------------------------------------------

ATTR_SIDE = "ttft.side"  # "server" | "client"
ATTR_REQUEST_ID = "ttft.request.id"
#: Unix ns of each emitted token (server: when its text was ready; client: when its chunk
#: arrived). One int array on the request span, never one span per token.
ATTR_TOKEN_TIMES_NS = "ttft.token_times_ns"
ATTR_FIRST_TOKEN_NS = "ttft.first_token_ns"  # Unix ns: the TTFT end boundary on this side
ATTR_ERROR = "ttft.error"  # error kind, e.g. "http_503", "timeout", "disconnect"
ATTR_SEGMENT = "ttft.segment"  # a labelled sweep point / workload phase
#: segments ``long=N``: ttft diagnose's long ramp, N in flight at a long prompt (a designed
#: experiment, kept out of the steady population and read by the ``long_ramp_*`` features)
SEGMENT_LONG_RAMP = "long"
#: segments ``longout=N``: ttft diagnose's long prompt again with N-token answers (kept out of the
#: steady population, read by the ``long_out_*`` features)
SEGMENT_LONG_OUT = "longout"
#: segments ``mixed=N``: ttft diagnose's mixed follow-up, N-token prompts among short streams (kept
#: out of the steady population, read by the head-of-line and interference features)
SEGMENT_MIXED = "mixed"
#: segments ``grammar=R`` / ``lora=C``: ttft diagnose's structured-output and LoRA follow-ups (kept out of
#: the steady population, read by the grammar and LoRA features)
SEGMENT_GRAMMAR = "grammar"
SEGMENT_LORA = "lora"
ATTR_WARMUP = "ttft.warmup"  # bool: excluded from results
ATTR_PREEMPTIONS = "ttft.preemptions"  # int: times this request was preempted
#: bool, on a ``queue`` span: a wait after preemption (re-queued for recompute), not the first
ATTR_REQUEUE = "ttft.requeue"
ATTR_TP_SIZE = "ttft.tp.size"
ATTR_PROMPT_TEXT = "ttft.prompt.text"  # only when the user asks for prompt recording
ATTR_DURATION_S = "ttft.duration_s"  # explicit stage duration when it differs from the span's
ATTR_ENGINE = "ttft.engine"  # which engine produced the spans: "bundled", "vllm", ...
#: seconds a request waited in the server's front end before the engine saw it (bundled server,
#: diag.bundled_engine.frontend): inside server TTFT, before the ``tokenize`` span, in no stage span;
#: the total and its two parts (for an HTTP worker, then for a tokenizer thread)
ATTR_FRONTEND_WAIT_S = "ttft.frontend.wait_s"
ATTR_FRONTEND_HTTP_WAIT_S = "ttft.frontend.http_wait_s"
ATTR_FRONTEND_TOKENIZER_WAIT_S = "ttft.frontend.tokenizer_wait_s"

# client-side timestamps (Unix ns) on SPAN_CLIENT_REQUEST
ATTR_CLIENT_START_NS = "ttft.client.start_ns"  # just before connect / send: TTFT start
ATTR_CLIENT_CONNECTED_NS = "ttft.client.connected_ns"
ATTR_CLIENT_SENT_NS = "ttft.client.sent_ns"
ATTR_CLIENT_HEADERS_NS = "ttft.client.headers_ns"
ATTR_CLIENT_FIRST_EVENT_NS = "ttft.client.first_event_ns"  # any SSE event, role-only included
ATTR_CLIENT_FIRST_CONTENT_NS = "ttft.client.first_content_ns"  # first non-empty content: TTFT end
ATTR_CLIENT_LAST_NS = "ttft.client.last_ns"
ATTR_CLIENT_SLOT_WAIT_S = "ttft.client.slot_wait_s"  # waited for a free client slot (not in TTFT)
ATTR_CLIENT_SCHEDULED_NS = "ttft.client.scheduled_ns"  # when the load schedule wanted it sent
ATTR_CLIENT_USAGE_SOURCE = "ttft.client.usage_source"  # "server" | "tokenizer" | "chunks"
ATTR_CLIENT_HTTP_STATUS = "ttft.client.http_status"
ATTR_CLIENT_CONN_WAIT_S = "ttft.client.conn_wait_s"  # waited for a pooled connection (s)
ATTR_CLIENT_CONN_REUSED = "ttft.client.conn_reused"  # bool: keep-alive connection reused
ATTR_CLIENT_CONTENT_CHUNKS = "ttft.client.content_chunks"  # SSE events with content
ATTR_CLIENT_FIRST_ANSWER_NS = "ttft.client.first_answer_ns"  # first non-reasoning content
ATTR_CLIENT_API = "ttft.client.api"  # "completions" | "chat"
ATTR_CLIENT_INPUT_TOKENS_EST = "ttft.client.input_tokens_est"  # prompt length as built
#: the probe's deliberate shared prefix (--shared-prefix N[:R]): its length in this prompt
#: (tokens, 0 for a control) and the prompt's role: "first" use, "repeat" or "control"
ATTR_CLIENT_PREFIX_TOKENS = "ttft.client.prefix_tokens"
ATTR_CLIENT_PREFIX_ROLE = "ttft.client.prefix_role"
#: the probe's structured-output design (--response-format schema[:fresh|repeat]): a short hash
#: of the JSON schema sent (never the schema) and its role: "first" (this schema's first use in
#: the capture) or "repeat"
ATTR_CLIENT_SCHEMA_KEY = "ttft.client.schema_key"
ATTR_CLIENT_SCHEMA_ROLE = "ttft.client.schema_role"
#: the probe's LoRA design (--lora A,B,...): the adapter this request asked for (the request's model)
#: and, at its send, the adapters of the requests then in flight: "alone" (none in flight), "joins"
#: (its own adapter among them) or "other" (only other adapters in flight)
ATTR_CLIENT_LORA = "ttft.client.lora"
ATTR_CLIENT_LORA_ROLE = "ttft.client.lora_role"

# engine-step attributes on SPAN_ENGINE_STEP
ATTR_STEP_INDEX = "ttft.step.index"
ATTR_STEP_PREFILL_TOKENS = "ttft.step.prefill_tokens"
ATTR_STEP_PREFILL_SEQS = "ttft.step.prefill_seqs"
ATTR_STEP_DECODE_SEQS = "ttft.step.decode_seqs"
ATTR_STEP_KV_USAGE = "ttft.step.kv_usage_ratio"  # 0..1 after the step
ATTR_STEP_COMM_S = "ttft.step.comm_s"  # seconds in collectives during the step
ATTR_STEP_WAITING = "ttft.step.waiting_seqs"
ATTR_STEP_RUNNING = "ttft.step.running_seqs"
ATTR_STEP_PREEMPTED = "ttft.step.preempted_seqs"
ATTR_STEP_WAITING_KV = "ttft.step.waiting_kv_blocks"  # waiting after the plan because its next chunk needs more free KV blocks
ATTR_STEP_WAITING_HOL = "ttft.step.waiting_head_of_line"  # ... because it waits behind a head that does not fit (fcfs)
#: pipeline parallel (bundled engine, diag.bundled_engine.pp): stages, micro-batches of the step, and
#: per stage (arrays, index = stage) its compute, send/recv and idle ("bubble") seconds within
#: stage 0's step window; ``ttft.step.comm_s`` then holds send/recv seconds averaged over stages
ATTR_STEP_PP_SIZE = "ttft.step.pp.size"
ATTR_STEP_PP_MICROBATCHES = "ttft.step.pp.microbatches"
ATTR_STEP_PP_COMPUTE_S = "ttft.step.pp.compute_s"
ATTR_STEP_PP_COMM_S = "ttft.step.pp.comm_s"
ATTR_STEP_PP_BUBBLE_S = "ttft.step.pp.bubble_s"
#: on a request root: pipeline stages; on its ``prefill`` span: seconds of its prefill steps the
#: pipeline idled (each step's bubble averaged over stages, summed over the request's steps)
ATTR_PP_SIZE = "ttft.pp.size"
ATTR_PP_BUBBLE_S = "ttft.pp.bubble_s"

#: structured output (bundled engine): on a request root, a short hash of its grammar's source
#: (the JSON schema; never the schema), whether the engine's grammar cache held it, and the
#: seconds the request waited for its grammar before it could be scheduled (inside ``queue``,
#: 0 on a cache hit); on SPAN_ENGINE_STEP, requests waiting for their grammar after the plan
ATTR_GRAMMAR_KEY = "ttft.grammar.key"
ATTR_GRAMMAR_CACHE_HIT = "ttft.grammar.cache_hit"
ATTR_GRAMMAR_WAIT_S = "ttft.grammar.wait_s"
ATTR_STEP_WAITING_GRAMMAR = "ttft.step.waiting_grammar"

#: LoRA adapters (bundled engine, diag.bundled_engine.lora_manager). On a request root: the adapter it asked
#: for (its ``model``; absent for a base-model request), the seconds it was passed over waiting for an
#: adapter slot (inside ``queue``; 0 when it never waited) and the seconds of its adapter's load into a
#: slot when its admission needed one (inside ``prefill``: the load runs in the step before the forward;
#: 0 when the adapter was in a slot already). On SPAN_ENGINE_STEP: requests still waiting for a slot
#: after the plan, distinct adapters in the step's batch, and seconds the step spent loading adapters
ATTR_LORA_NAME = "ttft.lora.name"
ATTR_LORA_WAIT_S = "ttft.lora.wait_s"
ATTR_LORA_LOAD_S = "ttft.lora.load_s"
ATTR_STEP_WAITING_LORA = "ttft.step.waiting_lora"
ATTR_STEP_LORAS = "ttft.step.loras"
ATTR_STEP_LORA_LOAD_S = "ttft.step.lora_load_s"

#: disaggregated prefill/decode (bundled engine, diag.bundled_engine.pd). On a request root: served by a
#: prefill side and a decode worker (bool), the KV bytes sent for it, the seconds of its
#: ``kv_transfer`` span, the seconds of its decode-side ``queue`` span (KV received -> first token
#: back at the front end) and, inside them, its wait for admission (KV received -> blocks and a
#: running place taken), and each side's own TTFT as that instance reports it (prefill: arrival ->
#: first token sampled, before the transfer; decode: the prefill side's hand-off -> the first
#: token's text; the two add up to server TTFT). On ``queue`` spans and SPAN_ENGINE_STEP: which
#: side ("prefill" | "decode")
ATTR_PD_DISAGGREGATED = "ttft.pd.disaggregated"
ATTR_PD_KV_BYTES = "ttft.pd.kv_bytes"
ATTR_PD_KV_TRANSFER_S = "ttft.pd.kv_transfer_s"
ATTR_PD_DECODE_QUEUE_S = "ttft.pd.decode_queue_s"
ATTR_PD_ADMISSION_WAIT_S = "ttft.pd.admission_wait_s"
ATTR_PD_PREFILL_TTFT_S = "ttft.pd.prefill_ttft_s"
ATTR_PD_DECODE_TTFT_S = "ttft.pd.decode_ttft_s"
ATTR_PD_SIDE = "ttft.pd.side"
ATTR_STEP_PD_SIDE = "ttft.step.pd_side"
PD_SIDE_PREFILL = "prefill"
PD_SIDE_DECODE = "decode"

# cold-start attributes
ATTR_COLD_START_PHASE = "ttft.cold_start.phase"  # "load" | "warmup" | "compile"

# --- external engines (mapped by collectors' adapters) --------------------------------------

VLLM_SPAN_REQUEST = "llm_request"
VLLM_TTFT = "gen_ai.latency.time_to_first_token"
VLLM_E2E = "gen_ai.latency.e2e"
VLLM_QUEUE = "gen_ai.latency.time_in_queue"
VLLM_PREFILL = "gen_ai.latency.time_in_model_prefill"
VLLM_DECODE = "gen_ai.latency.time_in_model_decode"
VLLM_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
VLLM_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"


# --- the TTFT boundary ----------------------------------------------------------------------


@dataclass(frozen=True)
class TTFTBoundary:
    """Where one side's TTFT measurement starts and ends; written into every capture."""

    side: str
    start: str
    end: str
    includes: tuple[str, ...]
    excludes: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "side": self.side,
            "start": self.start,
            "end": self.end,
            "includes": list(self.includes),
            "excludes": list(self.excludes),
        }


SERVER_BOUNDARY = TTFTBoundary(
    side="server",
    start="the HTTP handler has the parsed request body (request span start)",
    end="the first token's text is detokenized and handed to the response stream",
    includes=TTFT_STAGES,
    excludes=(NETWORK, COLD_START, DECODE),
)
CLIENT_BOUNDARY = TTFTBoundary(
    side="client",
    start="just before the client opens/takes a connection and sends the request "
    "(time spent waiting for a free client slot is reported apart, not in TTFT)",
    end="the first SSE event whose choices carry non-empty text/content; role-only, "
    "empty and usage-only chunks do not count",
    includes=TTFT_STAGES + (NETWORK,),
    excludes=(COLD_START, DECODE),
)


def stage_column(stage: str) -> str:
    """The request-table column holding a stage's duration in seconds."""
    return f"{stage}_s"


STAGE_COLUMNS: tuple[str, ...] = tuple(stage_column(s) for s in DECOMPOSITION_STAGES)


# --- time series (long format, one file per source under <capture>/series/) -----------------
#: Columns of every time-series table: Unix seconds, source ("nvml", "prometheus", "engine",
#: "client"), canonical series name, entity ("gpu0", "gpu0/nvlink3", a replica URL, or ""),
#: and the value in the unit the series name states.
SERIES_COLUMNS: tuple[str, ...] = ("ts_s", "source", "series", "entity", "value")

# engine-level canonical series (from /metrics of any engine, via the adapters)
SERIES_QUEUE_TIME_S = "queue_time_s"  # windowed mean of the engine's queue-time histogram
SERIES_PREFILL_TIME_S = "prefill_time_s"
SERIES_DECODE_TIME_S = "decode_time_s"
SERIES_TTFT_S = "ttft_s"
SERIES_ITL_S = "itl_s"
SERIES_E2E_S = "e2e_s"
SERIES_KV_USAGE = "kv_usage_ratio"  # 0..1
SERIES_WAITING = "num_waiting"
SERIES_RUNNING = "num_running"
SERIES_PREEMPTIONS = "preemptions_total"  # cumulative count
SERIES_PREEMPTIONS_PER_S = "preemptions_per_s"
SERIES_PAUSED = "num_paused"  # TRT-LLM's paused requests (a gauge, not preemptions)
SERIES_PROMPT_TOKENS_PER_S = "prompt_tokens_per_s"
SERIES_GENERATION_TOKENS_PER_S = "generation_tokens_per_s"
#: requests per second that reached their first token (Δ count of the engine's TTFT or queue
#: histogram / Δt); windowed means of the series above are weighted by it
SERIES_REQUESTS_PER_S = "requests_per_s"
#: seconds of prompt processing per wall-clock second (Δ prompt seconds / Δt). Summed over
#: slots or sequences by some engines (llama.cpp), so it can exceed 1 with parallel slots.
SERIES_PREFILL_BUSY = "prefill_busy_ratio"
SERIES_DECODE_BUSY = "decode_busy_ratio"  # the same for token generation (Δ generation s / Δt)
SERIES_PREFILL_S_PER_TOKEN = "prefill_s_per_token"  # Δ prompt seconds / Δ prompt tokens (s/token)
# prompt work and caches (tokens, not blocks; see docs/engines.md for what each engine counts)
SERIES_PROMPT_TOKENS_COMPUTED_PER_S = "prompt_tokens_computed_per_s"  # prompt tokens the engine computed
SERIES_PROMPT_TOKENS_CACHED_PER_S = "prompt_tokens_cached_per_s"  # prompt tokens served from a prefix cache
SERIES_PROMPT_TOKENS_TRANSFERRED_PER_S = "prompt_tokens_transferred_per_s"  # KV received from elsewhere
SERIES_PREFIX_CACHE_HIT_RATIO = "prefix_cache_hit_ratio"  # 0..1, hit tokens / queried tokens in the window
SERIES_PREFILL_COMPUTED_TOKENS = "prefill_computed_tokens"  # mean prompt tokens computed per request
SERIES_ITERATION_TOKENS = "iteration_tokens"  # mean tokens per engine step (budget saturation)
SERIES_BUSY_SLOTS_PER_DECODE = "busy_slots_per_decode"  # llama.cpp: mean busy slots per llama_decode()
SERIES_WAITING_CAPACITY = "num_waiting_capacity"  # waiting, not deferred: any capacity (vLLM reason="capacity")
SERIES_WAITING_DEFERRED = "num_waiting_deferred"  # waiting on LoRA / KV transfer (vLLM reason="deferred")
#: 1 where the engine's gauges were not refreshed in the window (SGLang sets them only while
#: it logs stats: idle, they freeze) and its gauge rows were left out; 0 where they were fresh
SERIES_GAUGES_STALE = "gauges_stale"
#: disaggregated prefill/decode: seconds per KV transfer between the instances (vLLM's NIXL
#: connector ``nixl_xfer_time_seconds``, the bundled engine's ``kv_transfer_time_seconds``)
SERIES_KV_TRANSFER_S = "kv_transfer_s"
#: the entity label of each instance's own series under disaggregation (``role=prefill``, ``role=decode``)
ENTITY_ROLE_PREFILL = "role=prefill"
ENTITY_ROLE_DECODE = "role=decode"
# a front end before the engine (NVIDIA Dynamo): its own split of TTFT
SERIES_TOKENIZE_TIME_S = "tokenize_time_s"  # windowed mean tokenizer latency per call
SERIES_DETOKENIZE_TIME_S = "detokenize_time_s"
SERIES_INFLIGHT = "num_inflight"  # requests the front end has sent to engines and not finished
SERIES_AWAITING_FIRST_TOKEN = "num_awaiting_first_token"  # front-end requests without a first response
SERIES_TRANSIT_S = "transit_s"  # front end send -> worker receive (mean, wall clocks of two processes)
SERIES_WORKER_TTFT_S = "worker_ttft_s"  # worker receive -> its first response (mean)
SERIES_FRONTEND_TIME_S = "frontend_time_s"  # mean TTFT - mean transit - mean worker first response

# GPU canonical series (NVML)
SERIES_GPU_UTIL_PCT = "gpu_util_pct"
SERIES_MEM_UTIL_PCT = "mem_util_pct"  # memory-controller duty cycle, not bandwidth share
SERIES_HBM_USED_BYTES = "hbm_used_bytes"
SERIES_HBM_TOTAL_BYTES = "hbm_total_bytes"
SERIES_NVLINK_TX_BYTES_PER_S = "nvlink_tx_bytes_per_s"
SERIES_NVLINK_RX_BYTES_PER_S = "nvlink_rx_bytes_per_s"
SERIES_PCIE_TX_BYTES_PER_S = "pcie_tx_bytes_per_s"
SERIES_PCIE_RX_BYTES_PER_S = "pcie_rx_bytes_per_s"
SERIES_SM_CLOCK_MHZ = "sm_clock_mhz"
SERIES_POWER_W = "power_w"
SERIES_TEMPERATURE_C = "temperature_c"
SERIES_CLOCK_EVENT_REASONS = "clock_event_reasons"  # bitmask as float
SERIES_DRAM_BW_UTIL_PCT = "dram_bw_util_pct"  # GPM, Hopper+
SERIES_SM_UTIL_PCT = "sm_util_pct"  # GPM
SERIES_TENSOR_UTIL_PCT = "tensor_util_pct"  # GPM

# client-health series (probe)
SERIES_LOOP_LAG_S = "client_loop_lag_s"
SERIES_CLIENT_CPU_PCT = "client_cpu_pct"
SERIES_LOOP_STARVED_S = "client_loop_starved_s"  # the part of a lag sample the machine caused (Linux run-queue wait)
