"""Adapters from external engines' trace spans onto our stage model.

An external engine does not emit our ``tokenize``/``queue``/``prefill``/... child spans; it
emits its own. This module turns them into one row per request: our stage durations in
seconds, server TTFT, e2e, token counts, and the *lumped* stage (``diag.stages.LUMPED``) —
the part of server TTFT the engine cannot split, with a note saying what it contains.

Engines handled:

* **vLLM** — one span per finished request, ``llm_request`` (or, with
  ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``, ``"{operation} {model}"``
  carrying ``gen_ai.operation.name``), with ``gen_ai.latency.*`` float seconds
  (``vllm/v1/engine/output_processor.py`` ``do_tracing`` @d0782260; start = ``arrival_time``).
  Its TTFT starts *after* the API server applied the chat template and tokenized and ends
  *before* the first detokenize (see ``_VLLM_LUMPED_NOTE``): with a client capture joined,
  client TTFT - server TTFT holds those, and :func:`fold_client_gap` lumps it instead of
  calling it network. ``gen_ai.usage.cached_tokens`` (``vllm/tracing/utils.py`` @0bf3270f)
  is kept as ``cached_tokens``.
* **TGI** — the router's handler span (``generate``, ``generate_stream``, ...) with the fields
  ``total_time``/``validation_time``/``queue_time``/``inference_time``/``time_per_token`` as
  Rust ``Debug`` duration strings ("12.3ms", "850µs", "1.2s"; ``router/src/server.rs``
  @db931fcf L370-375, L612-616).
* **SGLang** — a span tree per request (``python/sglang/srt/observability/trace.py``
  @b8e5a7c3): a ``" Req <rid8>"`` root with attribute ``rid`` (and, in current builds,
  ``gen_ai.latency.time_to_first_token``/``e2e``/``time_in_model_*``: the root's TTFT is
  preferred), thread spans carrying ``host_id``/``pid``/``thread_label``, and one slice span
  per ``RequestStage``: ``tokenize``, ``dispatch``, ``prefill_waiting``, ``prefill_forward``,
  ``chunked_prefill``, ``decode_forward``/``decode_loop``, ... Older builds wrapped the root in
  a ``"Bootstrap Room 0x.."`` span (now a root attribute); it is still recognised. Only
  :func:`adapt_spans_frame` (which sees the whole trace) can adapt it.

Everything here is pure (no I/O, no threads); safe to call from any thread.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diag import stages

VLLM = "vllm"
TGI = "tgi"
SGLANG = "sglang"

# --- vLLM attribute keys (diag.stages holds the ones the request table also reads) ----------
VLLM_INFERENCE = "gen_ai.latency.time_in_model_inference"
_VLLM_LATENCY_PREFIX = "gen_ai.latency."
#: vLLM's TTFT starts at ``arrival_time``, set in ``InputProcessor.process_inputs``
#: (``vllm/v1/engine/input_processor.py`` @a1799180) after the OpenAI layer has applied the chat
#: template and tokenized, and ends at ``IterationStats.iteration_timestamp``, taken when the
#: output batch reaches the API server, before ``process_outputs`` detokenizes it
#: (``vllm/v1/metrics/stats.py`` @28ed1fb8, ``vllm/v1/engine/output_processor.py`` @d0782260).
#: Queue and prefill are engine-core intervals (first QUEUED -> first SCHEDULED -> first token).
_VLLM_LUMPED_NOTE = (
    "input processing after arrival + API server <-> engine core IPC + engine-core bookkeeping before QUEUED "
    "(= server TTFT - queue - prefill); tokenization, the chat template and the first detokenize are outside "
    "vLLM's TTFT"
)
#: What client TTFT - server TTFT holds for an engine whose TTFT starts after the front end's
#: tokenization: it is not network alone, so :func:`fold_client_gap` moves it into ``lumped``.
_VLLM_GAP_NOTE = (
    "with a client capture joined, lumped also holds client TTFT - server TTFT: network, HTTP, the API server's "
    "chat template and tokenization (before arrival_time) and the first detokenize (after TTFT's end); "
    "vLLM does not time them apart (split them with ttft instrument or a py-spy profile)"
)
#: engine -> what the client-server gap holds besides the network (engines whose server TTFT
#: starts after the front end has tokenized)
GAP_INCLUDES_FRONTEND: dict[str, str] = {VLLM: _VLLM_GAP_NOTE}

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
_TGI_FIELDS = (TGI_TOTAL, TGI_VALIDATION, TGI_QUEUE, TGI_INFERENCE, TGI_TIME_PER_TOKEN)

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
_SGLANG_UNIQUE = SGLANG_SLICE_NAMES - frozenset(stages.ALL_STAGES)
_SGLANG_ROOT_RE = re.compile(r"^\s*\w*\s*Req [0-9A-Za-z_-]{1,8}$")
_SGLANG_LUMPED_NOTE = (
    "tokenizer -> scheduler dispatch (IPC) + request_process + PD bootstrap/KV transfer + "
    "first detokenize (= server TTFT - tokenize - queue - prefill)"
)

_NOTES: dict[str, str] = {
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
#: vLLM span attribute: prompt tokens served from the prefix cache (``vllm/tracing/utils.py`` @0bf3270f)
VLLM_CACHED_TOKENS = "gen_ai.usage.cached_tokens"


def adapter_notes() -> dict[str, str]:
    """Per engine: which of our stages it cannot separate (shown next to its verdicts)."""
    return dict(_NOTES)


def fold_client_gap(req: pd.DataFrame) -> pd.DataFrame:
    """Requests of engines whose server TTFT starts after the front end's tokenization (vLLM):
    client TTFT - server TTFT is moved from ``network_s`` into ``lumped_s`` and said so.

    ``req`` is the joined request table (``engine``, ``network_s``, ``lumped_s``,
    ``lumped_note`` columns; any missing is left alone). Adds ``gap_includes_frontend`` (bool):
    True on the requests whose client-server gap holds tokenization and the first detokenize,
    so a rule about the network can leave them out. Returns ``req`` (changed in place).
    """
    if "engine" not in req.columns or "network_s" not in req.columns:
        return req
    eng = req["engine"].astype(object)
    hit = eng.isin(list(GAP_INCLUDES_FRONTEND)).to_numpy(dtype=bool)
    req["gap_includes_frontend"] = hit
    gap = pd.to_numeric(req["network_s"], errors="coerce")
    move = hit & gap.notna().to_numpy()
    if not move.any():
        return req
    lumped = pd.to_numeric(req["lumped_s"], errors="coerce") if "lumped_s" in req.columns else pd.Series(
        np.nan, index=req.index)
    req["lumped_s"] = lumped.where(~move, lumped.fillna(0.0) + gap.clip(lower=0.0))
    req.loc[move, "network_s"] = np.nan
    notes = req["lumped_note"].astype(object) if "lumped_note" in req.columns else pd.Series("", index=req.index)
    add = eng.map(GAP_INCLUDES_FRONTEND).fillna("")
    req["lumped_note"] = notes.where(~move, (notes.fillna("").astype(str) + "; " + add.astype(str)).str.lstrip("; "))
    return req


# --- Rust Debug durations ----------------------------------------------------------------------

_UNIT_S: dict[str, float] = {"ns": 1e-9, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s)\s*$")
_DURATION_PAT = r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s)\s*$"


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
    m = _DURATION_RE.match(value)
    if not m:
        return None
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _parse_duration_series(values: pd.Series) -> np.ndarray:
    """Vectorised :func:`parse_rust_duration_s` over an object Series (NaN where invalid)."""
    num = pd.to_numeric(values.where(values.map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))),
                        errors="coerce").to_numpy(dtype="float64")
    text = values.where(values.map(lambda v: isinstance(v, str))).astype("string")
    parts = text.str.extract(_DURATION_PAT)
    mag = pd.to_numeric(parts[0], errors="coerce").to_numpy(dtype="float64")
    unit = parts[1].map(_UNIT_S).to_numpy(dtype="float64", na_value=np.nan)
    out = np.where(np.isfinite(num), num, mag * unit)
    out[out < 0] = np.nan
    return out


# --- the per-request result -------------------------------------------------------------------


@dataclass
class AdaptedRequest:
    """One external request on our stage model. Durations in seconds; NaN = not given."""

    engine: str
    name: str
    start_ns: int
    end_ns: int
    #: our stage name -> seconds, only the stages the engine gives (e.g. queue, prefill, decode)
    stages_s: dict[str, float] = field(default_factory=dict)
    server_ttft_s: float = math.nan
    e2e_s: float = math.nan
    input_tokens: float = math.nan
    output_tokens: float = math.nan
    #: the lumped stage's name (``diag.stages.LUMPED``) or None when nothing is lumped
    lumped_stage: str | None = None
    lumped_s: float = math.nan
    #: what the lumped stage contains, in words
    lumped_note: str = ""
    inference_s: float = math.nan
    model: str = ""
    #: prompt tokens served from the prefix cache (vLLM ``gen_ai.usage.cached_tokens``)
    cached_tokens: float = math.nan


def _num(value: Any) -> float:
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _is_vllm(name: str, attributes: Mapping[str, Any]) -> bool:
    """vLLM's ``llm_request`` span, or its ``"{operation} {model}"`` span under
    ``gen_ai_latest_experimental``: ``gen_ai.operation.name`` plus ``gen_ai.latency.*`` and a
    vLLM-only key (queue time or prompt tokens), never an SGLang span (those carry ``rid``,
    ``thread_label`` or a ``Req`` root name, and SGLang also emits ``gen_ai.latency.*``)."""
    if name == stages.VLLM_SPAN_REQUEST:
        return True
    if stages.GEN_AI_OPERATION not in attributes:
        return False
    if not (stages.VLLM_TTFT in attributes or stages.VLLM_E2E in attributes):
        return False
    if "rid" in attributes or "thread_label" in attributes or _SGLANG_ROOT_RE.match(name):
        return False
    return stages.VLLM_QUEUE in attributes or stages.VLLM_PROMPT_TOKENS in attributes or \
        stages.GEN_AI_USAGE_INPUT_TOKENS in attributes


def _is_tgi(name: str, attributes: Mapping[str, Any]) -> bool:
    if TGI_TOTAL in attributes and (TGI_QUEUE in attributes or TGI_INFERENCE in attributes):
        return name in TGI_SPAN_NAMES or TGI_VALIDATION in attributes
    return False


def _is_sglang(name: str, attributes: Mapping[str, Any]) -> bool:
    if name in _SGLANG_UNIQUE:
        return True
    if name.startswith("Bootstrap Room "):
        return True
    if "rid" in attributes and _SGLANG_ROOT_RE.match(name):
        return True
    return "thread_label" in attributes and "pid" in attributes and "host_id" in attributes


def detect_engine(span_name: str, attributes: Mapping[str, Any]) -> str | None:
    """Which engine made this span: "vllm", "tgi", "sglang" or None (ours or unknown)."""
    attributes = attributes or {}
    if _is_vllm(span_name, attributes):
        return VLLM
    if _is_tgi(span_name, attributes):
        return TGI
    if _is_sglang(span_name, attributes):
        return SGLANG
    return None


def _first(attributes: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        v = attributes.get(k)
        if v is not None:
            return v
    return None


def _adapt_vllm(name: str, a: Mapping[str, Any], start_ns: int, end_ns: int) -> AdaptedRequest:
    ttft = _num(a.get(stages.VLLM_TTFT))
    queue = _num(a.get(stages.VLLM_QUEUE))
    prefill = _num(a.get(stages.VLLM_PREFILL))
    decode = _num(a.get(stages.VLLM_DECODE))
    e2e = _num(a.get(stages.VLLM_E2E))
    if math.isnan(e2e) and end_ns > start_ns:
        e2e = (end_ns - start_ns) / 1e9
    lumped = ttft - queue - prefill
    if lumped < 0:  # the two clocks disagree by less than the rounding: nothing is lumped
        lumped = 0.0
    st = {stages.QUEUE: queue, stages.PREFILL: prefill, stages.DECODE: decode}
    return AdaptedRequest(
        engine=VLLM,
        name=name,
        start_ns=int(start_ns),
        end_ns=int(end_ns),
        stages_s={k: v for k, v in st.items() if not math.isnan(v)},
        server_ttft_s=ttft,
        e2e_s=e2e,
        input_tokens=_num(_first(a, stages.VLLM_PROMPT_TOKENS, stages.GEN_AI_USAGE_INPUT_TOKENS)),
        output_tokens=_num(_first(a, stages.VLLM_COMPLETION_TOKENS, stages.GEN_AI_USAGE_OUTPUT_TOKENS)),
        lumped_stage=stages.LUMPED if not math.isnan(lumped) else None,
        lumped_s=lumped,
        lumped_note=_VLLM_LUMPED_NOTE,
        inference_s=_num(a.get(VLLM_INFERENCE)),
        model=str(_first(a, stages.GEN_AI_REQUEST_MODEL, "gen_ai.response.model") or ""),
        cached_tokens=_num(a.get(VLLM_CACHED_TOKENS)),
    )


def _adapt_tgi(name: str, a: Mapping[str, Any], start_ns: int, end_ns: int) -> AdaptedRequest:
    def d(key: str) -> float:
        v = parse_rust_duration_s(a.get(key))
        return math.nan if v is None else v

    total, validation, queue, inference, tpt = (d(k) for k in _TGI_FIELDS)
    out_tokens = round(inference / tpt) if tpt > 0 and not math.isnan(inference) else math.nan
    st = {stages.TOKENIZE: validation, stages.QUEUE: queue}
    return AdaptedRequest(
        engine=TGI,
        name=name,
        start_ns=int(start_ns),
        end_ns=int(end_ns),
        stages_s={k: v for k, v in st.items() if not math.isnan(v)},
        e2e_s=total,
        output_tokens=float(out_tokens),
        inference_s=inference,
        lumped_note="",
    )


def adapt_span(name: str, attributes: Mapping[str, Any], start_ns: int, end_ns: int) -> AdaptedRequest | None:
    """Adapt one engine request span (vLLM, TGI); None for other spans.

    SGLang needs the whole trace (its stages are separate spans): use :func:`adapt_spans_frame`.
    """
    attributes = attributes or {}
    engine = detect_engine(name, attributes)
    if engine == VLLM:
        return _adapt_vllm(name, attributes, start_ns, end_ns)
    if engine == TGI:
        return _adapt_tgi(name, attributes, start_ns, end_ns)
    return None


# --- vectorised over a span table ----------------------------------------------------------------


def _attr_getter(df: pd.DataFrame) -> Any:
    """A function key -> object ndarray of that attribute per row.

    Works with an ``attributes`` column (a dict per row) or with the capture loader's layout
    (known attributes as columns, the rest in an ``extra`` dict per row).
    """
    n = len(df)
    if "attributes" in df.columns:
        attrs = df["attributes"].tolist()

        def get(key: str) -> np.ndarray:
            return np.array([a.get(key) if isinstance(a, Mapping) else None for a in attrs], dtype=object)

        return get
    extra = df["extra"].tolist() if "extra" in df.columns else [None] * n

    def get_cols(key: str) -> np.ndarray:
        if key in df.columns:
            return df[key].to_numpy(dtype=object)
        return np.array([e.get(key) if isinstance(e, Mapping) else None for e in extra], dtype=object)

    return get_cols


def _as_float(values: np.ndarray) -> np.ndarray:
    return pd.to_numeric(pd.Series(values, dtype=object).where(
        pd.Series(values, dtype=object).map(lambda v: not isinstance(v, bool))), errors="coerce"
    ).to_numpy(dtype="float64")


def _empty_requests() -> pd.DataFrame:
    cols: dict[str, pd.Series] = {}
    for c in REQUEST_COLUMNS + EXTRA_COLUMNS:
        if c in ("trace_id", "engine", "lumped_note", "span_id", "model"):
            cols[c] = pd.Series(dtype=object)
        elif c == "start_ns":
            cols[c] = pd.Series(dtype="int64")
        else:
            cols[c] = pd.Series(dtype="float64")
    return pd.DataFrame(cols)


def _frame_vllm(df: pd.DataFrame, get: Any) -> pd.DataFrame:
    names = df["name"].astype(str).to_numpy()
    op = get(stages.GEN_AI_OPERATION)
    ttft_raw = get(stages.VLLM_TTFT)
    e2e_raw = get(stages.VLLM_E2E)
    has_op = np.array([v is not None for v in op])
    has_lat = np.array([v is not None for v in ttft_raw]) | np.array([v is not None for v in e2e_raw])
    present = [np.array([v is not None for v in get(k)]) for k in
               (stages.VLLM_QUEUE, stages.VLLM_PROMPT_TOKENS, stages.GEN_AI_USAGE_INPUT_TOKENS)]
    vllm_key = present[0] | present[1] | present[2]
    sglang_mark = (np.array([v is not None for v in get("rid")]) | np.array([v is not None for v in get("thread_label")])
                   | pd.Series(names).str.match(_SGLANG_ROOT_RE).to_numpy(dtype=bool))
    mask = (names == stages.VLLM_SPAN_REQUEST) | (has_op & has_lat & vllm_key & ~sglang_mark)
    if not mask.any():
        return _empty_requests()
    sub = df.loc[mask]

    def f(key: str) -> np.ndarray:
        return _as_float(get(key)[mask])

    ttft, queue, prefill = f(stages.VLLM_TTFT), f(stages.VLLM_QUEUE), f(stages.VLLM_PREFILL)
    e2e = f(stages.VLLM_E2E)
    start = sub["start_ns"].to_numpy(dtype="int64")
    end = sub["end_ns"].to_numpy(dtype="int64")
    e2e = np.where(np.isnan(e2e) & (end > start), (end - start) / 1e9, e2e)
    lumped = np.maximum(ttft - queue - prefill, 0.0)  # NaN stays NaN
    inp = f(stages.VLLM_PROMPT_TOKENS)
    inp = np.where(np.isnan(inp), f(stages.GEN_AI_USAGE_INPUT_TOKENS), inp)
    out = f(stages.VLLM_COMPLETION_TOKENS)
    out = np.where(np.isnan(out), f(stages.GEN_AI_USAGE_OUTPUT_TOKENS), out)
    model = get(stages.GEN_AI_REQUEST_MODEL)[mask]
    return pd.DataFrame({
        "trace_id": sub["trace_id"].astype(str).to_numpy(),
        "engine": VLLM,
        "start_ns": start,
        "server_ttft_s": ttft,
        "e2e_s": e2e,
        "input_tokens": inp,
        "output_tokens": out,
        "queue_s": queue,
        "prefill_s": prefill,
        "tokenize_s": np.nan,
        "decode_s": f(stages.VLLM_DECODE),
        "lumped_s": lumped,
        "lumped_note": np.where(np.isnan(lumped), "", _VLLM_LUMPED_NOTE),
        "span_id": sub["span_id"].astype(str).to_numpy(),
        "model": np.array(["" if v is None else str(v) for v in model], dtype=object),
        "inference_s": f(VLLM_INFERENCE),
        "cached_tokens": f(VLLM_CACHED_TOKENS),
    })


def _frame_tgi(df: pd.DataFrame, get: Any) -> pd.DataFrame:
    total_raw = get(TGI_TOTAL)
    has_total = np.array([v is not None for v in total_raw])
    if not has_total.any():
        return _empty_requests()
    names = df["name"].astype(str).to_numpy()
    has_q = np.array([v is not None for v in get(TGI_QUEUE)]) | np.array([v is not None for v in get(TGI_INFERENCE)])
    has_v = np.array([v is not None for v in get(TGI_VALIDATION)])
    mask = has_total & has_q & (np.isin(names, list(TGI_SPAN_NAMES)) | has_v)
    if not mask.any():
        return _empty_requests()
    sub = df.loc[mask]

    def d(key: str) -> np.ndarray:
        return _parse_duration_series(pd.Series(get(key)[mask], dtype=object))

    total, validation, queue, inference, tpt = (d(k) for k in _TGI_FIELDS)
    with np.errstate(divide="ignore", invalid="ignore"):
        out_tokens = np.where(tpt > 0, np.round(inference / tpt), np.nan)
    return pd.DataFrame({
        "trace_id": sub["trace_id"].astype(str).to_numpy(),
        "engine": TGI,
        "start_ns": sub["start_ns"].to_numpy(dtype="int64"),
        "server_ttft_s": np.nan,
        "e2e_s": total,
        "input_tokens": np.nan,
        "output_tokens": out_tokens,
        "queue_s": queue,
        "prefill_s": np.nan,
        "tokenize_s": validation,
        "decode_s": np.nan,
        "lumped_s": np.nan,
        "lumped_note": "",
        "span_id": sub["span_id"].astype(str).to_numpy(),
        "model": "",
        "inference_s": inference,
        "cached_tokens": np.nan,
    })


def _frame_sglang(df: pd.DataFrame, get: Any) -> pd.DataFrame:
    names = df["name"].astype(str)
    rid = get("rid")
    has_rid = np.array([v is not None for v in rid])
    is_root = has_rid & names.str.match(_SGLANG_ROOT_RE).to_numpy(dtype=bool)
    if not is_root.any():
        return _empty_requests()
    sg_traces = set(df.loc[is_root, "trace_id"].astype(str))
    trace = df["trace_id"].astype(str)
    in_trace = trace.isin(sg_traces).to_numpy()
    is_slice = names.isin(SGLANG_SLICE_NAMES).to_numpy() & in_trace
    start = df["start_ns"].to_numpy(dtype="int64")
    end = df["end_ns"].to_numpy(dtype="int64")

    roots = pd.DataFrame({
        "trace_id": trace[is_root].to_numpy(),
        "start_ns": start[is_root],
        "end_ns": end[is_root],
        "span_id": df.loc[is_root, "span_id"].astype(str).to_numpy(),
    }).groupby("trace_id", sort=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"),
                                            span_id=("span_id", "first"))

    # A chunked_prefill slice nested inside a prefill_forward slice is not counted twice.
    span_ids = df["span_id"].astype(str).to_numpy()
    parents = df["parent_span_id"].astype(str).to_numpy()
    prefill_forward_ids = set(span_ids[is_slice & (names.to_numpy() == "prefill_forward")])
    nested = np.array([p in prefill_forward_ids for p in parents]) & (names.to_numpy() == "chunked_prefill")
    sl = pd.DataFrame({
        "trace_id": trace[is_slice & ~nested].to_numpy(),
        "name": names[is_slice & ~nested].to_numpy(),
        "dur_s": (end[is_slice & ~nested] - start[is_slice & ~nested]) / 1e9,
        "end_ns": end[is_slice & ~nested],
    })
    dur = sl.pivot_table(index="trace_id", columns="name", values="dur_s", aggfunc="sum")
    dur = dur.reindex(index=roots.index)

    def total(names_: tuple[str, ...]) -> np.ndarray:
        cols = [c for c in names_ if c in dur.columns]
        if not cols:
            return np.full(len(roots), np.nan)
        return dur[cols].sum(axis=1, min_count=1).to_numpy(dtype="float64")

    tokenize, queue, prefill, decode = (total(x) for x in (SGLANG_TOKENIZE, SGLANG_QUEUE, SGLANG_PREFILL, SGLANG_DECODE))
    pf = sl[sl["name"].isin(SGLANG_PREFILL)]
    first_token_ns = pf.groupby("trace_id")["end_ns"].max().reindex(roots.index).to_numpy(dtype="float64")
    root_start = roots["start_ns"].to_numpy(dtype="int64")
    ttft = (first_token_ns - root_start) / 1e9
    # prefer the root's own TTFT (tokenizer manager's clock, detokenizer hop included)
    root_ttft = pd.Series(_as_float(get(stages.VLLM_TTFT)[is_root]), index=trace[is_root].to_numpy())
    root_ttft = root_ttft.groupby(level=0).max().reindex(roots.index).to_numpy(dtype="float64")
    ttft = np.where(np.isfinite(root_ttft), root_ttft, ttft)
    known = np.nan_to_num(tokenize) + np.nan_to_num(queue) + np.nan_to_num(prefill)
    lumped = np.maximum(ttft - known, 0.0)
    return pd.DataFrame({
        "trace_id": roots.index.to_numpy(dtype=object),
        "engine": SGLANG,
        "start_ns": root_start,
        "server_ttft_s": ttft,
        "e2e_s": (roots["end_ns"].to_numpy(dtype="int64") - root_start) / 1e9,
        "input_tokens": np.nan,
        "output_tokens": np.nan,
        "queue_s": queue,
        "prefill_s": prefill,
        "tokenize_s": tokenize,
        "decode_s": decode,
        "lumped_s": lumped,
        "lumped_note": np.where(np.isnan(lumped), "", _SGLANG_LUMPED_NOTE),
        "span_id": roots["span_id"].to_numpy(dtype=object),
        "model": "",
        "inference_s": np.nan,
        "cached_tokens": np.nan,
    })


def adapt_spans_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Request rows (REQUEST_COLUMNS + EXTRA_COLUMNS) for every engine request in a span table.

    ``df`` needs ``trace_id, span_id, parent_span_id, name, start_ns, end_ns`` and either an
    ``attributes`` column (a dict per row) or the capture loader's attribute columns plus
    ``extra``. Durations are seconds, NaN where the engine does not give a stage; rows are
    sorted by start_ns. Spans of no known engine (ours included) give no rows.
    """
    if df is None or len(df) == 0:
        return _empty_requests()
    df = df.reset_index(drop=True)
    get = _attr_getter(df)
    parts = [p for p in (_frame_vllm(df, get), _frame_tgi(df, get), _frame_sglang(df, get)) if len(p)]
    if not parts:
        return _empty_requests()
    out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    out = out.loc[:, list(REQUEST_COLUMNS + EXTRA_COLUMNS)]
    for c in ("server_ttft_s", "e2e_s", "input_tokens", "output_tokens", "queue_s", "prefill_s",
              "tokenize_s", "decode_s", "lumped_s", "inference_s", "cached_tokens"):
        out[c] = out[c].astype("float64")
    out["start_ns"] = out["start_ns"].astype("int64")
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)
