"""rules.features.client: the load generator's health from the probe's meta."""

from __future__ import annotations

from featcap import make_requests, make_tables

from rules.features import compute_features


def test_client_health_from_probe_meta() -> None:
    meta = {"client_health": {"loop_lag_p99_s": 0.03, "cpu_pct_mean": 40.0, "cpu_pct_p90": 97.0, "saturated": True,
                              "thresholds": {"loop_lag_p99_s": 0.02}}}
    feats = compute_features(make_tables(make_requests([0.01] * 5), meta=meta))
    assert feats.value("client_loop_lag_p99_s") == 0.03
    assert feats.value("client_cpu_pct_p95") == 97.0
    assert feats.value("client_saturated_flag") == 1.0
