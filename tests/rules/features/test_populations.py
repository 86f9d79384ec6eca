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


def test_the_backlog_behind_start_up_is_start_ups_too() -> None:
    # open-loop arrivals every 100 ms while the model loads for 0.8 s: the first 8 requests all
    # wait for it (not only the first max(3, 2%) the head test looks at); the rest are steady
    ttft = [0.8 - 0.1 * i + 0.02 for i in range(8)] + [0.01 + 0.001 * (i % 3) for i in range(42)]
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=[64] * 50)))
    assert feats.value("cold_start_outliers_n") == 8
    assert feats.value("ttft_p95_s") < 0.02
    assert feats.value("requests_n") == 42


def test_a_slow_request_later_in_the_run_is_not_start_up() -> None:
    # one slow request after the first ones got their first tokens is the steady state's own
    ttft = [0.01 + 0.001 * (i % 3) for i in range(50)]
    ttft[20] = 0.5
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=[64] * 50)))
    assert feats.value("cold_start_outliers_n") == 0
    assert feats.value("requests_n") == 50
