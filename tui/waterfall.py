"""One request's spans as waterfall rows (the request screen), with its facts as text.

Worker thread: scans the span table once. Offsets are seconds from the request's first span.
"""

from __future__ import annotations

import numpy as np

from diag.ground import stages
from diag.ground.tables import Tables
from diag.ground.units import fmt_value
from tui.prepared import NS, as_float
from tui.viewmodels import WaterfallRow, WaterfallVM


def request_waterfall(tables: Tables, trace_id: str) -> WaterfallVM:
    """The spans of one trace as waterfall rows (worker thread; scans the span table once)."""
    spans = tables.spans
    vm = WaterfallVM(trace_id, f"request {trace_id[:16]}")
    req = tables.requests
    row = req.loc[req["trace_id"].astype(str) == trace_id] if len(req) else req
    if len(row):
        r = row.iloc[0]
        vm.title = f"request {r.get('request_id') or trace_id[:16]}"
        for label, key, unit in (("TTFT", "ttft_s", "s"), ("server TTFT", "server_ttft_s", "s"),
                                 ("client TTFT", "client_ttft_s", "s"), ("e2e", "e2e_s", "s"),
                                 ("input tokens", "input_tokens", "count"), ("output tokens", "output_tokens", "count"),
                                 ("ITL p50", "itl_p50_s", "s"), ("ITL p99", "itl_p99_s", "s"),
                                 ("preemptions", "preemptions", "count"), ("segment", "segment", None),
                                 ("error", "error", None)):
            v = r.get(key)
            if v is None or (isinstance(v, float) and np.isnan(v)):
                continue
            vm.facts.append((label, fmt_value(v, unit) if unit is not None else str(v)))
    if not len(spans):
        return vm
    mine = spans.loc[spans["trace_id"].astype(str) == trace_id]
    if not len(mine):
        return vm
    t0 = int(mine["start_ns"].min())
    vm.total_s = (int(mine["end_ns"].max()) - t0) / NS
    ids = mine["span_id"].astype(str).tolist()
    parents = dict(zip(ids, mine["parent_span_id"].astype(str).tolist()))

    def depth(sid: str) -> int:
        d, seen = 0, set()
        while parents.get(sid) in parents and sid not in seen:
            seen.add(sid)
            sid = parents[sid]
            d += 1
        return d

    order = mine.sort_values(["start_ns", "end_ns"], ascending=[True, False])
    for _, s in order.iterrows():
        vm.rows.append(WaterfallRow(str(s["name"]), depth(str(s["span_id"])), (int(s["start_ns"]) - t0) / NS,
                                    (int(s["end_ns"]) - int(s["start_ns"])) / NS, str(s.get("service", ""))))
    if len(row):
        r = row.iloc[0]
        first = as_float(r.get("client_first_content_ns")) if "client_first_content_ns" in row.columns else None
        if first is None:
            first = as_float(r.get("first_token_ns"))
        if first is not None:
            vm.first_token_s = (first - t0) / NS
    tt_key = stages.ATTR_TOKEN_TIMES_NS
    if tt_key in mine.columns:
        for v in mine[tt_key].dropna():
            if isinstance(v, (list, tuple, np.ndarray)) and len(v):
                vm.token_offsets_s = [(float(x) - t0) / NS for x in v]
                break
    return vm
