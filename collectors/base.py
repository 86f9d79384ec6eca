"""The one protocol every time-series collector implements: :class:`SeriesCollector`.

A collector observes something outside the analysis (a /metrics endpoint, the GPUs through
NVML, a serving process through py-spy) and hands back what it saw as long-format rows with
:data:`diag.ground.stages.SERIES_COLUMNS` = ``(ts_s, source, series, entity, value)``: Unix seconds,
the collector's source name, a series name, the entity it belongs to (``gpu0``, a replica,
``pid123/tokenize``) and a float value in the unit the series name says.

Implementations: :class:`collectors.prometheus.PrometheusScraper`,
:class:`collectors.nvml.NvmlSampler`, :class:`collectors.pyspy.PySpySampler`. Whoever runs
several of them (:class:`collectors.live.LiveCollection`) holds a list of
``SeriesCollector`` and drives them through these three methods only.

Threading contract, per method (the same for every implementation):

* :meth:`~SeriesCollector.start` — called once by the owner thread; returns promptly (the
  sampling runs on the collector's own thread or child process, the first sample may come
  later). A second call is a no-op or an error, never a second sampler. May raise a
  one-line error when the collector cannot come up at all; a collector that degrades (no GPU,
  a dead endpoint) does not raise but says so in its ``note``/``last_error`` and collects
  nothing.
* :meth:`~SeriesCollector.stop` — called by the owner thread; may block for a bounded time
  (joining the sampling thread, ending the child process); idempotent; never raises for an
  error of the thing observed. The rows collected so far stay readable.
* :meth:`~SeriesCollector.collect` — may be called from any thread, before, during and
  after sampling; never blocks for longer than copying the rows under a short lock; never
  raises. Returns every row collected since :meth:`start` (not only new ones: a caller that
  rewrites a series file each time gets the whole run), an empty frame with the columns when
  there are none.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import pandas as pd

from diag.ground import stages


@runtime_checkable
class SeriesCollector(Protocol):
    """Something that samples into time-series rows on its own thread (see the module doc)."""

    def start(self) -> None:
        """Begin sampling (owner thread; returns promptly; may raise if it cannot start)."""
        ...

    def stop(self) -> None:
        """End sampling (owner thread; bounded wait; idempotent; rows stay readable)."""
        ...

    def collect(self) -> pd.DataFrame:
        """All rows so far in ``diag.ground.stages.SERIES_COLUMNS`` (any thread; never raises)."""
        ...


def empty_series_frame() -> pd.DataFrame:
    """No rows, with :data:`diag.ground.stages.SERIES_COLUMNS` and their dtypes (what ``collect()``
    returns before the first sample)."""
    return pd.DataFrame({
        "ts_s": pd.Series(dtype="float64"),
        "source": pd.Series(dtype=object),
        "series": pd.Series(dtype=object),
        "entity": pd.Series(dtype=object),
        "value": pd.Series(dtype="float64"),
    }, columns=list(stages.SERIES_COLUMNS))
