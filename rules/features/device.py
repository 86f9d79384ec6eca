"""Theme: the device and its memory. Busy fraction (NVML, else engine steps; writes ``ctx.busy``),
busy while requests queued, step times, KV-cache usage and preemptions, queue depth, tensor-parallel
communication and degree, and the serving process's CPU profile by stage.
Units: shares 0..1, seconds, counts, requests.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import NS, Coverage, as_float, num_col, name_is, segment_numbers


def device_busy(ctx: FeatureContext) -> None:
    """Device busy fraction (NVML, else the engine-step timeline), engine busy, step times."""
    util = ctx.series_values(stages.SERIES_GPU_UTIL_PCT)
    if len(util):
        per_gpu = pd.to_numeric(util["value"]).groupby(util["entity"].astype(str)).mean()
        ctx.add("device_busy_frac", float(per_gpu.mean()) / 100.0, source="nvml")
    steps = ctx.steps
    if len(steps) and "start_ns" in steps.columns:
        s = steps["start_ns"].to_numpy(dtype="float64")
        e = steps["end_ns"].to_numpy(dtype="float64")
        ctx.busy = Coverage(s, e)
        lo, hi = float(s.min()), float(e.max())
        if len(ctx.req_all):
            rs = num_col(ctx.req_all, "server_start_ns").where(num_col(ctx.req_all, "server_start_ns").notna(),
                                                             num_col(ctx.req_all, "start_ns"))
            lo = min(lo, float(np.nanmin(rs.to_numpy()))) if rs.notna().any() else lo
            ends = (rs + num_col(ctx.req_all, "e2e_s") * NS).dropna()
            hi = max(hi, float(ends.max())) if len(ends) else hi
        if ctx.window_ns is not None:
            lo, hi = max(lo, ctx.window_ns[0]), min(hi, ctx.window_ns[1])
        wall = max(hi - lo, 1.0)
        busy = float(ctx.busy.between(np.array([lo]), np.array([hi]))[0])
        if "device_busy_frac" not in ctx.features:
            ctx.add("device_busy_frac", busy / wall, source="engine_steps")
        ctx.add("engine_busy_frac", busy / wall, source="engine_steps")
        queued_busy(ctx)
    else:
        ctx.busy = None
        if "device_busy_frac" not in ctx.features:
            ctx.add("device_busy_frac", None, "needs NVML gpu_util_pct samples or engine-step spans")
        ctx.add("engine_busy_frac", None, "no engine-step spans")
        ctx.add("device_busy_frac_while_queued", None, "no engine-step spans")
    if len(steps) and "duration_s" in steps.columns:
        d = steps["duration_s"].to_numpy(dtype="float64")
        ctx.add("engine_step_p50_s", float(np.median(d)))
        # what a request arriving at a random time finds in flight: the length-biased mean step
        ctx.add("engine_step_in_flight_s", float((d * d).sum() / d.sum()) if d.sum() > 0 else None)
    else:
        ctx.na(("engine_step_p50_s", "engine_step_in_flight_s"), "no engine-step spans")
    dec = steps.loc[(num_col(steps, "prefill_tokens").fillna(0) <= 0) & (num_col(steps, "decode_seqs") > 0)] if len(steps) else steps
    if len(dec):
        ctx.add("decode_step_p50_s", float(dec["duration_s"].median()))
    else:
        ctx.add("decode_step_p50_s", None, "no decode-only engine steps")


def queued_busy(ctx: FeatureContext) -> None:
    """Fraction of the time requests sat in the queue during which the device was busy."""
    sp = ctx.spans
    if sp is None or sp.empty or ctx.busy is None:
        ctx.add("device_busy_frac_while_queued", None, "needs queue spans and engine-step spans")
        return
    q = sp.loc[name_is(sp, stages.QUEUE)]
    if ctx.window_ns is not None and len(q):
        q = q.loc[(q["start_ns"] >= ctx.window_ns[0]) & (q["start_ns"] < ctx.window_ns[1])]
    if q.empty:
        ctx.add("device_busy_frac_while_queued", None, "no queue spans")
        return
    a = q["start_ns"].to_numpy(dtype="float64")
    b = q["end_ns"].to_numpy(dtype="float64")
    total = float((b - a).sum())
    if total <= 0:
        ctx.add("device_busy_frac_while_queued", None, "queue spans have zero length")
        return
    ctx.add("device_busy_frac_while_queued", float(ctx.busy.between(a, b).sum() / total),
            source="engine_steps")


def kv(ctx: FeatureContext) -> None:
    """KV-cache usage (steps, else the series), preemptions, waiting and running sequences."""
    steps = ctx.steps
    kv = num_col(steps, "kv_usage_ratio").dropna() if len(steps) else pd.Series(dtype="float64")
    high = float(ctx.params["kv_high_ratio"])
    names = ("kv_usage_p95", "kv_usage_max", "kv_time_above_high_frac")
    if len(kv):
        dur = steps.loc[kv.index, "duration_s"].to_numpy(dtype="float64")
        v = kv.to_numpy()
        ctx.add("kv_usage_p95", float(np.percentile(v, 95)), source="engine_steps")
        ctx.add("kv_usage_max", float(v.max()), source="engine_steps")
        w = dur.sum()
        frac = float(dur[v >= high].sum() / w) if w > 0 else float((v >= high).mean())
        ctx.add("kv_time_above_high_frac", frac, source="engine_steps")
    else:
        s = ctx.series_values(stages.SERIES_KV_USAGE)
        if len(s):
            v = pd.to_numeric(s["value"]).to_numpy()
            if np.nanmax(v) > 1.5:  # some engines export percent
                v = v / 100.0
            ctx.add("kv_usage_p95", float(np.percentile(v, 95)), source="prometheus")
            ctx.add("kv_usage_max", float(v.max()), source="prometheus")
            ctx.add("kv_time_above_high_frac", float((v >= high).mean()), source="prometheus")
        else:
            ctx.na(names, "needs KV usage: engine-step spans with ttft.step.kv_usage_ratio or a kv_usage_ratio series")
    # preemptions
    pre_req = num_col(ctx.steady, "preemptions")
    pre_steps = num_col(steps, "preempted_seqs") if len(steps) else pd.Series(dtype="float64")
    pre_series = ctx.series_values(stages.SERIES_PREEMPTIONS)
    if pre_req.notna().any():
        ctx.add("preemptions_total", float(pre_req.fillna(0).sum()), source="requests")
        ctx.add("preempted_requests_frac", float((pre_req.fillna(0) > 0).mean()))
    elif pre_steps.notna().any():
        ctx.add("preemptions_total", float(pre_steps.fillna(0).sum()), source="engine_steps")
        ctx.add("preempted_requests_frac", None, "requests do not carry ttft.preemptions")
    elif len(pre_series):
        v = pd.to_numeric(pre_series["value"])
        per = v.groupby(pre_series["entity"].astype(str)).agg(lambda x: x.max() - x.min())
        ctx.add("preemptions_total", float(per.clip(lower=0).sum()), source="prometheus")
        ctx.add("preempted_requests_frac", None, "only the engine's cumulative counter is known")
    else:
        why = "needs ttft.preemptions on requests, preempted_seqs on steps or a preemptions_total series"
        ctx.na(("preemptions_total", "preempted_requests_frac"), why)
    # queue depth
    for col, series_name, p95_name, max_name in (
            ("waiting_seqs", stages.SERIES_WAITING, "waiting_seqs_p95", "waiting_seqs_max"),
            ("running_seqs", stages.SERIES_RUNNING, "running_seqs_p95", "running_seqs_max")):
        v = num_col(steps, col).dropna() if len(steps) else pd.Series(dtype="float64")
        src = "engine_steps"
        if v.empty:
            s = ctx.series_values(series_name)
            v = pd.to_numeric(s["value"]) if len(s) else v
            src = "prometheus"
        if len(v):
            ctx.add(p95_name, float(np.percentile(v, 95)), source=src)
            ctx.add(max_name, float(v.max()), source=src)
        else:
            ctx.na((p95_name, max_name),
                   f"needs {col} on engine steps or a {series_name} series")
    kv_blocked(ctx)
    waiting_at_cap(ctx)


def kv_blocked(ctx: FeatureContext) -> None:
    """``kv_blocked_steps_frac``: of the engine steps after which a request waited, the share after
    which one waited for free KV blocks (its next chunk needed more than were free) and none waited
    behind it that would have fit (that is head-of-line: :mod:`rules.admission`): the engine's own
    reasons on its step spans (the bundled engine's ``ttft.step.waiting_kv_blocks`` and
    ``ttft.step.waiting_head_of_line``). Unit: share."""
    steps = ctx.steps
    kv, waiting = num_col(steps, "waiting_kv_seqs"), num_col(steps, "waiting_seqs")
    hol = num_col(steps, "waiting_hol_seqs").fillna(0)
    known = kv.notna() & (waiting > 0)
    if not known.any():
        ctx.na(("kv_blocked_steps_frac",), "needs engine steps that say why requests wait (ttft.step.waiting_kv_blocks) "
                                           "with a request waiting")
        return
    ctx.add("kv_blocked_steps_frac", float(((kv[known] > 0) & (hol[known] <= 0)).mean()), source="engine_steps")


def waiting_at_cap(ctx: FeatureContext) -> None:
    """An engine's gauges at one load level (llama.cpp, TGI: no queue-time histogram).

    ``waiting_at_cap_frac``: share of scrapes with a request waiting while the running gauge
    sits at its highest value (the cap the engine admits); ``ttft_vs_engine_prefill_ratio``:
    TTFT p50 / the engine's own prefill time for that prompt (its prefill histogram's mean, or
    its seconds per prompt token x the median prompt). Units: share, x. Reads the series only.
    """
    wait = ctx.series_values(stages.SERIES_WAITING)
    run = ctx.series_values(stages.SERIES_RUNNING)
    if len(wait) and len(run):
        w = pd.DataFrame({"ts_s": pd.to_numeric(wait["ts_s"], errors="coerce"), "entity": wait["entity"].astype(str),
                          "waiting": pd.to_numeric(wait["value"], errors="coerce")})
        r = pd.DataFrame({"ts_s": pd.to_numeric(run["ts_s"], errors="coerce"), "entity": run["entity"].astype(str),
                          "running": pd.to_numeric(run["value"], errors="coerce")})
        j = w.merge(r, on=["ts_s", "entity"], how="inner")
        cap = float(j["running"].max()) if len(j) else 0.0
        if len(j) and cap >= 1:
            ctx.add("waiting_at_cap_frac", float(((j["waiting"] >= 1) & (j["running"] >= cap)).mean()), source="prometheus")
        else:
            ctx.na(("waiting_at_cap_frac",), "the waiting and running gauges were never scraped together")
    else:
        ctx.na(("waiting_at_cap_frac",), f"needs {stages.SERIES_WAITING} and {stages.SERIES_RUNNING} series")
    waiting_for_capacity(ctx, wait)
    ttft = ctx.features.value("ttft_p50_s")
    pre = ctx.features.value("metrics_prefill_time_mean_s")
    if pre is None and ctx.features.value("prefill_s_per_token") is not None and len(ctx.steady):
        tokens = num_col(ctx.steady, "input_tokens").dropna()
        pre = float(ctx.features.value("prefill_s_per_token")) * float(tokens.median()) if len(tokens) else None
    if ttft and pre and pre > 0:
        ctx.add("ttft_vs_engine_prefill_ratio", float(ttft / pre), source="prometheus")
    else:
        ctx.na(("ttft_vs_engine_prefill_ratio",), "needs TTFT and the engine's prefill time (prompt seconds)")


def waiting_for_capacity(ctx: FeatureContext, wait: pd.DataFrame) -> None:
    """``waiting_for_capacity_share``: of the requests an engine reports waiting, the share it holds
    for scheduling capacity of any kind -- a batch cap (max_num_seqs), the step's token budget or
    KV blocks alike -- rather than deferring them (vLLM's ``num_requests_waiting_by_reason
    {reason="capacity"}`` over ``num_requests_waiting``, summed over the scrapes where some wait).
    It does not say which capacity: alone it is no evidence of KV pressure. Unit: share. Series only."""
    cap = ctx.series_values(stages.SERIES_WAITING_CAPACITY)
    if not (len(cap) and len(wait)):
        ctx.na(("waiting_for_capacity_share",), f"needs the engine's waiting-by-reason gauge ({stages.SERIES_WAITING_CAPACITY}, "
                                          "vLLM num_requests_waiting_by_reason) beside its waiting gauge")
        return
    keys = ["ts_s", "entity"]
    w = pd.DataFrame({"ts_s": pd.to_numeric(wait["ts_s"], errors="coerce"), "entity": wait["entity"].astype(str),
                      "waiting": pd.to_numeric(wait["value"], errors="coerce")})
    c = pd.DataFrame({"ts_s": pd.to_numeric(cap["ts_s"], errors="coerce"), "entity": cap["entity"].astype(str),
                      "capacity": pd.to_numeric(cap["value"], errors="coerce")})
    j = w.merge(c, on=keys, how="inner")
    j = j[j["waiting"] >= 1]
    if j.empty:
        ctx.na(("waiting_for_capacity_share",), "no request was waiting when the by-reason gauge was scraped")
        return
    ctx.add("waiting_for_capacity_share", float(min(1.0, j["capacity"].clip(lower=0).sum() / j["waiting"].sum())),
            source="prometheus")


def comm_tp(ctx: FeatureContext) -> None:
    """Collective time's share of prefill, the TP degree, and TTFT per prompt token across TP degrees."""
    st = ctx.steady
    comm = num_col(st, "comm_s")
    pre = num_col(st, "prefill_s")
    m = comm.notna() & pre.notna()
    if m.any() and float((pre[m] + comm[m]).sum()) > 0:
        ctx.add("comm_share_of_prefill", float(comm[m].sum() / (pre[m] + comm[m]).sum()), source="requests")
    else:
        m = None
        steps = ctx.steps
        if len(steps) and num_col(steps, "comm_s").notna().any() and (num_col(steps, "prefill_tokens") > 0).any():
            ps = steps.loc[num_col(steps, "prefill_tokens") > 0]
            d = float(ps["duration_s"].sum())
            ctx.add("comm_share_of_prefill", float(num_col(ps, "comm_s").fillna(0).sum() / d) if d > 0 else None, source="engine_steps")
        else:
            ctx.add("comm_share_of_prefill", None,
                    "no comm spans (tensor parallel off, or the engine does not time its collectives)")
    _comm_share_tp_ttft(ctx, comm, m)
    tp = num_col(st, "tp_size")
    if tp.isna().all() and "segment" in st.columns:
        tp = segment_numbers(st["segment"])["tp"]
    if tp.isna().all():
        meta_tp = ctx.meta.get("tp_size")
        eng = ctx.meta.get("engine")
        if meta_tp is None and isinstance(eng, dict):
            meta_tp = eng.get("tp_size", eng.get("tp"))
        mt = as_float(meta_tp)
        if mt is not None:
            tp = pd.Series(mt, index=st.index)
    if tp.notna().any():
        ctx.add("tp_size", float(tp.max()))
        degrees = sorted(tp.dropna().unique())
        if len(degrees) >= 2:
            ttft = num_col(st, "ttft_s")
            tokens = num_col(st, "input_tokens")
            per_tok = (ttft / tokens).where(tokens > 0)
            by: dict[str, float] = {}
            norm: dict[float, float] = {}
            for d in degrees:
                mm = tp == d
                by[f"{d:g}"] = float(ttft[mm].median())
                norm[d] = float(per_tok[mm].median()) if per_tok[mm].notna().any() else float(ttft[mm].median())
            ctx.add("ttft_by_tp", by)
            lo_d, hi_d = degrees[0], degrees[-1]
            ctx.add("tp_ttft_ratio", norm[hi_d] / norm[lo_d] if norm[lo_d] > 0 else None,
                    source=f"TP={hi_d:g} vs TP={lo_d:g}, per prompt token when token counts are known")
        else:
            ctx.na(("ttft_by_tp", "tp_ttft_ratio"),
                   f"only one TP degree ({degrees[0]:g}) in the capture; needs runs at two degrees")
    else:
        ctx.add("tp_size", None, "requests do not carry ttft.tp.size")
        ctx.na(("ttft_by_tp", "tp_ttft_ratio"), "TP degree unknown")


def _comm_share_tp_ttft(ctx: FeatureContext, comm: pd.Series, ran: pd.Series | None) -> None:
    """``comm_share_tp_ttft``: collective seconds / TTFT seconds over the requests that ran
    collectives (those with comm spans). A capture that compares TP degrees also holds TP=1
    requests, which have no collectives: its slowest 5% may all be TP=1, so the tail share says
    nothing about what TP costs the requests that use it. Share 0..1."""
    why = "no request has comm spans (tensor parallel off, or the engine does not time its collectives)"
    if ran is None or not ran.any():
        ctx.na(("comm_share_tp_ttft",), why)
        return
    ttft = num_col(ctx.steady, "server_ttft_s").where(num_col(ctx.steady, "server_ttft_s").notna(),
                                                        num_col(ctx.steady, "ttft_s"))
    both = ran & ttft.notna()
    total = float(ttft[both].sum())
    ctx.add("comm_share_tp_ttft", float(comm[both].sum() / total) if total > 0 else None,
            source=f"{int(both.sum())} requests with comm spans")


def cpu_profile(ctx: FeatureContext) -> None:
    """The serving process's CPU samples by stage (py-spy summary in meta.json), shares 0..1."""
    prof = ctx.meta.get("pyspy")
    shares = None
    if isinstance(prof, dict):
        for k in ("busy_shares", "stage_shares", "shares", "by_stage"):  # collectors.pyspy writes busy_shares
            if isinstance(prof.get(k), dict):
                shares = {str(a): float(b) for a, b in prof[k].items() if as_float(b) is not None}
                break
    ctx.add("cpu_profile_shares", shares,
            None if shares else "no CPU profile summary (meta 'pyspy' with stage shares)")
