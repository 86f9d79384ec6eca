"""Adapters from external engines' trace spans onto our stage model.

An external engine does not emit our ``tokenize``/``queue``/``prefill``/... child spans; it
emits its own. This module turns them into one row per request: our stage durations in
seconds, server TTFT, e2e, token counts, and the *lumped* stage (``diag.ground.stages.LUMPED``) —
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
  is kept as ``cached_tokens``. A running vLLM 0.32.0 (``tests/thirdparty/test_vllm_instrument.py``)
  emits ``llm_request`` with every latency and usage key read here, but not
  ``cached_tokens``, the model or the semconv span (newer sources): those stay NaN/absent; its
  start-up spans ("Overall Loading", ...) are not requests and are left alone.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.external import sglang, tgi, vllm
from diag.ground.external_engines import (EXTRA_COLUMNS, GAP_INCLUDES_FRONTEND, NOTES, REQUEST_COLUMNS,  # noqa: F401
                                   parse_rust_duration_s)
from diag.ground.external_engines import parse_duration_series as _parse_duration_series  # noqa: F401
from diag.ground.external_rows import adapt_spans_frame  # noqa: F401  (the vectorised entry, re-exported)


def adapter_notes() -> dict[str, str]:
    """Per engine: which of our stages it cannot separate (shown next to its verdicts)."""
    return dict(NOTES)


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
    #: the lumped stage's name (``diag.ground.stages.LUMPED``) or None when nothing is lumped
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
    if "rid" in attributes or "thread_label" in attributes or sglang.ROOT_RE.match(name):
        return False
    return stages.VLLM_QUEUE in attributes or stages.VLLM_PROMPT_TOKENS in attributes or \
        stages.GEN_AI_USAGE_INPUT_TOKENS in attributes


def _is_tgi(name: str, attributes: Mapping[str, Any]) -> bool:
    if tgi.TOTAL in attributes and (tgi.QUEUE in attributes or tgi.INFERENCE in attributes):
        return name in tgi.SPAN_NAMES or tgi.VALIDATION in attributes
    return False


def _is_sglang(name: str, attributes: Mapping[str, Any]) -> bool:
    if name in sglang.UNIQUE:
        return True
    if name.startswith("Bootstrap Room "):
        return True
    if "rid" in attributes and sglang.ROOT_RE.match(name):
        return True
    return "thread_label" in attributes and "pid" in attributes and "host_id" in attributes


def detect_engine(span_name: str, attributes: Mapping[str, Any]) -> str | None:
    """Which engine made this span: "vllm", "tgi", "sglang" or None (ours or unknown)."""
    attributes = attributes or {}
    if _is_vllm(span_name, attributes):
        return vllm.NAME
    if _is_tgi(span_name, attributes):
        return tgi.NAME
    if _is_sglang(span_name, attributes):
        return sglang.NAME
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
        engine=vllm.NAME,
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
        lumped_note=vllm.LUMPED_NOTE,
        inference_s=_num(a.get(vllm.INFERENCE)),
        model=str(_first(a, stages.GEN_AI_REQUEST_MODEL, "gen_ai.response.model") or ""),
        cached_tokens=_num(a.get(vllm.CACHED_TOKENS)),
    )


def _adapt_tgi(name: str, a: Mapping[str, Any], start_ns: int, end_ns: int) -> AdaptedRequest:
    def d(key: str) -> float:
        v = parse_rust_duration_s(a.get(key))
        return math.nan if v is None else v

    total, validation, queue, inference, tpt = (d(k) for k in tgi.FIELDS)
    out_tokens = round(inference / tpt) if tpt > 0 and not math.isnan(inference) else math.nan
    st = {stages.TOKENIZE: validation, stages.QUEUE: queue}
    return AdaptedRequest(
        engine=tgi.NAME,
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
    if engine == vllm.NAME:
        return _adapt_vllm(name, attributes, start_ns, end_ns)
    if engine == tgi.NAME:
        return _adapt_tgi(name, attributes, start_ns, end_ns)
    return None
