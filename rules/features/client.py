"""Theme: the load generator's own health: event-loop stalls and lag, CPU, slot waits, sends
late against the schedule (from the client's series, else ``meta.json`` ``client_health``).

The lag counts only where it could inflate a measured TTFT (:mod:`diag.ground.client_lag`): stalls
while a completed request waited for its first token, and above all the stalls under way at the
requests' sends and first tokens, as a share of their TTFT, split into the client's own part and
the part the machine caused (the loop given no CPU). Stalls between requests (the tool's own
work between steps) count nowhere. Units: share 0..1, seconds, percent of one core.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import client_lag, stages
from rules.features.context import FeatureContext
from rules.features.numeric import NS, as_float, name_is, num_col


def _stalls(ctx: FeatureContext) -> list[client_lag.Stalls]:
    """The loop stalls of each client process (entity), with the machine's part where recorded."""
    lag = ctx.series_values(stages.SERIES_LOOP_LAG_S)
    if lag.empty:
        return []
    starved = ctx.series_values(stages.SERIES_LOOP_STARVED_S)
    out = []
    for entity, g in lag.groupby(lag["entity"].astype(str)):
        g = g.assign(ts_s=pd.to_numeric(g["ts_s"]), value=pd.to_numeric(g["value"])).sort_values("ts_s")
        part = None
        if len(starved):
            r = starved.loc[starved["entity"].astype(str) == entity]
            if len(r):  # the same sample's rows share its timestamp
                by_ts = pd.Series(pd.to_numeric(r["value"]).to_numpy(), index=pd.to_numeric(r["ts_s"]).to_numpy())
                part = by_ts[~by_ts.index.duplicated()].reindex(g["ts_s"].to_numpy()).to_numpy()
        out.append(client_lag.stalls_of(g["ts_s"].to_numpy(), g["value"].to_numpy(), part))
    return out


def first_token_lag(ctx: FeatureContext) -> dict | None:
    """:func:`diag.ground.client_lag.first_token_lag` over the completed requests' TTFT windows (client
    send to first content), or None without lag samples or such requests."""
    stalls = _stalls(ctx)
    ok = ctx.ok
    if not stalls or ok is None or ok.empty or "client_start_ns" not in ok.columns \
            or "client_first_content_ns" not in ok.columns:
        return None
    start = num_col(ok, "client_start_ns") / NS
    first = num_col(ok, "client_first_content_ns") / NS
    keep = start.notna() & first.notna()
    if not keep.any():
        return None
    return client_lag.first_token_lag(stalls, start[keep].to_numpy(), first[keep].to_numpy())


def client_health(ctx: FeatureContext) -> None:
    """Whether the client kept up: loop stall share, loop lag p99, CPU p95, saturation flag, send lateness."""
    health = ctx.meta.get("client_health")
    health = health if isinstance(health, dict) else {}
    flags = {k: v for k, v in health.items() if isinstance(v, (bool, int, float, str)) and not isinstance(v, dict)}
    ctx.add("client_health_flags", flags, None if health else "meta.json has no client_health")
    cpu_doc = health.get("client_cpu")
    local = cpu_doc.get("server_local") if isinstance(cpu_doc, dict) else None
    ctx.add("client_server_local", None if local is None else float(bool(local)),
            None if local is not None else "client_health does not say whether the server was on this machine")

    def from_meta(*needles: str) -> float | None:
        for k, v in health.items():
            kl = k.lower()
            if all(n in kl for n in needles):
                x = as_float(v)
                if x is not None:
                    return x
        return None

    lag = ctx.series_values(stages.SERIES_LOOP_LAG_S)
    ft = first_token_lag(ctx)
    if ft is not None:
        # while completed requests waited for their first token: stalls between requests delay nothing
        src = "series, while requests waited for their first token"
        ctx.add("client_loop_stall_frac", ft["stall_frac"], source=src)
        ctx.add("client_loop_lag_p99_s", ft["lag_p99_s"], source=src)
        split = len(ctx.series_values(stages.SERIES_LOOP_STARVED_S)) > 0
        ctx.add("client_first_token_lag_share", ft["share"], source="series")
        ctx.add("client_first_token_own_lag_share", ft["own_share"],
                source="series, less the machine's part" if split
                else "series (the machine's part not recorded: all of it counted as the client's own)")
        ctx.add("client_first_token_starved_share", ft["starved_share"] if split else None,
                None if split else "no client_loop_starved_s series")
    else:
        why = "no client_loop_lag_s series or completed requests with client timing"
        for name in ("client_first_token_lag_share", "client_first_token_own_lag_share",
                     "client_first_token_starved_share"):
            ctx.add(name, None, why)
        # a capture without per-request timing or series: the whole run, as meta.json says
        stall = from_meta("loop_stall")
        ctx.add("client_loop_stall_frac", stall,
                None if stall is not None else "no client_loop_lag_s series or client_health loop_stall_frac",
                source="meta")
        if len(lag):
            ctx.add("client_loop_lag_p99_s", float(np.percentile(pd.to_numeric(lag["value"]), 99)), source="series")
        else:
            v = from_meta("loop_lag", "p99")
            v = v if v is not None else from_meta("loop_lag")
            ctx.add("client_loop_lag_p99_s", v,
                    None if v is not None else "no client_loop_lag_s series or client_health entry", source="meta")
    cpu = ctx.series_values(stages.SERIES_CLIENT_CPU_PCT)
    if len(cpu):
        ctx.add("client_cpu_pct_p95", float(np.percentile(pd.to_numeric(cpu["value"]), 95)), source="series")
    else:
        v = from_meta("cpu", "p95")
        v = v if v is not None else from_meta("cpu", "p90")  # collectors.probe.health writes cpu_pct_p90
        v = v if v is not None else from_meta("cpu", "max")
        ctx.add("client_cpu_pct_p95", v, None if v is not None else "no client_cpu_pct series or client_health entry",
                source="meta")
    sat = None
    for k in ("saturated", "client_bound", "bottleneck", "overloaded", "client_saturated"):
        if k in health:
            sat = 1.0 if bool(health[k]) else 0.0
    ctx.add("client_saturated_flag", sat, None if sat is not None else "client_health does not say")
    slot = num_col(ctx.steady, "slot_wait_s").dropna()
    ctx.add("client_slot_wait_p95_s", float(np.percentile(slot, 95)) if len(slot) else None,
            None if len(slot) else "no client slot-wait times")
    # lateness of sends against the load schedule, net of slot waits
    sp = ctx.spans
    key = stages.ATTR_CLIENT_SCHEDULED_NS
    if sp is not None and len(sp) and key in sp.columns and stages.ATTR_CLIENT_START_NS in sp.columns:
        rows = sp.loc[(name_is(sp, stages.SPAN_CLIENT_REQUEST)) & sp[key].notna()]
        if len(rows):
            sched = pd.to_numeric(rows[key], errors="coerce")
            start = pd.to_numeric(rows[stages.ATTR_CLIENT_START_NS], errors="coerce")
            wait = pd.to_numeric(rows.get(stages.ATTR_CLIENT_SLOT_WAIT_S), errors="coerce") if stages.ATTR_CLIENT_SLOT_WAIT_S in rows.columns else 0.0
            late = ((start - sched) / NS - (wait if np.isscalar(wait) else wait.fillna(0))).clip(lower=0).dropna()
            if len(late):
                ctx.add("client_send_lateness_p95_s", float(np.percentile(late, 95)))
                return
    ctx.add("client_send_lateness_p95_s", None, "requests carry no scheduled send time (closed-loop load)")
