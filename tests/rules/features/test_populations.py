"""rules.features.populations: the steady population without cold-start outliers."""

from __future__ import annotations

from featcap import make_requests, make_tables

from rules.features import compute_features


def test_cold_start_outlier_is_excluded() -> None:
    ttft = [2.0] + [0.01 + 0.001 * (i % 3) for i in range(49)]
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=[64] * 50)))
    assert feats.value("cold_start_outliers_n") == 1
    assert feats.value("cold_start_outlier_ttft_s") == 2.0
    assert feats.value("ttft_p99_s") < 0.02
    assert feats.value("requests_n") == 49
