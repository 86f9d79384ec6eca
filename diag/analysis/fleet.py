"""Per-replica verdicts: one capture's engine series split by replica, each judged on its own.

A fleet's metrics come from one Prometheus server (``ttft scrape --from-prometheus``, or
``ttft analyze --from-prometheus``): every row of the capture's series carries its replica in
``entity`` (the PromQL ``by`` label, ``instance`` by default). :func:`analyze_fleet` runs the
rule engine once per replica on that replica's rows alone, and once on all of them (the
fleet's verdict), and names the **hot** replica: the one with a bottleneck verdict whose TTFT
p95 (engine metrics, seconds) is highest. Per-request spans, if the capture has any, stay with
the fleet's analysis only: a capture's spans do not say which replica served them (a trace
store's do: :mod:`diag.analysis.fleet_traces` judges each replica on its own spans).

Pure computation on loaded tables; any thread.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import rules
from diag.analysis import Analysis, analyze_captures, load_captures
from diag.ground.capture import CaptureError
from diag.ground.request_table import empty_request_table
from diag.ground.tables import stage_decomposition

#: verdicts that name no bottleneck: a replica with one of these is never the hot one
_NOT_A_BOTTLENECK = frozenset({"healthy", *rules.OUTCOMES})


@dataclass
class Replica:
    """One replica's verdict, from its own rows of the engine series."""

    name: str
    analysis: Analysis
    #: TTFT p95 from the replica's engine metrics, seconds (None: its engine exports none)
    ttft_p95_s: float | None
    #: series rows the replica had in the capture
    rows: int

    @property
    def category(self) -> str:
        d = self.analysis.diagnosis
        return d.verdict.category if d is not None else rules.NO_DATA

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ttft_p95_s": self.ttft_p95_s, "rows": self.rows, **self.analysis.to_dict()}


@dataclass
class FleetAnalysis:
    """The fleet's verdict over every replica's rows, each replica's own, and the hot one."""

    by: str
    fleet: Analysis
    replicas: list[Replica]
    #: the replica with a bottleneck verdict and the highest TTFT p95 (None: no replica has one)
    hot: str | None
    #: read from a trace store (``diag.analysis.fleet_traces``): the database's aggregates over every
    #: request, the slowest requests and what was sampled; None for a capture
    store: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"by": self.by, "hot": self.hot, "fleet": self.fleet.to_dict(),
               "replicas": [r.to_dict() for r in self.replicas]}
        if self.store is not None:
            out["store"] = self.store
        return out


def _ttft_p95_s(analysis: Analysis) -> float | None:
    d = analysis.diagnosis
    v = d.features.value("ttft_p95_s") if d is not None else None
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def split_by_replica(fleet: Analysis, by: str, rules_file: str | None = None,
                     slo: dict[str, float] | None = None) -> FleetAnalysis:
    """Judge each replica (``entity`` value of the series) of an analysed capture on its own rows."""
    series = fleet.tables.series
    names = sorted(str(e) for e in series["entity"].astype(str).unique() if str(e)) if len(series) else []
    replicas: list[Replica] = []
    for name in names:
        rows = series[series["entity"].astype(str) == name]
        tables = dataclasses.replace(fleet.tables, series=rows.reset_index(drop=True),
                                     requests=empty_request_table())
        diagnosis = rules.run_rules(tables, rules_file=rules_file, slo=slo)
        one = Analysis(fleet.paths, tables, stage_decomposition(tables.requests), diagnosis, [], slo)
        replicas.append(Replica(name, one, _ttft_p95_s(one), len(rows)))
    return FleetAnalysis(by, fleet, replicas, hot_replica(replicas))


def hot_replica(replicas: list[Replica]) -> str | None:
    """The replica with a bottleneck verdict and the highest TTFT p95 (None: no replica has one)."""
    hot_ones = [r for r in replicas if r.category not in _NOT_A_BOTTLENECK and r.ttft_p95_s is not None]
    return max(hot_ones, key=lambda r: r.ttft_p95_s or 0.0).name if hot_ones else None


def analyze_fleet(paths: list[str], by: str = "instance", rules_file: str | None = None,
                  slo: dict[str, float] | None = None) -> FleetAnalysis:
    """Load captures, analyse them joined (the fleet), then each replica of their series.

    Raises CaptureError when the series name no replica (nothing to split)."""
    fleet = analyze_captures(load_captures(list(paths)), rules_file=rules_file, slo=slo)
    out = split_by_replica(fleet, by, rules_file, slo)
    if not out.replicas:
        raise CaptureError(f"{', '.join(map(str, paths))}: no engine series with a replica ({by}) label to split "
                           "(scrape a Prometheus server with `ttft scrape --from-prometheus`, or give --entity)")
    return out


__all__ = ["FleetAnalysis", "Replica", "analyze_fleet", "hot_replica", "split_by_replica"]
