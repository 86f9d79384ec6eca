"""rules.features.engine_metrics: the engine's /metrics series and the series-only fallback."""

from __future__ import annotations

import numpy as np
import pytest
from support.featcap import QUEUE_WINDOW, S, engine_series, make_requests, make_tables

from rules.features import compute_features


def test_series_fallback_withoutmake_requests() -> None:
    feats = compute_features(make_tables(series=engine_series([QUEUE_WINDOW] * 4)))
    assert feats.value("series_only") == 1.0
    assert feats.value("metrics_windows_n") == 4
    assert feats.value("requests_n") == pytest.approx(4 * 2.0 * 5.0)  # requests_per_s x window length
    assert feats.get("requests_n").source == "prometheus"
    assert feats.value("ttft_p50_s") == pytest.approx(0.9) and feats.value("ttft_p95_s") == pytest.approx(2.0)
    assert feats.value("ttft_p99_s") == pytest.approx(2.5) and feats.value("ttft_mean_s") == pytest.approx(1.0)
    assert feats.value("queue_share_tail") == pytest.approx(0.8) == feats.value("queue_share_median")
    assert feats.value("prefill_share_tail") == pytest.approx(0.15)
    assert feats.value("stage_shares_tail") == pytest.approx({"queue": 0.8, "prefill": 0.15})
    assert feats.value("unattributed_share_tail") == pytest.approx(0.05)
    assert feats.value("stage_tail_mean_s")["queue"] == pytest.approx(0.8)
    for name in ("ttft_p95_s", "queue_share_tail", "prefill_share_tail", "stage_shares_tail"):
        assert feats.get(name).source == "prometheus", name
    assert feats.value("metrics_queue_time_p95_s") == pytest.approx(1.8)
    assert feats.get("waiting_seqs_p95").source == "prometheus" and feats.value("waiting_seqs_max") == 6
    # stages the metrics do not give keep saying why
    assert not feats.available("tokenize_share_tail") and feats.get("tokenize_share_tail").reason


def test_series_means_are_weighted_by_requests_per_window() -> None:
    a = {S.SERIES_REQUESTS_PER_S: 3.0, S.SERIES_TTFT_S: 1.0, S.SERIES_QUEUE_TIME_S: 0.0}
    b = {S.SERIES_REQUESTS_PER_S: 1.0, S.SERIES_TTFT_S: 3.0, S.SERIES_QUEUE_TIME_S: 2.0}
    feats = compute_features(make_tables(series=engine_series([a, b], dt_s=10.0)))
    assert feats.value("requests_n") == pytest.approx(40)
    assert feats.value("metrics_ttft_mean_s") == pytest.approx((3 * 1.0 + 1 * 3.0) / 4)
    assert feats.value("metrics_queue_time_mean_s") == pytest.approx(0.5)
    assert feats.value("queue_share_tail") == pytest.approx(0.5 / 1.5)
    # without a request count every window weighs the same, and requests_n says why it is unknown
    for w in (a, b):
        del w[S.SERIES_REQUESTS_PER_S]
    feats = compute_features(make_tables(series=engine_series([a, b])))
    assert feats.value("metrics_ttft_mean_s") == pytest.approx(2.0)
    assert not feats.available("requests_n") and "request count" in feats.get("requests_n").reason
    # TTFT derived from means only (no buckets, e.g. TGI): percentiles of the window means
    assert feats.value("ttft_p50_s") == pytest.approx(2.0) and feats.get("ttft_p50_s").source == "prometheus"


def test_requests_with_ttft_keep_preferring_spans() -> None:
    ttft = [0.010] * 95 + [0.100] * 5
    req = make_requests(ttft, queue_s=[0.001] * 95 + [0.080] * 5, prefill_s=[0.008] * 95 + [0.015] * 5)
    feats = compute_features(make_tables(req, series=engine_series([QUEUE_WINDOW] * 4)))
    assert feats.value("series_only") == 0.0
    assert feats.value("requests_n") == 100 and feats.get("requests_n").source is None
    assert feats.value("ttft_p50_s") == pytest.approx(0.010) and feats.get("ttft_p50_s").source is None
    assert feats.value("queue_share_tail") == pytest.approx(0.8) and feats.get("queue_share_tail").source is None
    assert feats.value("prefill_share_median") == pytest.approx(0.8)
    # the engine's own numbers are still there, under their own names
    assert feats.value("metrics_queue_share") == pytest.approx(0.8)
    assert feats.value("metrics_requests_n") == pytest.approx(40)


def test_no_series_only_when_all_failed_or_only_one_scrape() -> None:
    req = make_requests([np.nan] * 5, error=["http_503"] * 5)
    feats = compute_features(make_tables(req, series=engine_series([QUEUE_WINDOW] * 3)))
    assert feats.value("series_only") == 0.0 and not feats.available("ttft_p95_s")
    first_only = engine_series([], first={S.SERIES_WAITING: 3.0, S.SERIES_KV_USAGE: 0.5})
    feats = compute_features(make_tables(series=first_only))
    assert feats.value("series_only") == 0.0 and feats.value("metrics_windows_n") == 0


def test_prefill_busy_from_engine_counters() -> None:
    w1 = {S.SERIES_PREFILL_BUSY: 0.9, S.SERIES_PREFILL_S_PER_TOKEN: 0.002, S.SERIES_PROMPT_TOKENS_PER_S: 450.0,
          S.SERIES_DECODE_BUSY: 0.2}
    w2 = {S.SERIES_PREFILL_BUSY: 0.5, S.SERIES_PREFILL_S_PER_TOKEN: 0.001, S.SERIES_PROMPT_TOKENS_PER_S: 500.0,
          S.SERIES_DECODE_BUSY: 0.4}
    feats = compute_features(make_tables(series=engine_series([w1, w2])))
    assert feats.value("series_only") == 1.0
    assert feats.value("prefill_busy_ratio") == pytest.approx(0.7)
    assert feats.value("decode_busy_ratio") == pytest.approx(0.3)
    # Σ seconds / Σ tokens: weighted by the prompt tokens of each window
    assert feats.value("prefill_s_per_token") == pytest.approx((450 * 0.002 + 500 * 0.001) / 950)
    assert not feats.available("ttft_p95_s") and "no TTFT histogram" in feats.get("ttft_p95_s").reason
    assert "prefill_busy_ratio" in compute_features(make_tables()).get("prefill_busy_ratio").reason


def test_busy_seconds_summed_over_slots_count_as_always_busy_not_more() -> None:
    """llama.cpp with --parallel 4: four slots prefilling in one batched forward add 4 s/s, and a
    prompt's seconds land in the window where it finished (3.6 there, 0 around it)."""
    late = [{S.SERIES_PREFILL_BUSY: 0.0, S.SERIES_DECODE_BUSY: 0.2}, {S.SERIES_PREFILL_BUSY: 3.6, S.SERIES_DECODE_BUSY: 0.2},
            {S.SERIES_PREFILL_BUSY: 0.0, S.SERIES_DECODE_BUSY: 0.2}]
    feats = compute_features(make_tables(series=engine_series(late)))
    assert feats.value("prefill_busy_ratio") == pytest.approx(1.0)  # the run's mean 1.2, clipped; not 0.33 per window
    assert "clipped" in feats.get("prefill_busy_ratio").source
    assert feats.value("decode_busy_ratio") == pytest.approx(0.2)
    assert "clipped" not in (feats.get("decode_busy_ratio").source or "")
    spread = [{S.SERIES_PREFILL_BUSY: 0.0}, {S.SERIES_PREFILL_BUSY: 1.5}, {S.SERIES_PREFILL_BUSY: 0.0}]
    assert compute_features(make_tables(series=engine_series(spread))).value("prefill_busy_ratio") == pytest.approx(0.5)
