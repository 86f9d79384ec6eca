"""What each external engine's spans carry: span names, attribute keys, TTFT boundaries.

The names and the notes (what each engine's lumped stage holds, what its client-server gap
holds) used by :mod:`diag.external_spans`, with the file and commit each was read from (the
table is ``docs/engines.md``); TGI's Rust ``Debug`` duration strings are parsed here too.
Pure; safe from any thread.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd

from diag import stages

VLLM = "vllm"
TGI = "tgi"
SGLANG = "sglang"

# --- vLLM attribute keys (diag.stages holds the ones the request table also reads) ----------
VLLM_INFERENCE = "gen_ai.latency.time_in_model_inference"
VLLM_LATENCY_PREFIX = "gen_ai.latency."
#: vLLM's TTFT starts at ``arrival_time``, set in ``InputProcessor.process_inputs``
#: (``vllm/v1/engine/input_processor.py`` @a1799180) after the OpenAI layer has applied the chat
#: template and tokenized, and ends at ``IterationStats.iteration_timestamp``, taken when the
#: output batch reaches the API server, before ``process_outputs`` detokenizes it
#: (``vllm/v1/metrics/stats.py`` @28ed1fb8, ``vllm/v1/engine/output_processor.py`` @d0782260).
#: Queue and prefill are engine-core intervals (first QUEUED -> first SCHEDULED -> first token).
VLLM_LUMPED_NOTE = (
    "input processing after arrival + API server <-> engine core IPC + engine-core bookkeeping before QUEUED "
    "(= server TTFT - queue - prefill); tokenization, the chat template and the first detokenize are outside "
    "vLLM's TTFT"
)
#: What client TTFT - server TTFT holds for an engine whose TTFT starts after the front end's
#: tokenization: it is not network alone, so :func:`fold_client_gap` moves it into ``lumped``.
VLLM_GAP_NOTE = (
    "with a client capture joined, lumped also holds client TTFT - server TTFT: network, HTTP, the API server's "
    "chat template and tokenization (before arrival_time) and the first detokenize (after TTFT's end); "
    "vLLM does not time them apart (split them with ttft instrument or a py-spy profile)"
)
#: engine -> what the client-server gap holds besides the network (engines whose server TTFT
#: starts after the front end has tokenized)
GAP_INCLUDES_FRONTEND: dict[str, str] = {VLLM: VLLM_GAP_NOTE}

# --- TGI span fields (Rust Debug durations) -------------------------------------------------
TGI_TOTAL = "total_time"
TGI_VALIDATION = "validation_time"
TGI_QUEUE = "queue_time"
TGI_INFERENCE = "inference_time"
TGI_TIME_PER_TOKEN = "time_per_token"
#: Router handler spans that carry the timing fields (tracing's span name = the function name).
TGI_SPAN_NAMES = frozenset(
    {"generate", "generate_stream", "generate_internal", "generate_stream_internal",
     "compat_generate", "completions", "chat_completions"}
)
TGI_FIELDS = (TGI_TOTAL, TGI_VALIDATION, TGI_QUEUE, TGI_INFERENCE, TGI_TIME_PER_TOKEN)

# --- SGLang slice names (sglang RequestStage.stage_name) -------------------------------------
SGLANG_TOKENIZE = ("tokenize",)
SGLANG_QUEUE = ("prefill_waiting",)
SGLANG_PREFILL = ("prefill_forward", "chunked_prefill")
SGLANG_DECODE = ("decode_loop",)
SGLANG_OTHER = (
    "decode_forward", "dispatch", "api_server_dispatch", "dc_dispatch", "dpc_dispatch", "request_process",
    "prefill_prepare", "prefill_bootstrap", "prefill_transfer_kv_cache", "decode_prepare",
    "decode_bootstrap", "decode_waiting", "decode_transferred", "fake_output", "quick_finish",
    "mini_lb_launch", "wait_pd_finish",
)
SGLANG_SLICE_NAMES = frozenset(SGLANG_TOKENIZE + SGLANG_QUEUE + SGLANG_PREFILL + SGLANG_DECODE + SGLANG_OTHER)
#: Slice names only SGLang uses (``tokenize`` is also ours, so alone it proves nothing).
SGLANG_UNIQUE = SGLANG_SLICE_NAMES - frozenset(stages.ALL_STAGES)
SGLANG_ROOT_RE = re.compile(r"^\s*\w*\s*Req [0-9A-Za-z_-]{1,8}$")
SGLANG_LUMPED_NOTE = (
    "tokenizer -> scheduler dispatch (IPC) + request_process + PD bootstrap/KV transfer + "
    "first detokenize (= server TTFT - tokenize - queue - prefill)"
)

NOTES: dict[str, str] = {
    VLLM: "vLLM separates queue, prefill and decode (engine-core clock). Its TTFT (API server clock) starts "
    "after the chat template and tokenization and ends before the first detokenize, so lumped (TTFT - queue - "
    "prefill) is input processing + IPC + engine-core bookkeeping; tokenization and the first detokenize land "
    "in client TTFT - server TTFT, which is therefore lumped too when a client capture is joined, not called "
    "network. No tokenize/comm/sample/detokenize spans.",
    TGI: "TGI gives validation (incl. tokenization, reported as tokenize), queue and inference; "
    "inference is prefill + decode together, so prefill, decode and server TTFT are not "
    "separable (NaN); output tokens are inference_time / time_per_token.",
    SGLANG: "SGLang slices give tokenize, queue (prefill_waiting), prefill (prefill_forward over all chunks + "
    "chunked_prefill outside it) and decode (decode_loop); dispatch IPC, request processing, PD transfer "
    "and the first detokenize are lumped. Server TTFT is the root span's gen_ai.latency.time_to_first_token "
    "(the tokenizer manager's clock) when present, else the end of the last prefill slice minus the root's "
    "start (the scheduler's clock: it misses the detokenizer hop); token counts are not on the spans.",
}
#: Columns of the request rows :func:`adapt_spans_frame` returns (all durations seconds).
REQUEST_COLUMNS: tuple[str, ...] = (
    "trace_id", "engine", "start_ns", "server_ttft_s", "e2e_s", "input_tokens", "output_tokens",
    "queue_s", "prefill_s", "tokenize_s", "decode_s", "lumped_s", "lumped_note",
)
#: Extra columns after REQUEST_COLUMNS: the engine span's id, the model and the inference time
#: (prefill + decode) where the engine reports it.
EXTRA_COLUMNS: tuple[str, ...] = ("span_id", "model", "inference_s", "cached_tokens")
#: vLLM span attribute: prompt tokens served from the prefix cache (``vllm/tracing/utils.py`` @0bf3270f;
#: not emitted by vLLM 0.32.0)
VLLM_CACHED_TOKENS = "gen_ai.usage.cached_tokens"


# --- Rust Debug durations ----------------------------------------------------------------------

UNIT_S: dict[str, float] = {"ns": 1e-9, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s)\s*$")
DURATION_PAT = r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s)\s*$"


def parse_rust_duration_s(value: Any) -> float | None:
    """A Rust ``Debug`` duration ("12.3ms", "1.2s", "850µs", "3.1µs", "12ns") in seconds.

    Numbers are taken as seconds already. Anything else (None, "", "12 parsecs", negative)
    gives None.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
        return v if math.isfinite(v) and v >= 0 else None
    if not isinstance(value, str):
        return None
    m = DURATION_RE.match(value)
    if not m:
        return None
    return float(m.group(1)) * UNIT_S[m.group(2)]


def parse_duration_series(values: pd.Series) -> np.ndarray:
    """Vectorised :func:`parse_rust_duration_s` over an object Series (NaN where invalid)."""
    num = pd.to_numeric(values.where(values.map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))),
                        errors="coerce").to_numpy(dtype="float64")
    text = values.where(values.map(lambda v: isinstance(v, str))).astype("string")
    parts = text.str.extract(DURATION_PAT)
    mag = pd.to_numeric(parts[0], errors="coerce").to_numpy(dtype="float64")
    unit = parts[1].map(UNIT_S).to_numpy(dtype="float64", na_value=np.nan)
    out = np.where(np.isfinite(num), num, mag * unit)
    out[out < 0] = np.nan
    return out
