"""rules.features.concurrency: TTFT against requests in flight, the knee, decode speed."""

from __future__ import annotations

import pytest
from support.featcap import make_requests, make_tables

from rules.features import compute_features


def test_inflight_knee_and_decode_speed() -> None:
    # concurrency sweep labels: TTFT flat to 4, then jumps; decode speed holds
    levels = [1, 2, 4, 8, 16]
    ttft = {1: 0.01, 2: 0.011, 4: 0.012, 8: 0.05, 16: 0.2}
    rows = [(c, ttft[c]) for c in levels for _ in range(5)]
    req = make_requests([t for _, t in rows], segment=[f"concurrency={c}" for c, _ in rows], tpot_s=[0.004] * len(rows))
    feats = compute_features(make_tables(req))
    assert feats.get("ttft_by_inflight").source == "segments"
    assert feats.value("concurrency_knee") == 4
    assert feats.value("concurrency_flat_levels") == 2
    assert feats.value("ttft_knee_jump_ratio") == pytest.approx(0.2 / 0.012)
    assert feats.value("ttft_concurrency_ratio") == pytest.approx(20)
    assert feats.value("decode_speed_hold_ratio") == pytest.approx(1.0)
