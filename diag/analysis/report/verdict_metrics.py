"""The live verdict as Prometheus metrics (``ttft watch --expose``), so an alert can fire on a
bottleneck before users complain.

Families (gauges; times in seconds, shares 0..1):

- ``ttft_verdict{category}``: 1 for the verdict's category, 0 for every other category and
  outcome (:func:`verdict_states`: the rules' categories, ``healthy``, ``no_data``, ``inconclusive``,
  ``failures``), so ``ttft_verdict{category="queue"} == 1`` is an alert rule;
- ``ttft_verdict_confidence``: the verdict's confidence;
- ``ttft_leading_candidate{category}``: 1 for the cause that leads below the verdict floor (the
  verdict is then ``healthy`` or ``inconclusive``, ``rules.verdict``), 0 for the others;
- ``ttft_finding_confidence{category,rule}`` and ``ttft_finding_explained_seconds{category,rule}``:
  every finding, ranked or not;
- ``ttft_stage_share{stage}``: each stage's share of TTFT over the window's requests;
- ``ttft_time_to_first_token_seconds{quantile}``: TTFT p50/p95/p99 over the window;
- ``ttft_window_requests``: completed requests the verdict is over;
- ``ttft_verdict_timestamp_seconds``: when the verdict was taken (Unix s): a stale verdict is
  visible as an old timestamp.

Pure function of one diagnosis; any thread. Text via ``prometheus_client``'s own exposition.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

import rules

_QUANTILES = {"0.5": "p50", "0.95": "p95", "0.99": "p99"}


def _named() -> tuple[str, ...]:
    """The categories a diagnosis can name: the rules' (:func:`rules.categories`, in the order the
    rules register), then ``healthy``."""
    return (*rules.categories(), rules.HEALTHY)


def verdict_states() -> tuple[str, ...]:
    """Every value ``ttft_verdict{category}`` takes (so an absent series never hides a state): the
    categories a diagnosis can name, then the measurement's outcomes."""
    return (*_named(), *rules.OUTCOMES)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


class _Snapshot(Collector):
    """One diagnosis' families (built once per exposition)."""

    def __init__(self, d: rules.Diagnosis, decomposition: Mapping[str, Any], taken_unix_s: float) -> None:
        self.d, self.dec, self.taken = d, decomposition, taken_unix_s

    def collect(self) -> Iterator[GaugeMetricFamily]:
        v = self.d.verdict
        verdict = GaugeMetricFamily("ttft_verdict", "1 for the live verdict's category, 0 for the others",
                                    labels=["category"])
        for state in verdict_states():
            verdict.add_metric([state], 1.0 if v.category == state else 0.0)
        yield verdict
        yield GaugeMetricFamily("ttft_verdict_confidence", "confidence of the live verdict (0..1)",
                                value=float(v.confidence))
        lead = GaugeMetricFamily("ttft_leading_candidate", "1 for the cause leading under the verdict floor "
                                 "(the verdict is then healthy or inconclusive), 0 for the others", labels=["category"])
        for cat in _named():
            lead.add_metric([cat], 1.0 if self.d.leading is not None and self.d.leading.category == cat else 0.0)
        yield lead
        conf = GaugeMetricFamily("ttft_finding_confidence", "confidence of each finding (0..1)",
                                 labels=["category", "rule"])
        explained = GaugeMetricFamily("ttft_finding_explained_seconds", "TTFT p95 time each finding explains",
                                      labels=["category", "rule"])
        for f in self.d.findings:
            conf.add_metric([f.category, f.rule_id], float(f.confidence))
            if _num(f.explained_s) is not None:
                explained.add_metric([f.category, f.rule_id], float(f.explained_s))
        yield conf
        yield explained
        share = GaugeMetricFamily("ttft_stage_share", "each stage's share of TTFT over the window",
                                  labels=["stage"])
        for stage, row in (self.dec.get("stages") or {}).items():
            s = _num(row.get("share_of_ttft"))
            if s is not None:
                share.add_metric([stage], s)
        yield share
        ttft = GaugeMetricFamily("ttft_time_to_first_token_seconds", "TTFT over the window's requests",
                                 labels=["quantile"])
        for q, key in _QUANTILES.items():
            val = _num((self.dec.get("ttft_s") or {}).get(key))
            if val is not None:
                ttft.add_metric([q], val)
        yield ttft
        yield GaugeMetricFamily("ttft_window_requests", "completed requests in the verdict's window",
                                value=float(self.dec.get("requests") or 0))
        yield GaugeMetricFamily("ttft_verdict_timestamp_seconds", "when the live verdict was taken (Unix s)",
                                value=float(self.taken))


def verdict_exposition(d: rules.Diagnosis, decomposition: Mapping[str, Any], taken_unix_s: float) -> bytes:
    """Prometheus text (format 0.0.4) of one diagnosis and its window's stage decomposition."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(d, decomposition, taken_unix_s))
    return generate_latest(registry)


__all__ = ["verdict_exposition", "verdict_states"]
