"""The LoRA theme: requests sent while only other adapters ran against those joining their own, and
vLLM's deferred share of waiting requests, on hand-built tables whose answer is known."""

from __future__ import annotations

import pytest

from diag.ground import stages
from rules.features import compute_features
from support.featcap import engine_series, make_requests, make_tables


def _roles(joins_s: float, other_s: float, n: int = 8):
    ttft = [joins_s] * n + [other_s] * n + [0.01, 0.02]
    roles = ["joins"] * n + ["other"] * n + ["alone", "alone"]
    lora = ["a", "b"] * n + ["a", "b"] + []
    return make_requests(ttft, lora_role=roles, lora=lora[: len(ttft)])


def test_requests_for_an_adapter_not_running_against_those_joining_theirs():
    f = compute_features(make_tables(_roles(joins_s=0.05, other_s=0.25)))
    assert f.value("lora_joins_ttft_p50_s") == pytest.approx(0.05)
    assert f.value("lora_other_ttft_p50_s") == pytest.approx(0.25)
    assert f.value("lora_other_ttft_x") == pytest.approx(5.0)
    # 8 requests 200 ms beyond the joining median, over 8 x 50 + 8 x 250 + 30 ms of TTFT
    assert f.value("lora_wait_share_of_ttft") == pytest.approx(1.6 / 2.43)
    assert (f.value("lora_joins_n"), f.value("lora_other_n"), f.value("lora_adapters_n")) == (8, 8, 2)


def test_too_few_of_either_role_says_what_to_change():
    f = compute_features(make_tables(_roles(0.05, 0.25, n=2)))
    assert f.value("lora_other_ttft_x") is None and "concurrency above 1" in f.get("lora_other_ttft_x").reason
    f = compute_features(make_tables(make_requests([0.02] * 10)))
    assert "--lora" in f.get("lora_wait_share_of_ttft").reason


def test_the_deferred_share_of_waiting_requests_from_the_engines_metrics():
    w = {stages.SERIES_WAITING: 4.0, stages.SERIES_WAITING_DEFERRED: 3.0}
    series = engine_series([w] * 6, first=w)
    f = compute_features(make_tables(make_requests([0.02] * 10), series=series))
    assert f.value("waiting_deferred_share") == pytest.approx(0.75)
    none = {stages.SERIES_WAITING: 0.0, stages.SERIES_WAITING_DEFERRED: 0.0}
    idle = engine_series([none] * 6, first=none)
    f = compute_features(make_tables(make_requests([0.02] * 10), series=idle))
    assert f.value("waiting_deferred_share") is None and "no request waited" in f.get("waiting_deferred_share").reason
