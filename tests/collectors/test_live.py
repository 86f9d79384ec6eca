"""LiveCollection drives its time-series collectors through the SeriesCollector protocol only."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from support.fake_pynvml import make_fake

from collectors.base import SeriesCollector, empty_series_frame
from collectors.live import LiveCollection
from collectors.nvml import NvmlSampler
from diag.ground import stages as S
from diag.ground.capture import load_capture


class ListCollector:
    """A SeriesCollector whose rows the test adds by hand; counts the protocol calls."""

    def __init__(self, source: str, fail_start: bool = False) -> None:
        self.source = source
        self.fail_start = fail_start
        self.rows: list[tuple[float, str, str, str, float]] = []
        self.starts = 0
        self.stops = 0

    def add(self, ts_s: float, value: float) -> None:
        self.rows.append((ts_s, self.source, S.SERIES_KV_USAGE, "replica0", value))

    def start(self) -> None:
        if self.fail_start:
            raise RuntimeError("cannot start")
        self.starts += 1

    def stop(self) -> None:
        self.stops += 1

    def collect(self) -> pd.DataFrame:
        if not self.rows:
            return empty_series_frame()
        return pd.DataFrame(list(self.rows), columns=list(S.SERIES_COLUMNS))


def _values(path: Path, source: str) -> list[float]:
    series = load_capture(path).series
    return series[series.source == source].sort_values("ts_s").value.tolist()


def test_every_collector_is_started_pumped_and_stopped_through_the_protocol(tmp_path):
    cap = tmp_path / "cap"
    live = LiveCollection(cap, meta={"kind": "test"})
    a, b = ListCollector("engine-a"), ListCollector("engine-b")
    assert isinstance(a, SeriesCollector)
    live.add_collector("engine-a", a)
    live.add_collector("engine-b", b)
    assert live.collectors() == [a, b] and (a.starts, b.starts) == (1, 1)
    a.add(1.0, 0.1)
    live.pump_once()
    assert (cap / "series" / "engine-a.parquet").exists()
    assert not (cap / "series" / "engine-b.parquet").exists()  # no rows yet: no file
    live.stop_collector("engine-a")  # its engine goes away: written once more, then left alone
    a.add(2.0, 0.2)
    b.add(2.0, 0.5)
    live.pump_once()
    a.add(3.0, 0.3)  # after its final write: never written
    live.pump_once()
    live.stop()
    assert a.stops >= 1 and b.stops == 1
    assert _values(cap, "engine-a") == [0.1, 0.2]
    assert _values(cap, "engine-b") == [0.5]


def test_a_collector_that_cannot_start_is_not_added(tmp_path):
    live = LiveCollection(tmp_path / "cap")
    with pytest.raises(RuntimeError, match="cannot start"):
        live.add_collector("x", ListCollector("x", fail_start=True))
    assert live.collectors() == []
    assert live.start_prometheus("http://127.0.0.1:9/metrics", interval_s=0) is False
    assert live.notes == ["/metrics scraper failed to start: ValueError: interval_s must be > 0"]
    live.stop()


def test_nvml_runs_as_one_of_the_collectors(tmp_path, monkeypatch):
    fake, _clock = make_fake(2)
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # the sampler imports pynvml itself
    cap = tmp_path / "cap"
    live = LiveCollection(cap)
    assert live.start_nvml(interval_s=0.01)
    assert isinstance(live.nvml, NvmlSampler) and live.collectors() == [live.nvml]
    deadline = time.monotonic() + 5.0
    fake_rows = 0
    while fake_rows == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
        fake_rows = len(live.nvml.collect())
    live.stop()
    series = load_capture(cap).series
    gpu = series[series.source == "nvml"]
    assert fake_rows > 0 and len(gpu) >= fake_rows and set(gpu.entity.str.split("/").str[0]) == {"gpu0", "gpu1"}
    meta = json.loads((cap / "meta.json").read_text())
    assert meta["nvml"]["available"] is True and [g["entity"] for g in meta["nvml"]["gpus"]] == ["gpu0", "gpu1"]


def test_steady_plan_probes_at_a_constant_low_rate():
    from collectors.live_probe import ProbePlan, steady_plan
    from collectors.probe import LoadSpec

    plan = steady_plan(ProbePlan(rate_rps=2.0, chunk_s=3.0, concurrency=2, segment="w"))
    for _ in range(2):  # the same chunk every time, forever
        load, workload, segment = plan(None)
        assert load == LoadSpec(concurrency=2, rate_rps=2.0, duration_s=3.0) and workload is None and segment == "w"
