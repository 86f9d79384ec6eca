"""Vectorised adapters over a whole span table: one request row per external engine request.

Works on the capture loader's span table (or any frame with an ``attributes`` column); the only
per-row Python work is reading attributes. Names and notes come from
:mod:`diag.ground.external_engines`; :mod:`diag.ground.external_spans` is the front door. Pure; any thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.external import sglang, tgi, vllm
from diag.ground.external_engines import EXTRA_COLUMNS, REQUEST_COLUMNS, parse_duration_series


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
                   | pd.Series(names).str.match(sglang.ROOT_RE).to_numpy(dtype=bool))
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
        "engine": vllm.NAME,
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
        "lumped_note": np.where(np.isnan(lumped), "", vllm.LUMPED_NOTE),
        "span_id": sub["span_id"].astype(str).to_numpy(),
        "model": np.array(["" if v is None else str(v) for v in model], dtype=object),
        "inference_s": f(vllm.INFERENCE),
        "cached_tokens": f(vllm.CACHED_TOKENS),
    })


def _frame_tgi(df: pd.DataFrame, get: Any) -> pd.DataFrame:
    total_raw = get(tgi.TOTAL)
    has_total = np.array([v is not None for v in total_raw])
    if not has_total.any():
        return _empty_requests()
    names = df["name"].astype(str).to_numpy()
    has_q = np.array([v is not None for v in get(tgi.QUEUE)]) | np.array([v is not None for v in get(tgi.INFERENCE)])
    has_v = np.array([v is not None for v in get(tgi.VALIDATION)])
    mask = has_total & has_q & (np.isin(names, list(tgi.SPAN_NAMES)) | has_v)
    if not mask.any():
        return _empty_requests()
    sub = df.loc[mask]

    def d(key: str) -> np.ndarray:
        return parse_duration_series(pd.Series(get(key)[mask], dtype=object))

    total, validation, queue, inference, tpt = (d(k) for k in tgi.FIELDS)
    with np.errstate(divide="ignore", invalid="ignore"):
        out_tokens = np.where(tpt > 0, np.round(inference / tpt), np.nan)
    return pd.DataFrame({
        "trace_id": sub["trace_id"].astype(str).to_numpy(),
        "engine": tgi.NAME,
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
    is_root = has_rid & names.str.match(sglang.ROOT_RE).to_numpy(dtype=bool)
    if not is_root.any():
        return _empty_requests()
    sg_traces = set(df.loc[is_root, "trace_id"].astype(str))
    trace = df["trace_id"].astype(str)
    in_trace = trace.isin(sg_traces).to_numpy()
    is_slice = names.isin(sglang.SLICE_NAMES).to_numpy() & in_trace
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

    tokenize, queue, prefill, decode = (total(x) for x in (sglang.TOKENIZE, sglang.QUEUE, sglang.PREFILL, sglang.DECODE))
    pf = sl[sl["name"].isin(sglang.PREFILL)]
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
        "engine": sglang.NAME,
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
        "lumped_note": np.where(np.isnan(lumped), "", sglang.LUMPED_NOTE),
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
