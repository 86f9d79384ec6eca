"""Fleet captures: engine series of several replicas, as a saved ``ttft scrape --from-prometheus``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from diag.ground import stages as S
from diag.ground.capture import CaptureWriter

#: a replica whose requests queue; and a calm one
QUEUE = {S.SERIES_REQUESTS_PER_S: 4.0, S.SERIES_TTFT_S: 2.0, S.SERIES_QUEUE_TIME_S: 1.8, S.SERIES_PREFILL_TIME_S: 0.15,
         "ttft_s_p50": 1.9, "ttft_s_p95": 3.0, "queue_time_s_p95": 2.8, S.SERIES_WAITING: 12.0,
         S.SERIES_KV_USAGE: 0.4, S.SERIES_PREEMPTIONS: 0.0, "itl_s_p50": 0.02, S.SERIES_GENERATION_TOKENS_PER_S: 200.0}
CALM = {S.SERIES_REQUESTS_PER_S: 4.0, S.SERIES_TTFT_S: 0.05, S.SERIES_QUEUE_TIME_S: 0.001, S.SERIES_PREFILL_TIME_S: 0.03,
        "ttft_s_p50": 0.05, "ttft_s_p95": 0.08, S.SERIES_WAITING: 0.0, S.SERIES_KV_USAGE: 0.1,
        "itl_s_p50": 0.02, S.SERIES_GENERATION_TOKENS_PER_S: 200.0}


def fleet_capture(tmp_path: Path, replicas: dict[str, dict[str, float]], windows: int = 8) -> Path:
    """A saved fleet scrape: ``windows`` 5 s windows of each replica's engine series (``replicas``:
    instance -> series -> value), in ``tmp_path/fleet``."""
    rows = []
    for name, w in replicas.items():
        rows.append((1000.0, "prometheus", S.SERIES_WAITING, name, 0.0))
        rows += [(1000.0 + 5.0 * k, "prometheus", series, name, v) for k in range(1, windows + 1) for series, v in w.items()]
    out = tmp_path / "fleet"
    with CaptureWriter(out, meta={"command": "test"}) as w:
        w.write_series("prometheus", pd.DataFrame(rows, columns=list(S.SERIES_COLUMNS)))
    return out
