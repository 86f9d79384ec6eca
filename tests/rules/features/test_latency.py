"""rules.features.latency: TTFT percentiles and the SLO checks."""

from __future__ import annotations

from featcap import make_requests, make_tables

from rules.features import compute_features


def test_slo_checks() -> None:
    feats = compute_features(make_tables(make_requests([0.01] * 99 + [1.0])), slo={"ttft_p50": 0.02, "ttft_max": 0.5})
    checks = feats.value("slo_checks")
    assert checks["ttft_p50"]["met"] is True
    assert checks["ttft_max"]["met"] is False
