"""Theme: pipeline-parallel bubbles. How much of the engine's step time the pipeline's stages
spent idle, from the per-stage account on engine-step spans (the bundled engine's
``ttft.step.pp.*``: compute, send/recv and idle seconds per stage), the idle seconds on each
request's ``prefill`` span (``ttft.pp.bubble_s``), and TTFT per prompt token across the
parallel layouts a capture holds (PP against TP, or against one rank).

Units: shares 0..1 (idle stage-seconds / (stages x step seconds)); ``ttft_by_parallelism`` in
seconds (median TTFT per layout); ``pp_vs_tp_ttft_ratio`` a ratio of TTFT per prompt token.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.capture import attribute
from rules.features.context import FeatureContext
from rules.features.numeric import NS, num_col

_NO_PP = "no engine step carries a pipeline account (pipeline parallel off, or the engine does not time its stages)"
_STEP_NAMES = ("pp_size", "pp_bubble_share_of_prefill", "pp_bubble_share_of_steps", "pp_microbatches_p50",
               "pp_bubble_share_tail")


def _mean_of_array(v: object) -> float:
    """Mean of a per-stage array attribute (a list after OTLP JSON), NaN when absent or empty."""
    if v is None or isinstance(v, (str, bytes)):
        return float("nan")
    try:
        a = np.asarray(v, dtype="float64").ravel()
    except (TypeError, ValueError):
        return float("nan")
    return float(a.mean()) if a.size else float("nan")


def _pp_steps(ctx: FeatureContext) -> pd.DataFrame:
    """Engine steps with a pipeline account in the window: duration, prefill tokens, stages, micro-batches, mean idle."""
    sp = ctx.spans
    if sp is None or sp.empty or "name" not in sp.columns:
        return pd.DataFrame()
    rows = sp.loc[sp["name"].astype(str) == stages.SPAN_ENGINE_STEP]
    if rows.empty:
        return pd.DataFrame()
    bubble = attribute(rows, stages.ATTR_STEP_PP_BUBBLE_S).map(_mean_of_array)
    keep = bubble.notna()
    if not keep.any():
        return pd.DataFrame()
    rows, bubble = rows.loc[keep], bubble.loc[keep]
    start = rows["start_ns"].astype("int64")
    end = rows["end_ns"].astype("int64")
    out = pd.DataFrame({
        "start_ns": start.to_numpy(), "end_ns": end.to_numpy(), "duration_s": ((end - start) / NS).to_numpy(),
        "prefill_tokens": pd.to_numeric(attribute(rows, stages.ATTR_STEP_PREFILL_TOKENS), errors="coerce").to_numpy(),
        "pp_size": pd.to_numeric(attribute(rows, stages.ATTR_STEP_PP_SIZE), errors="coerce").to_numpy(),
        "microbatches": pd.to_numeric(attribute(rows, stages.ATTR_STEP_PP_MICROBATCHES), errors="coerce").to_numpy(),
        "bubble_s": bubble.to_numpy(dtype="float64"),
    })
    if ctx.window_ns is not None:
        a, b = ctx.window_ns
        out = out.loc[(out["end_ns"] > a) & (out["start_ns"] < b)]
    return out.reset_index(drop=True)


def _share(steps: pd.DataFrame) -> float | None:
    d = float(steps["duration_s"].sum())
    return float(min(1.0, steps["bubble_s"].sum() / d)) if d > 0 else None


def _request_attr(ctx: FeatureContext, span_name: str, key: str) -> pd.Series:
    """trace id -> the numeric attribute ``key`` of its ``span_name`` span (first one)."""
    sp = ctx.spans
    if sp is None or sp.empty or "name" not in sp.columns:
        return pd.Series(dtype="float64")
    rows = sp.loc[sp["name"].astype(str) == span_name]
    vals = pd.to_numeric(attribute(rows, key), errors="coerce")
    got = pd.Series(vals.to_numpy(), index=rows["trace_id"].astype(str).to_numpy()).dropna()
    return got[~got.index.duplicated()]


def pipeline(ctx: FeatureContext) -> None:
    """Bubble shares of prefill steps, of all steps and of the slowest TTFTs; the stage count and
    micro-batches; TTFT per prompt token by parallel layout."""
    steps = _pp_steps(ctx)
    if steps.empty:
        ctx.na(_STEP_NAMES, _NO_PP)
    else:
        pre = steps.loc[num_col(steps, "prefill_tokens") > 0]
        ctx.add("pp_size", float(steps["pp_size"].max()) if steps["pp_size"].notna().any() else None,
                None if steps["pp_size"].notna().any() else "steps do not carry the stage count")
        src = f"{len(pre)} prefill steps with a pipeline account"
        if len(pre):
            ctx.add("pp_bubble_share_of_prefill", _share(pre), source=src)
            mb = pre["microbatches"].dropna()
            ctx.add("pp_microbatches_p50", float(mb.median()) if len(mb) else None,
                    None if len(mb) else "steps do not carry their micro-batch count")
        else:
            ctx.na(("pp_bubble_share_of_prefill", "pp_microbatches_p50"), "no prefill step has a pipeline account")
        ctx.add("pp_bubble_share_of_steps", _share(steps), source=f"{len(steps)} steps")
        _tail_share(ctx)
    _by_layout(ctx)


def _tail_share(ctx: FeatureContext) -> None:
    """``pp_bubble_share_tail``: the prefill spans' idle seconds / TTFT over the slowest steady requests."""
    st = ctx.steady
    bubble = _request_attr(ctx, stages.PREFILL, stages.ATTR_PP_BUBBLE_S)
    if len(st) == 0 or bubble.empty or "trace_id" not in st.columns:
        ctx.na(("pp_bubble_share_tail",), "no request's prefill span carries its pipeline idle time")
        return
    ttft = num_col(st, "server_ttft_s").where(num_col(st, "server_ttft_s").notna(), num_col(st, "ttft_s"))
    b = st["trace_id"].astype(str).map(bubble)
    has = b.notna() & ttft.notna()
    if not has.any():
        ctx.na(("pp_bubble_share_tail",), "no steady request has a prefill span with pipeline idle time")
        return
    lo = float(np.nanquantile(ttft[has], float(ctx.params["tail_quantile"])))
    tail = has & (ttft >= lo)
    total = float(ttft[tail].sum())
    ctx.add("pp_bubble_share_tail", float(b[tail].sum() / total) if total > 0 else None,
            source=f"{int(tail.sum())} slowest requests' prefill spans")


def _by_layout(ctx: FeatureContext) -> None:
    """``ttft_by_parallelism`` (median TTFT by "pp=N" / "tp=N" / "1 rank") and ``pp_vs_tp_ttft_ratio``
    (TTFT per prompt token with PP > 1 over TP > 1, or over one rank when no TP run is there)."""
    names = ("ttft_by_parallelism", "pp_vs_tp_ttft_ratio")
    st = ctx.steady
    if len(st) == 0 or "trace_id" not in st.columns:
        ctx.na(names, "no completed requests")
        return
    pp = st["trace_id"].astype(str).map(_request_attr(ctx, stages.SPAN_REQUEST, stages.ATTR_PP_SIZE))
    tp = num_col(st, "tp_size")
    if not (pp > 1).any():
        ctx.na(names, "no request ran with pipeline parallel (ttft.pp.size > 1)")
        return
    layout = pd.Series([f"pp={p:g}" if p > 1 else f"tp={t:g}" if t > 1 else "1 rank"
                        for p, t in zip(pp.fillna(1), tp.fillna(1))], index=st.index)
    ttft = num_col(st, "ttft_s")
    tokens = num_col(st, "input_tokens")
    per_tok = (ttft / tokens).where(tokens > 0)
    by = {str(k): float(ttft[layout == k].median()) for k in sorted(layout.unique())}
    if len(by) < 2:
        ctx.add("ttft_by_parallelism", by)
        ctx.na(("pp_vs_tp_ttft_ratio",), "only pipeline-parallel requests in the capture; needs a TP or one-rank run to compare")
        return
    ctx.add("ttft_by_parallelism", by)
    other = (tp > 1) & ~(pp > 1)
    what = "TP"
    if not other.any():
        other, what = ~(pp > 1), "one rank"
    a, b = per_tok[pp > 1].median(), per_tok[other].median()
    ok = pd.notna(a) and pd.notna(b) and b > 0
    ctx.add("pp_vs_tp_ttft_ratio", float(a / b) if ok else None, None if ok else "TTFT per prompt token unknown",
            source=f"PP against {what}, median TTFT per prompt token")
