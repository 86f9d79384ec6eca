"""Span table -> request table, engine-step table, cold-start table, stage decomposition.

The request table is built in :mod:`diag.ground.request_table`; this module joins captures into
:class:`Tables` and derives the rest.

All durations are seconds (``_s``); timestamps are Unix ns (``_ns``). Vectorised with pandas;
the only per-row Python work is over requests (ITL statistics), never over all spans.

Request table columns (one row per trace that has a request root on either side):
``trace_id, request_id, segment, warmup, error, start_ns, server_start_ns, first_token_ns,
server_ttft_s, client_ttft_s, ttft_s, e2e_s, input_tokens, output_tokens, preemptions,
slot_wait_s, <stage>_s for stage in DECOMPOSITION_STAGES, itl_p50_s, itl_p99_s, itl_max_s,
itl_mean_s, tpot_s, n_token_times, has_server, has_client, engine``; and, from disaggregated
prefill/decode request roots (NaN otherwise), ``pd_kv_bytes``, ``pd_decode_queue_s`` (the part of
``queue_s`` spent on the decode side: KV received -> first token back), ``pd_admission_wait_s`` (of
that, the wait for the decode side's blocks and a running place), ``pd_prefill_ttft_s`` and
``pd_decode_ttft_s`` (each side's own TTFT); from requests for a LoRA adapter of the bundled engine,
``lora_name`` (None for a base-model request), ``lora_wait_s`` (the part of ``queue_s`` spent waiting
for an adapter slot) and ``lora_load_s`` (its adapter's load, inside ``prefill_s``).
``ttft_s`` is the client's TTFT when the client side is present, else the server's.
``prefill_s`` is exclusive of ``comm_s`` (comm is nested in prefill), so stage shares add up.
The step table's ``pd_side`` ("prefill" | "decode", None without P/D) tells the two step loops of a
disaggregated engine apart; ``waiting_lora_seqs``, ``loras`` and ``lora_load_s`` hold requests waiting
for a LoRA slot after the plan, distinct adapters in the batch and the seconds spent loading adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.capture import Capture, attribute
from diag.ground.request_table import NS, empty_request_table, numeric, request_table


@dataclass
class Tables:
    """The derived tables of one (or several joined) captures."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    cold_starts: pd.DataFrame
    spans: pd.DataFrame
    series: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    clock_offsets: dict[str, float] = field(default_factory=dict)
    lumped_notes: dict[str, str] = field(default_factory=dict)

    def window(self, window_ns: tuple[int, int] | None) -> Tables:
        """These tables cut to ``window_ns`` (Unix ns, half-open ``[lo, hi)``; None: all of them):
        requests that start in it, engine steps that overlap it (a step under way when the window
        opens is part of what its requests met), series samples taken in it. Spans, cold starts
        and meta are not cut. Sorted columns (``build_tables`` sorts by start) cost a binary
        search and a slice, not a scan. The one window filter: the rules' features and the TUI's
        window both use it."""
        if window_ns is None:
            return self
        lo, hi = window_ns
        return replace(self, requests=_starting_in(self.requests, "start_ns", lo, hi),
                       steps=_overlapping(self.steps, lo, hi),
                       series=_starting_in(self.series, "ts_s", lo / NS, hi / NS))


def _sorted(v: np.ndarray) -> bool:
    return len(v) < 2 or bool(np.all(v[1:] >= v[:-1]))  # False with a NaN: the mask path takes it


def _starting_in(df: pd.DataFrame | None, col: str, lo: float, hi: float) -> pd.DataFrame | None:
    """Rows of ``df`` whose ``col`` is in ``[lo, hi)``."""
    if df is None or not len(df) or col not in df.columns:
        return df
    v = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    if not _sorted(v):
        return df.loc[(v >= lo) & (v < hi)]
    a, b = np.searchsorted(v, [lo, hi], side="left")
    return df.iloc[int(a):int(b)]


def _overlapping(df: pd.DataFrame | None, lo: float, hi: float) -> pd.DataFrame | None:
    """Rows of ``df`` (``start_ns``, ``end_ns``) whose interval overlaps ``(lo, hi)``."""
    if df is None or not len(df) or "start_ns" not in df.columns:
        return df
    start = pd.to_numeric(df["start_ns"], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    end = pd.to_numeric(df["end_ns"], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    if not _sorted(start):
        return df.loc[(end > lo) & (start < hi)]
    b = int(np.searchsorted(start, hi, side="left"))
    keep = end[:b] > lo
    first = int(np.argmax(keep)) if keep.any() else b
    if keep[first:].all():
        return df.iloc[first:b]
    return df.iloc[:b].loc[keep]




STEP_ATTRS = {
    "step_index": stages.ATTR_STEP_INDEX,
    "prefill_tokens": stages.ATTR_STEP_PREFILL_TOKENS,
    "prefill_seqs": stages.ATTR_STEP_PREFILL_SEQS,
    "decode_seqs": stages.ATTR_STEP_DECODE_SEQS,
    "kv_usage_ratio": stages.ATTR_STEP_KV_USAGE,
    "comm_s": stages.ATTR_STEP_COMM_S,
    "waiting_seqs": stages.ATTR_STEP_WAITING,
    "running_seqs": stages.ATTR_STEP_RUNNING,
    "preempted_seqs": stages.ATTR_STEP_PREEMPTED,
    "waiting_kv_seqs": stages.ATTR_STEP_WAITING_KV,
    "waiting_hol_seqs": stages.ATTR_STEP_WAITING_HOL,
    "waiting_grammar_seqs": stages.ATTR_STEP_WAITING_GRAMMAR,
    "waiting_lora_seqs": stages.ATTR_STEP_WAITING_LORA,
    "loras": stages.ATTR_STEP_LORAS,
    "lora_load_s": stages.ATTR_STEP_LORA_LOAD_S,
}


def step_table(spans: pd.DataFrame) -> pd.DataFrame:
    """One row per engine step: start_ns, end_ns, duration_s and its batch make-up."""
    rows = spans.loc[spans["name"] == stages.SPAN_ENGINE_STEP]
    out = pd.DataFrame(
        {
            "start_ns": rows["start_ns"].astype("int64").to_numpy(),
            "end_ns": rows["end_ns"].astype("int64").to_numpy(),
            "service": rows["service"].astype(str).to_numpy(),
        }
    )
    out["duration_s"] = (out["end_ns"] - out["start_ns"]) / NS
    for col, key in STEP_ATTRS.items():
        out[col] = numeric(attribute(rows, key)).to_numpy() if len(rows) else pd.Series(dtype="float64")
    out["pd_side"] = attribute(rows, stages.ATTR_STEP_PD_SIDE).to_numpy() if len(rows) else pd.Series(dtype=object)
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def cold_start_table(spans: pd.DataFrame) -> pd.DataFrame:
    rows = spans.loc[spans["name"].isin([stages.SPAN_COLD_START, stages.COLD_START])]
    return pd.DataFrame(
        {
            "start_ns": rows["start_ns"].astype("int64").to_numpy(),
            "end_ns": rows["end_ns"].astype("int64").to_numpy(),
            "duration_s": ((rows["end_ns"].astype("int64") - rows["start_ns"].astype("int64")) / NS).to_numpy(),
            "phase": attribute(rows, stages.ATTR_COLD_START_PHASE).to_numpy(),
            "service": rows["service"].astype(str).to_numpy(),
        }
    )


def build_tables(captures: Capture | list[Capture]) -> Tables:
    """Join one or several captures (client and server) by trace id and derive the tables."""
    caps = captures if isinstance(captures, list) else [captures]
    warnings: list[str] = []
    for c in caps:
        warnings.extend(c.warnings)
    span_frames = [c.spans for c in caps if not c.spans.empty]
    if span_frames:
        spans = pd.concat(span_frames, ignore_index=True) if len(span_frames) > 1 else span_frames[0]
        for col in ("name", "service"):
            spans[col] = spans[col].astype(str).astype("category")
    else:
        from diag.ground.capture_spans import empty_span_table

        spans = empty_span_table()
    series_frames = [c.series for c in caps if not c.series.empty]
    series = pd.concat(series_frames, ignore_index=True) if series_frames else caps[0].series
    meta: dict[str, Any] = {}
    for c in caps:
        for k, v in c.meta.items():
            if isinstance(v, dict) and isinstance(meta.get(k), dict):
                meta[k] = {**meta[k], **v}
            else:
                meta.setdefault(k, v)
    notes: dict[str, str] = {}
    if spans.empty:
        req, offsets = empty_request_table(), {}
    else:
        req, offsets = request_table(spans, warnings, notes)
    steps = step_table(spans) if not spans.empty else step_table(spans.iloc[0:0]) if len(spans.columns) else pd.DataFrame()
    colds = cold_start_table(spans) if not spans.empty else pd.DataFrame(columns=["start_ns", "end_ns", "duration_s", "phase", "service"])
    return Tables(req, steps, colds, spans, series, meta, warnings, offsets, notes)


def stage_decomposition(req: pd.DataFrame) -> dict[str, Any]:
    """Per-stage TTFT decomposition: count, p50/p95/p99 (s) and share of TTFT.

    Share = sum of the stage over requests / sum of TTFT over the same requests (requests
    without a TTFT or with an error are left out). Warm-up requests are excluded.
    """
    ok = req
    if "warmup" in ok.columns:
        ok = ok.loc[~ok["warmup"].fillna(False).astype(bool)]
    if "error" in ok.columns:
        ok = ok.loc[ok["error"].isna()]
    ok = ok.loc[ok["ttft_s"].notna()]
    out: dict[str, Any] = {
        "requests": int(len(ok)),
        "ttft_s": describe(ok["ttft_s"]),
        "server_ttft_s": describe(ok["server_ttft_s"]) if "server_ttft_s" in ok else None,
        "client_ttft_s": describe(ok["client_ttft_s"]) if "client_ttft_s" in ok else None,
        "stages": {},
    }
    for st in stages.DECOMPOSITION_STAGES:
        col = stages.stage_column(st)
        if col not in ok.columns:
            continue
        vals = ok[col]
        have = vals.notna()
        if not bool(have.any()):
            continue
        denom = ok.loc[have, "ttft_s"].sum()
        out["stages"][st] = {
            **describe(vals),
            "share_of_ttft": float(vals[have].sum() / denom) if denom > 0 else None,
        }
    return out


#: the percentiles every latency summary reports
PCTS: tuple[tuple[str, float], ...] = (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99))


def describe(values: Any) -> dict[str, Any]:
    """count, p50/p90/p95/p99, max and mean of the finite values (None when there is none)."""
    v = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce").dropna(), dtype="float64")
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"count": 0, **{k: None for k, _ in PCTS}, "max": None, "mean": None}
    q = np.percentile(v, [p for _, p in PCTS])
    out: dict[str, Any] = {"count": int(v.size)}
    out.update({k: float(x) for (k, _), x in zip(PCTS, q)})
    out["max"] = float(v.max())
    out["mean"] = float(v.mean())
    return out
