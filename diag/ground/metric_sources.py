"""The shapes of an engine's ``/metrics`` table, as plain data: where each canonical series comes from.

An :class:`EngineAdapter` is one engine's table: a tuple of :class:`SeriesMap`, each a canonical
series of :mod:`diag.ground.stages` (``SERIES_*``, in the unit its name states) and the *sources*
it may come from, tried in order (the first one with data wins). A source names exposition
samples (what a scrape shows and what PromQL queries) and says how they become that series;
the engine tables in :mod:`diag.ground.external` (each engine's ``METRICS``) are built from them.

Only what a source *is* lives here, with :meth:`Source.names` (the sample names it reads, for
engine detection). Evaluating a source over two scrapes and writing it as PromQL is
:mod:`collectors.adapters.evaluation`. Frozen dataclasses, no I/O; any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

#: label pairs a sample must carry to be read (exact value match), e.g. ``(("reason", "capacity"),)``
Labels = tuple[tuple[str, str], ...]


class Source:
    """Where one canonical series comes from; every subclass is a frozen dataclass of plain fields."""

    def names(self) -> tuple[str, ...]:
        """The exposition sample names this source reads (for engine detection)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Gauge(Source):
    """A gauge as it is, summed over the labels that name no entity.

    ``name``: the exposition sample name. ``match``: label pairs a sample must carry.
    ``scale``: multiplies the value into the series' unit (1.0: as exported). ``max_over``:
    labels naming ranks that report one shared state (SGLang's ``tp_rank``): summed within one
    rank, the largest rank's sum kept.
    """

    name: str
    match: Labels = ()
    scale: float = 1.0
    max_over: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class CounterValue(Source):
    """A counter's cumulative value, in the counter's own unit (e.g. preemptions so far).

    ``name``, ``match`` and ``max_over`` as for :class:`Gauge`.
    """

    name: str
    match: Labels = ()
    max_over: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class CounterRate(Source):
    """A counter's increase per second between two scrapes (Δcounter / Δt, reset-aware), times ``scale``.

    ``name``, ``match`` and ``max_over`` as for :class:`Gauge`; ``scale`` multiplies the rate
    (1.0: counter units per second).
    """

    name: str
    match: Labels = ()
    scale: float = 1.0
    max_over: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class Histogram(Source):
    """A histogram ``<base>_bucket/_sum/_count``: the windowed mean Δsum / Δcount, times ``scale``.

    ``base``: the sample name without its ``_bucket``/``_sum``/``_count`` suffix. ``match``: label
    pairs a sample must carry. ``scale`` multiplies the mean and the percentiles (the ``le``
    bounds) into the series' unit: 1e-3 for a histogram in milliseconds read as seconds.
    Percentiles come from the bucket deltas of the same window.
    """

    base: str
    match: Labels = ()
    scale: float = 1.0

    def names(self) -> tuple[str, ...]:
        return (self.base + "_bucket", self.base + "_sum", self.base + "_count")


@dataclass(frozen=True)
class CounterRatio(Source):
    """Δnum / Δden of two counters over the window, times ``scale`` (Triton's cumulative µs per
    request: ``scale`` 1e-6 gives seconds). The counters' own ``scale`` is not applied."""

    num: CounterRate
    den: CounterRate
    scale: float = 1.0

    def names(self) -> tuple[str, ...]:
        return self.num.names() + self.den.names()


@dataclass(frozen=True)
class CounterSumRatio(Source):
    """Δnum / Σ Δden over the window, a ratio of counts (cache-hit prompt tokens / prompt tokens of
    every source); the counters are given no ``scale``."""

    num: CounterRate
    den: tuple[CounterRate, ...]

    def names(self) -> tuple[str, ...]:
        return self.num.names() + tuple(n for d in self.den for n in d.names())


@dataclass(frozen=True)
class GaugeRatio(Source):
    """num / den of two gauges at the latest scrape, each read as a :class:`Gauge` (used / max KV blocks)."""

    num: Gauge
    den: Gauge

    def names(self) -> tuple[str, ...]:
        return self.num.names() + self.den.names()


@dataclass(frozen=True)
class Combine(Source):
    """Σ sign × source over the entities present in every part (e2e − TTFT ≈ decode).

    ``parts``: (sign, source) pairs; the sign (+1.0 or -1.0) multiplies that source's value,
    and the parts share the series' unit.
    """

    parts: tuple[tuple[float, Source], ...]

    def names(self) -> tuple[str, ...]:
        return tuple(n for _, s in self.parts for n in s.names())


@dataclass(frozen=True)
class SeriesMap:
    """A canonical series and its sources.

    ``series``: a canonical series name (:mod:`diag.ground.stages` ``SERIES_*``). ``sources``:
    tried in order, the first with data for a window wins (how a renamed metric is read under
    both names). ``note``: what the value approximates, shown beside it.
    """

    series: str
    sources: tuple[Source, ...]
    note: str = ""


@dataclass(frozen=True)
class EngineAdapter:
    """One engine's table.

    ``engine``: its name in captures and ``--engine``. ``prefixes`` (and ``exact_names``, for
    engines whose older releases export unprefixed names) detect it; ``maps``: its series.
    ``entity_labels`` name replicas/engines: kept apart when a family has more than one value of
    them, summed over otherwise. ``activity``: counters that advance whenever the engine works;
    when set, a window in which none of them advanced and every gauge kept its value is *stale*
    (SGLang sets its gauges only while logging stats, so they freeze when it is idle): its gauge
    rows are left out and ``gauges_stale`` is 1. ``note``: the table's caveats, shown with its
    numbers. ``source``: where the names were read, file @ commit (``docs/engines.md`` has the table).
    """

    engine: str
    prefixes: tuple[str, ...]
    maps: tuple[SeriesMap, ...]
    entity_labels: tuple[str, ...] = ()
    note: str = ""
    exact_names: frozenset[str] = frozenset()
    activity: tuple[Source, ...] = ()
    source: str = ""

    def metric_names(self) -> set[str]:
        """Every exposition sample name the table's series read."""
        return {n for m in self.maps for s in m.sources for n in s.names()}

    def claims(self, name: str) -> bool:
        """Whether an exposition sample name belongs to this engine (for detection)."""
        return name.startswith(self.prefixes) or name in self.exact_names
