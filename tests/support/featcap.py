"""Small feature-test inputs: request tables, engine steps and /metrics rows built by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.request_table import empty_request_table
from diag.ground.tables import Tables

NS = 1e9


def make_tables(req: pd.DataFrame | None = None, steps: pd.DataFrame | None = None, series: pd.DataFrame | None = None,
                meta: dict | None = None) -> Tables:
    return Tables(
        requests=req if req is not None else empty_request_table(),
        steps=steps if steps is not None else pd.DataFrame(columns=["start_ns", "end_ns", "duration_s"]),
        cold_starts=pd.DataFrame(columns=["start_ns", "end_ns", "duration_s", "phase", "service"]),
        spans=pd.DataFrame(columns=["trace_id", "span_id", "name", "start_ns", "end_ns"]),
        series=series if series is not None else pd.DataFrame(columns=list(stages.SERIES_COLUMNS)),
        meta=meta or {},
    )


def make_requests(ttft_s: list[float], **cols: list) -> pd.DataFrame:
    n = len(ttft_s)
    base = 1.7e18
    df = pd.DataFrame({
        "trace_id": [f"{i:032x}" for i in range(n)],
        "start_ns": [base + i * 1e8 for i in range(n)],
        "ttft_s": ttft_s, "server_ttft_s": ttft_s, "client_ttft_s": [np.nan] * n,
        "e2e_s": [t + 0.01 for t in ttft_s], "has_server": [True] * n, "has_client": [False] * n,
        "warmup": [False] * n, "error": [None] * n, "segment": [None] * n,
    })
    for k, v in cols.items():
        df[k] = v
    return df


def engine_series(windows: list[dict[str, float]], dt_s: float = 5.0, t0: float = 1000.0, entity: str = "",
                  first: dict[str, float] | None = None) -> pd.DataFrame:
    """Canonical /metrics rows: a first scrape (gauges only) at ``t0``, then one scrape pair per window."""
    rows = [(t0, "prometheus", name, entity, v) for name, v in (first or {stages.SERIES_WAITING: 0.0}).items()]
    for k, w in enumerate(windows, start=1):
        rows += [(t0 + k * dt_s, "prometheus", name, entity, v) for name, v in w.items()]
    return pd.DataFrame(rows, columns=list(stages.SERIES_COLUMNS))


S = stages
#: one scrape window of a queue-bound engine (canonical series -> value)
QUEUE_WINDOW = {S.SERIES_REQUESTS_PER_S: 2.0, S.SERIES_TTFT_S: 1.0, S.SERIES_QUEUE_TIME_S: 0.8,
                S.SERIES_PREFILL_TIME_S: 0.15, "ttft_s_p50": 0.9, "ttft_s_p95": 2.0, "ttft_s_p99": 2.5,
                "queue_time_s_p95": 1.8, S.SERIES_ITL_S: 0.03, "itl_s_p50": 0.02, "itl_s_p99": 0.1,
                S.SERIES_GENERATION_TOKENS_PER_S: 100.0, S.SERIES_WAITING: 6.0}
