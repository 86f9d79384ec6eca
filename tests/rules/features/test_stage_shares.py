"""rules.features.stage_shares: where TTFT goes, slowest 5% and median."""

from __future__ import annotations

import pytest
from support.featcap import make_requests, make_tables

from rules.features import compute_features


def test_percentiles_and_stage_shares() -> None:
    ttft = [0.010] * 95 + [0.100] * 5
    queue = [0.001] * 95 + [0.080] * 5
    prefill = [0.008] * 95 + [0.015] * 5
    feats = compute_features(make_tables(make_requests(ttft, queue_s=queue, prefill_s=prefill, tokenize_s=[0.001] * 100)))
    assert feats.value("ttft_p50_s") == pytest.approx(0.010)
    assert feats.value("queue_share_tail") == pytest.approx(0.8)
    assert feats.value("queue_share_median") == pytest.approx(0.1)
    assert feats.value("prefill_share_median") == pytest.approx(0.8)
    shares = feats.value("stage_shares_tail")
    assert sum(shares.values()) + feats.value("unattributed_share_tail") == pytest.approx(1.0)
    assert not feats.available("comm_share_tail")
    assert "comm" in feats.get("comm_share_tail").reason
