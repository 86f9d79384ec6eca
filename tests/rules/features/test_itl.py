"""rules.features.itl: inter-token latency from token times, else the engine's series."""

from __future__ import annotations

from pathlib import Path

import pytest
from featcap import QUEUE_WINDOW, S, engine_series, make_requests, make_tables
from simcap import Client, Engine, Phase, simulate, tables_of

from rules.features import compute_features


def test_itl_falls_back_to_theengine_series() -> None:
    req = make_requests([0.01] * 10)  # requests with TTFT but no token times (e.g. vLLM's llm_request span)
    fast = dict(QUEUE_WINDOW, **{"itl_s_p50": 0.01, S.SERIES_GENERATION_TOKENS_PER_S: 300.0})
    feats = compute_features(make_tables(req, series=engine_series([QUEUE_WINDOW, fast])))
    assert feats.get("itl_p50_s").source == "prometheus"
    assert feats.value("itl_p50_s") == pytest.approx((100 * 0.02 + 300 * 0.01) / 400)  # weighted by tokens
    assert feats.value("itl_p99_s") == pytest.approx(0.1)
    assert not feats.available("itl_p90_s") and "p50/p99" in feats.get("itl_p90_s").reason
    # no histogram percentiles (llama.cpp: Δ generation seconds / Δ tokens): the windowed mean
    means_only = [{S.SERIES_ITL_S: 0.25, S.SERIES_GENERATION_TOKENS_PER_S: 10.0}] * 3
    feats = compute_features(make_tables(req, series=engine_series(means_only)))
    assert feats.value("itl_p50_s") == pytest.approx(0.25)
    assert not feats.available("itl_p99_s")
    # without the series: the old reason
    assert "token emission times" in compute_features(make_tables(req)).get("itl_p50_s").reason


def test_itl_from_token_times_wins_over_series(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(), [Phase("a", 20, 64, 8, conc=1)], Client())
    tables = tables_of(dirs)
    base = compute_features(tables)
    tables.series = engine_series([QUEUE_WINDOW] * 3, t0=1.0)
    feats = compute_features(tables)
    assert feats.get("itl_p50_s").source == base.get("itl_p50_s").source != "prometheus"
    assert feats.value("itl_p50_s") == pytest.approx(base.value("itl_p50_s"))
