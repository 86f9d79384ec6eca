"""The SeriesCollector protocol: what counts as one, and the empty frame collectors return."""

from __future__ import annotations

import os

from collectors.base import SeriesCollector, empty_series_frame
from collectors.nvml import NvmlSampler
from collectors.prometheus import PrometheusScraper
from collectors.pyspy import PySpySampler
from diag.ground import stages as S


class _NoCollect:
    def start(self) -> None: ...

    def stop(self) -> None: ...


def test_the_three_samplers_are_series_collectors_and_a_partial_one_is_not():
    nvml = NvmlSampler()  # no driver here: unavailable, still a collector
    for c in (PrometheusScraper("http://127.0.0.1:9/metrics"), nvml, PySpySampler(os.getpid())):
        assert isinstance(c, SeriesCollector), type(c).__name__
    nvml.stop()
    assert not isinstance(_NoCollect(), SeriesCollector)


def test_empty_series_frame_has_the_schema_columns_and_dtypes():
    df = empty_series_frame()
    assert tuple(df.columns) == S.SERIES_COLUMNS and df.empty
    assert str(df.ts_s.dtype) == "float64" and str(df.value.dtype) == "float64"
