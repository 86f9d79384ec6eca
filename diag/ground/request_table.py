"""The request table: one row per request, joined across the client and server sides by trace id,
with its TTFT, stage durations (the decomposition), token counts and inter-token statistics.

:func:`request_table` builds it from a capture's span table (the bundled engine's and instrumented
engines' request roots, the probe's client spans, external engines' spans named in
:mod:`diag.ground.external_spans`); :func:`empty_request_table` has its columns and no rows. Durations are
seconds (``_s``), timestamps Unix ns (``_ns``); the columns are listed in :mod:`diag.ground.tables`.
Pure functions of DataFrames; any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diag.ground import external_spans, stages
from diag.ground.capture import attribute

#: nanoseconds per second
NS = 1e9


def numeric(s: pd.Series) -> pd.Series:
    """``s`` as numbers; what does not parse becomes NaN."""
    return pd.to_numeric(s, errors="coerce")


def _span_durations_s(spans: pd.DataFrame) -> pd.Series:
    dur = (spans["end_ns"].astype("int64") - spans["start_ns"].astype("int64")) / NS
    if stages.ATTR_DURATION_S in spans.columns:
        explicit = numeric(spans[stages.ATTR_DURATION_S])
        dur = explicit.where(explicit.notna(), dur)
    return dur


def in_own_server_traces(spans: pd.DataFrame) -> np.ndarray:
    """Rows whose trace has our server root span (stage names are ours only there).

    Works on integer trace codes (``pd.factorize``): ``isin`` on Arrow strings loops in Python.
    """
    codes, uniques = pd.factorize(spans["trace_id"])
    own = np.zeros(len(uniques), dtype=bool)
    own[codes[(spans["name"] == stages.SPAN_REQUEST).to_numpy()]] = True
    return own[codes]


def stage_durations(spans: pd.DataFrame, own: np.ndarray | None = None) -> pd.DataFrame:
    """Sum of each stage span's duration per trace: index trace_id, one column per stage
    (``own``: the in_own_server_traces mask, when the caller has it already).

    Only traces with our ``ttft.request`` root count: an external engine may name its own
    spans like ours (SGLang's ``tokenize``); its adapter maps those.
    """
    own = in_own_server_traces(spans) if own is None else own
    st = spans.loc[spans["name"].isin(stages.ALL_STAGES) & own]
    if st.empty:
        return pd.DataFrame(index=pd.Index([], name="trace_id", dtype=object))
    dur = _span_durations_s(st)
    codes, uniques = pd.factorize(st["trace_id"])
    stage = st["name"].astype(str).to_numpy() if not isinstance(st["name"].dtype, pd.CategoricalDtype) else st["name"].cat.remove_unused_categories()
    frame = pd.DataFrame({"t": codes, "stage": stage, "dur": dur.to_numpy()})
    pivot = frame.groupby(["t", "stage"], observed=True)["dur"].sum().unstack("stage")
    pivot.index = pd.Index(np.asarray(uniques, dtype=object)[pivot.index.to_numpy()], name="trace_id")
    pivot.columns = [stages.stage_column(str(c)) for c in pivot.columns]
    return pivot


def _itl_stats(token_times: pd.Series) -> pd.DataFrame:
    """ITL statistics (seconds) from per-request token-time arrays (Unix ns), vectorised.

    All arrays are concatenated once; gaps that cross a request boundary are dropped and the
    per-request statistics come from one grouped reduction.
    """
    cols = ["itl_p50_s", "itl_p99_s", "itl_max_s", "itl_mean_s", "n_token_times"]
    out = pd.DataFrame(np.nan, index=token_times.index, columns=cols)
    values = token_times.to_numpy()
    rows = np.flatnonzero([isinstance(tt, (list, tuple, np.ndarray)) and len(tt) > 0 for tt in values])
    if not len(rows):
        return out
    arrays = values[rows]
    try:
        flat = np.concatenate(arrays).astype("int64")
    except (TypeError, ValueError):  # a malformed array somewhere: take the careful way
        keep = []
        for i in rows:
            try:
                np.asarray(values[i], dtype="int64")
                keep.append(i)
            except (TypeError, ValueError):
                continue
        rows = np.asarray(keep, dtype="int64")
        if not len(rows):
            return out
        arrays = values[rows]
        flat = np.concatenate([np.asarray(a, dtype="int64") for a in arrays])
    lengths = np.fromiter(map(len, arrays), dtype="int64", count=len(arrays))
    out.iloc[rows, 4] = lengths
    gaps = np.diff(flat) / NS
    owner = np.repeat(np.arange(len(arrays)), lengths)
    same = owner[1:] == owner[:-1]
    if not same.any():
        return out
    g = pd.Series(gaps[same]).groupby(owner[1:][same])
    stats = pd.DataFrame({"itl_p50_s": g.median(), "itl_p99_s": g.quantile(0.99), "itl_max_s": g.max(), "itl_mean_s": g.mean()})
    target = np.asarray(rows)[stats.index.to_numpy()]
    out.iloc[target, 0:4] = stats.to_numpy()
    return out


def _roots(spans: pd.DataFrame, name: str) -> pd.DataFrame:
    rows = spans.loc[spans["name"] == name]
    return rows.drop_duplicates(subset=["trace_id"], keep="first")


def _attr(rows: pd.DataFrame, key: str) -> pd.Series:
    return attribute(rows, key)


def _server_rows(spans: pd.DataFrame) -> pd.DataFrame:
    rows = _roots(spans, stages.SPAN_REQUEST)
    if rows.empty:
        return pd.DataFrame()
    first = numeric(_attr(rows, stages.ATTR_FIRST_TOKEN_NS))
    start = rows["start_ns"].astype("int64")
    out = pd.DataFrame(
        {
            "trace_id": rows["trace_id"].astype(str).to_numpy(),
            "request_id": _attr(rows, stages.ATTR_REQUEST_ID).to_numpy(),
            "server_service": rows["service"].astype(str).to_numpy(),
            "server_start_ns": start.to_numpy(),
            "server_end_ns": rows["end_ns"].astype("int64").to_numpy(),
            "first_token_ns": first.to_numpy(),
            "server_ttft_s": ((first - start) / NS).to_numpy(),
            "server_e2e_s": ((rows["end_ns"].astype("int64") - start) / NS).to_numpy(),
            "input_tokens": numeric(_attr(rows, stages.GEN_AI_USAGE_INPUT_TOKENS)).to_numpy(),
            "output_tokens": numeric(_attr(rows, stages.GEN_AI_USAGE_OUTPUT_TOKENS)).to_numpy(),
            "preemptions": numeric(_attr(rows, stages.ATTR_PREEMPTIONS)).to_numpy(),
            "server_error": _attr(rows, stages.ATTR_ERROR).to_numpy(),
            "server_segment": _attr(rows, stages.ATTR_SEGMENT).to_numpy(),
            "tp_size": numeric(_attr(rows, stages.ATTR_TP_SIZE)).to_numpy(),
            "server_token_times": _attr(rows, stages.ATTR_TOKEN_TIMES_NS).to_numpy(),
            "engine": _attr(rows, stages.ATTR_ENGINE).fillna("bundled").to_numpy(),
            "cached_tokens": numeric(_attr(rows, stages.GEN_AI_USAGE_CACHED_TOKENS)).to_numpy(),
            "grammar_key": _attr(rows, stages.ATTR_GRAMMAR_KEY).to_numpy(),
            "grammar_cache_hit": _attr(rows, stages.ATTR_GRAMMAR_CACHE_HIT).to_numpy(),
            "grammar_wait_s": numeric(_attr(rows, stages.ATTR_GRAMMAR_WAIT_S)).to_numpy(),
            "pd_kv_bytes": numeric(_attr(rows, stages.ATTR_PD_KV_BYTES)).to_numpy(),
            "pd_decode_queue_s": numeric(_attr(rows, stages.ATTR_PD_DECODE_QUEUE_S)).to_numpy(),
            "pd_admission_wait_s": numeric(_attr(rows, stages.ATTR_PD_ADMISSION_WAIT_S)).to_numpy(),
            "pd_prefill_ttft_s": numeric(_attr(rows, stages.ATTR_PD_PREFILL_TTFT_S)).to_numpy(),
            "pd_decode_ttft_s": numeric(_attr(rows, stages.ATTR_PD_DECODE_TTFT_S)).to_numpy(),
            "lora_name": _attr(rows, stages.ATTR_LORA_NAME).to_numpy(),
            "lora_wait_s": numeric(_attr(rows, stages.ATTR_LORA_WAIT_S)).to_numpy(),
            "lora_load_s": numeric(_attr(rows, stages.ATTR_LORA_LOAD_S)).to_numpy(),
        }
    )
    return out


def _client_rows(spans: pd.DataFrame) -> pd.DataFrame:
    rows = _roots(spans, stages.SPAN_CLIENT_REQUEST)
    if rows.empty:
        return pd.DataFrame()
    cstart = numeric(_attr(rows, stages.ATTR_CLIENT_START_NS))
    cstart = cstart.where(cstart.notna(), rows["start_ns"].astype("int64"))
    first = numeric(_attr(rows, stages.ATTR_CLIENT_FIRST_CONTENT_NS))
    last = numeric(_attr(rows, stages.ATTR_CLIENT_LAST_NS))
    end = last.where(last.notna(), rows["end_ns"].astype("int64"))
    return pd.DataFrame(
        {
            "trace_id": rows["trace_id"].astype(str).to_numpy(),
            "client_request_id": _attr(rows, stages.ATTR_REQUEST_ID).to_numpy(),
            "client_service": rows["service"].astype(str).to_numpy(),
            "client_start_ns": cstart.to_numpy(),
            "client_sent_ns": numeric(_attr(rows, stages.ATTR_CLIENT_SENT_NS)).to_numpy(),
            "client_first_content_ns": first.to_numpy(),
            "client_ttft_s": ((first - cstart) / NS).to_numpy(),
            "client_e2e_s": ((end - cstart) / NS).to_numpy(),
            "client_input_tokens": numeric(_attr(rows, stages.GEN_AI_USAGE_INPUT_TOKENS)).to_numpy(),
            "client_output_tokens": numeric(_attr(rows, stages.GEN_AI_USAGE_OUTPUT_TOKENS)).to_numpy(),
            "slot_wait_s": numeric(_attr(rows, stages.ATTR_CLIENT_SLOT_WAIT_S)).to_numpy(),
            "client_error": _attr(rows, stages.ATTR_ERROR).to_numpy(),
            "client_segment": _attr(rows, stages.ATTR_SEGMENT).to_numpy(),
            "warmup": _attr(rows, stages.ATTR_WARMUP).fillna(False).astype(bool).to_numpy(),
            "client_token_times": _attr(rows, stages.ATTR_TOKEN_TIMES_NS).to_numpy(),
            "prefix_role": _attr(rows, stages.ATTR_CLIENT_PREFIX_ROLE).to_numpy(),
            "prefix_tokens": numeric(_attr(rows, stages.ATTR_CLIENT_PREFIX_TOKENS)).to_numpy(),
            "schema_role": _attr(rows, stages.ATTR_CLIENT_SCHEMA_ROLE).to_numpy(),
            "schema_key": _attr(rows, stages.ATTR_CLIENT_SCHEMA_KEY).to_numpy(),
            "lora": _attr(rows, stages.ATTR_CLIENT_LORA).to_numpy(),
            "lora_role": _attr(rows, stages.ATTR_CLIENT_LORA_ROLE).to_numpy(),
        }
    )


def _external_rows(spans: pd.DataFrame, notes: dict[str, str], own_traces: np.ndarray) -> pd.DataFrame:
    """Requests from external engines' spans (vLLM, SGLang, TGI), via :mod:`diag.ground.external_spans`."""
    own = spans["name"].isin(
        (stages.SPAN_REQUEST, stages.SPAN_CLIENT_REQUEST, stages.SPAN_ENGINE_STEP, stages.SPAN_COLD_START)
    ) | own_traces
    other = spans.loc[~own]
    if other.empty:
        return pd.DataFrame()
    table = other.copy()
    table["attributes"] = _attributes_dicts(other)
    try:
        ext = external_spans.adapt_spans_frame(table)
    except Exception:  # an adapter bug must not hide our own spans
        return pd.DataFrame()
    if ext is None or len(ext) == 0:
        return pd.DataFrame()
    present = set(ext["engine"].astype(str)) if "engine" in ext.columns else set()
    all_notes = external_spans.adapter_notes()
    notes.update({eng: note for eng, note in all_notes.items() if eng in present})
    ext = ext.copy()
    ext["trace_id"] = ext["trace_id"].astype(str)
    ext["server_start_ns"] = ext["start_ns"].astype("int64")
    ext["first_token_ns"] = ext["server_start_ns"] + (ext["server_ttft_s"] * NS)
    ext["server_e2e_s"] = ext["e2e_s"]
    return ext.drop(columns=["start_ns", "e2e_s"])


def _attributes_dicts(rows: pd.DataFrame) -> list[dict[str, Any]]:
    known = [c for c in rows.columns if c.startswith(("ttft.", "gen_ai."))]
    out = []
    extra = rows["extra"] if "extra" in rows.columns else None
    for i, (_, row) in enumerate(rows[known].iterrows()):
        d = {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and np.isnan(v))}
        if extra is not None and isinstance(extra.iloc[i], dict):
            d.update(extra.iloc[i])
        out.append(d)
    return out


def estimate_clock_offsets(req: pd.DataFrame) -> dict[str, float]:
    """Estimate server-minus-client clock offset (s) per (client, server) service pair.

    NTP-style: with t1 = client send, t2 = server start, t3 = server first token,
    t4 = client first content, offset = ((t2 - t1) + (t3 - t4)) / 2, median over requests.
    """
    need = ["client_sent_ns", "client_start_ns", "server_start_ns", "first_token_ns", "client_first_content_ns"]
    if any(c not in req.columns for c in need):
        return {}
    both = req.dropna(subset=["server_start_ns", "first_token_ns", "client_first_content_ns"])
    if both.empty:
        return {}
    t1 = both["client_sent_ns"].where(both["client_sent_ns"].notna(), both["client_start_ns"])
    theta = ((both["server_start_ns"] - t1) + (both["first_token_ns"] - both["client_first_content_ns"])) / 2 / NS
    key = both["client_service"].astype(str) + "->" + both["server_service"].astype(str)
    return {str(k): float(v) for k, v in theta.groupby(key).median().items()}


def request_table(spans: pd.DataFrame, warnings: list[str] | None = None, notes: dict[str, str] | None = None) -> tuple[pd.DataFrame, dict[str, float]]:
    """Build the request table from a span table; returns (requests, clock offsets in s)."""
    warnings = warnings if warnings is not None else []
    notes = notes if notes is not None else {}
    server = _server_rows(spans)
    client = _client_rows(spans)
    own_traces = in_own_server_traces(spans)  # once: factorizing 1M trace ids is not free
    ext = _external_rows(spans, notes, own_traces)
    if not ext.empty:
        server = pd.concat([server, ext], ignore_index=True) if not server.empty else ext
    if server.empty and client.empty:
        return empty_request_table(), {}
    if server.empty:
        req = client.copy()
    elif client.empty:
        req = server.copy()
    else:
        req = server.merge(client, on="trace_id", how="outer")
    for col in ("server_ttft_s", "client_ttft_s", "server_start_ns", "first_token_ns", "client_first_content_ns",
                "client_start_ns", "client_sent_ns", "input_tokens", "output_tokens", "server_e2e_s", "client_e2e_s",
                "slot_wait_s", "preemptions", "tp_size", "client_input_tokens", "client_output_tokens",
                "cached_tokens", "prefix_tokens", "grammar_wait_s", "pd_kv_bytes", "pd_decode_queue_s",
                "pd_admission_wait_s", "pd_prefill_ttft_s", "pd_decode_ttft_s", "lora_wait_s", "lora_load_s"):
        if col not in req.columns:
            req[col] = np.nan
        req[col] = pd.to_numeric(req[col], errors="coerce").astype("float64")
    for col in ("server_service", "client_service", "request_id", "client_request_id", "server_error", "client_error",
                "server_segment", "client_segment", "engine", "prefix_role", "schema_role", "schema_key", "lora", "lora_role",
                "grammar_key", "grammar_cache_hit", "lora_name"):
        if col not in req.columns:
            req[col] = None
    req["has_server"] = req["server_start_ns"].notna()
    req["has_client"] = req["client_start_ns"].notna()

    offsets = estimate_clock_offsets(req)
    # Correct only when the raw clocks contradict causality (server outside the client window).
    both = req["has_server"] & req["has_client"]
    if bool(both.any()) and offsets:
        key = req["client_service"].astype(str) + "->" + req["server_service"].astype(str)
        off_s = key.map(offsets).astype("float64")
        violates = both & (
            (req["server_start_ns"] < req["client_start_ns"]) | (req["first_token_ns"] > req["client_first_content_ns"])
        )
        if violates.mean() > 0.05:
            warnings.append(
                f"clock skew between client and server processes: server spans fall outside the client's window "
                f"on {int(violates.sum())} requests; shifted server times by the estimated offset "
                + ", ".join(f"{k}: {v * 1e3:+.3f} ms" for k, v in offsets.items())
            )
            shift = (off_s.fillna(0) * NS).where(both, 0)
            req["server_start_ns"] = req["server_start_ns"] - shift
            req["first_token_ns"] = req["first_token_ns"] - shift

    req["request_id"] = req["request_id"].where(req["request_id"].notna(), req["client_request_id"])
    req["error"] = req["client_error"].where(req["client_error"].notna(), req["server_error"])
    req["segment"] = req["client_segment"].where(req["client_segment"].notna(), req["server_segment"])
    if "warmup" not in req.columns:
        req["warmup"] = False
    req["warmup"] = req["warmup"].fillna(False).astype(bool)
    req["input_tokens"] = req["input_tokens"].where(req["input_tokens"].notna(), req["client_input_tokens"])
    req["output_tokens"] = req["output_tokens"].where(req["output_tokens"].notna(), req["client_output_tokens"])
    req["start_ns"] = req["client_start_ns"].where(req["has_client"], req["server_start_ns"])
    req["ttft_s"] = req["client_ttft_s"].where(req["client_ttft_s"].notna(), req["server_ttft_s"])
    req["e2e_s"] = req["client_e2e_s"].where(req["client_e2e_s"].notna(), req["server_e2e_s"])

    durs = stage_durations(spans, own_traces)
    if not durs.empty:
        durs.index = durs.index.astype(str)
        req = req.merge(durs, left_on="trace_id", right_index=True, how="left", suffixes=("", "_span"))
        for col in list(req.columns):
            if col.endswith("_span"):
                base = col[: -len("_span")]
                req[base] = req[base].where(req[base].notna(), req[col])
                req = req.drop(columns=[col])
    for st in stages.DECOMPOSITION_STAGES + (stages.DECODE,):
        col = stages.stage_column(st)
        if col not in req.columns:
            req[col] = np.nan
        req[col] = pd.to_numeric(req[col], errors="coerce").astype("float64")
    # comm is nested in prefill: report prefill exclusive of comm
    has_comm = req["comm_s"].notna() & req["prefill_s"].notna()
    req.loc[has_comm, "prefill_s"] = (req.loc[has_comm, "prefill_s"] - req.loc[has_comm, "comm_s"]).clip(lower=0)
    # network = client TTFT - server TTFT where both sides were seen
    req["network_s"] = req["network_s"].where(req["network_s"].notna(), (req["client_ttft_s"] - req["server_ttft_s"]).where(req["has_server"] & req["has_client"]))
    req = external_spans.fold_client_gap(req)  # vLLM: the gap holds its front end's tokenization, not network alone

    tt = req["client_token_times"] if "client_token_times" in req.columns else pd.Series([None] * len(req), index=req.index)
    if "server_token_times" in req.columns:
        tt = tt.where(tt.notna(), req["server_token_times"])
    req = pd.concat([req, _itl_stats(tt)], axis=1)
    n_out = req["output_tokens"].where(req["output_tokens"].notna(), req["n_token_times"])
    req["tpot_s"] = ((req["e2e_s"] - req["ttft_s"]) / (n_out - 1)).where(n_out > 1)
    drop = [c for c in ("client_token_times", "server_token_times", "client_input_tokens", "client_output_tokens",
                        "client_request_id", "client_segment", "server_segment") if c in req.columns]
    req = req.drop(columns=drop)
    req = req.sort_values("start_ns", kind="stable").reset_index(drop=True)
    return req, offsets


def empty_request_table() -> pd.DataFrame:
    cols = ["trace_id", "request_id", "segment", "warmup", "error", "start_ns", "server_ttft_s", "client_ttft_s",
            "ttft_s", "e2e_s", "input_tokens", "output_tokens", "has_server", "has_client"]
    cols += [stages.stage_column(s) for s in stages.DECOMPOSITION_STAGES]
    cols += ["itl_p50_s", "itl_p99_s", "itl_max_s", "itl_mean_s", "tpot_s", "n_token_times"]
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
