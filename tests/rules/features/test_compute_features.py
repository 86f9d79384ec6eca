"""rules.features.compute_features: the front door over every theme."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.featcap import make_tables
from support.simcap import MS, Client, Engine, Phase, simulate, tables_of

from rules.features import compute_features


def test_empty_tables_explain_every_missing_feature() -> None:
    feats = compute_features(make_tables())
    assert feats.value("requests_n") == 0
    for name, f in feats.items.items():
        if not f.available:
            assert f.reason, name
    assert "no completed requests" in feats.get("ttft_p95_s").reason


def test_features_of_a_simulated_capture(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(kv_tokens=3 * 96), [Phase(f"concurrency={c}", 20, 64, 32, conc=c) for c in (1, 2, 4, 8)],
                    Client(net_s=1 * MS))
    feats = compute_features(tables_of(dirs))
    assert feats.value("kv_usage_max") <= 1.0 and feats.value("kv_usage_p95") > 0.9
    assert feats.value("client_server_gap_p50_s") == pytest.approx(2 * MS, rel=0.2)
    assert feats.value("sides_n")["joined"] == 80
    assert feats.value("itl_p50_s") > 0
    assert 0 < feats.value("device_busy_frac") <= 1
    assert feats.get("itl_interference_ratio").source.startswith("engine steps")
    # client only: same TTFTs, no server features, and each says why
    fc = compute_features(tables_of(dirs, ("client",)))
    assert fc.value("client_only") == 1.0
    assert fc.value("ttft_p50_s") == pytest.approx(feats.value("ttft_p50_s"))
    assert "client-only" in fc.get("queue_share_tail").reason
    assert fc.get("itl_interference_ratio").source is None or "black box" in fc.get("itl_interference_ratio").source


def test_window_filters_requests_steps_and_series(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(), [Phase("a", 20, 64, 8, conc=1), Phase("b", 20, 64, 8, conc=1)], Client())
    tables = tables_of(dirs)
    req = tables.requests.sort_values("start_ns")
    cut = int(req["start_ns"].iloc[10])
    feats = compute_features(tables, window_ns=(int(req["start_ns"].min()), cut))
    assert feats.value("requests_n") == 10
