"""Theme: the load generator's own health: event-loop stalls and lag, CPU, slot waits, sends
late against the schedule (from the client's series, else ``meta.json`` ``client_health``).
Units: share 0..1, seconds, percent of one core.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag import stages
from rules.features.context import FeatureContext
from rules.features.numeric import NS, as_float, name_is, num_col


def client_health(ctx: FeatureContext) -> None:
    """Whether the client kept up: loop stall share, loop lag p99, CPU p95, saturation flag, send lateness."""
    health = ctx.meta.get("client_health")
    health = health if isinstance(health, dict) else {}
    flags = {k: v for k, v in health.items() if isinstance(v, (bool, int, float, str)) and not isinstance(v, dict)}
    ctx.add("client_health_flags", flags, None if health else "meta.json has no client_health")

    def from_meta(*needles: str) -> float | None:
        for k, v in health.items():
            kl = k.lower()
            if all(n in kl for n in needles):
                x = as_float(v)
                if x is not None:
                    return x
        return None

    lag = ctx.series_values(stages.SERIES_LOOP_LAG_S)
    stall = from_meta("loop_stall")
    if len(lag) >= 3:
        # share of the sampled wall time the loop ran late, per client process (entity)
        fracs = []
        for _, g in lag.groupby(lag["entity"].astype(str)):
            ts = pd.to_numeric(g["ts_s"]).to_numpy()
            covered = float(ts.max() - ts.min())
            if covered > 0:
                fracs.append(min(1.0, float(pd.to_numeric(g["value"]).iloc[1:].sum()) / covered))
        stall = max(fracs) if fracs else stall
    ctx.add("client_loop_stall_frac", stall,
            None if stall is not None else "no client_loop_lag_s series or client_health loop_stall_frac",
            source="series" if len(lag) >= 3 else "meta")
    if len(lag):
        ctx.add("client_loop_lag_p99_s", float(np.percentile(pd.to_numeric(lag["value"]), 99)), source="series")
    else:
        v = from_meta("loop_lag", "p99")
        v = v if v is not None else from_meta("loop_lag")
        ctx.add("client_loop_lag_p99_s", v, None if v is not None else "no client_loop_lag_s series or client_health entry",
                source="meta")
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
