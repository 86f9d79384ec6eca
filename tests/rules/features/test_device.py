"""rules.features.device: device busy, KV usage, the CPU profile."""

from __future__ import annotations

import pandas as pd
import pytest
from support.featcap import NS, make_requests, make_tables

from diag.ground import stages
from rules.features import compute_features


def test_device_busy_prefers_nvml_and_falls_back_to_steps() -> None:
    req = make_requests([0.01] * 10)
    t0 = req["start_ns"].min()
    steps = pd.DataFrame({"start_ns": [t0, t0 + 2e8], "end_ns": [t0 + 1e8, t0 + 3e8]})
    steps["duration_s"] = (steps["end_ns"] - steps["start_ns"]) / NS
    feats = compute_features(make_tables(req, steps))
    assert feats.get("device_busy_frac").source == "engine_steps"
    assert feats.value("device_busy_frac") == pytest.approx(2e8 / 9.2e8, rel=1e-3)  # wall: first request .. last request end
    nvml = pd.DataFrame({"ts_s": [1, 2, 1, 2], "source": "nvml", "series": stages.SERIES_GPU_UTIL_PCT,
                         "entity": ["gpu0", "gpu0", "gpu1", "gpu1"], "value": [100, 80, 20, 0]})
    feats = compute_features(make_tables(req, steps, nvml))
    assert feats.get("device_busy_frac").source == "nvml"
    assert feats.value("device_busy_frac") == pytest.approx(0.5)


def test_kv_from_prometheus_series_and_reasons_without() -> None:
    req = make_requests([0.01] * 10)
    s = pd.DataFrame({"ts_s": range(10), "source": "prometheus", "series": stages.SERIES_KV_USAGE, "entity": "",
                      "value": [0.5] * 8 + [0.95, 0.99]})
    feats = compute_features(make_tables(req, series=s))
    assert feats.value("kv_usage_max") == pytest.approx(0.99)
    assert feats.value("kv_time_above_high_frac") == pytest.approx(0.2)
    assert feats.get("kv_usage_p95").source == "prometheus"
    feats = compute_features(make_tables(req))
    assert "kv_usage_ratio" in feats.get("kv_usage_p95").reason


def test_cpu_profile_shares_from_pyspy_summary() -> None:
    meta = {"pyspy": {"shares": {"idle": 0.5, "tokenize": 0.25}, "busy_shares": {"tokenize": 0.5, "forward": 0.5}}}
    feats = compute_features(make_tables(make_requests([0.01] * 5), meta=meta))
    assert feats.value("cpu_profile_shares") == {"tokenize": 0.5, "forward": 0.5}


def test_comm_share_over_the_requests_that_ran_tensor_parallel() -> None:
    # a TP comparison: TP=1 requests (no collectives, one of them the slowest) and TP=2 ones
    # whose TTFT is 60% collectives; the tail share misses it, the TP requests' share does not
    n = 20
    tp = [1] * 10 + [2] * 10
    ttft = [0.10] * 9 + [0.30] + [0.15] * 10
    comm = [float("nan")] * 10 + [0.09] * 10
    prefill = [0.09] * 10 + [0.05] * 10
    req = make_requests(ttft, tp_size=tp, comm_s=comm, prefill_s=prefill, input_tokens=[500] * n)
    feats = compute_features(make_tables(req))
    assert feats.value("comm_share_tp_ttft") == pytest.approx(0.6)
    assert feats.value("comm_share_tail") == pytest.approx(0.0)
