"""rules.features.prompt_fit: TTFT against prompt length."""

from __future__ import annotations

import pytest
from featcap import make_requests, make_tables

from rules.features import compute_features


def test_prompt_fit_on_requests_that_did_not_queue() -> None:
    tokens = [100, 200, 400, 800, 1600] * 4
    ttft = [0.002 + 0.0001 * t for t in tokens]
    queue = [0.0] * 20
    # two queued requests far off the line are left out of the fit
    tokens += [100, 100]
    ttft += [1.0, 1.0]
    queue += [0.99, 0.99]
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=tokens, queue_s=queue)))
    assert feats.value("ttft_prompt_slope_ms_per_token") == pytest.approx(0.1, rel=1e-6)
    assert feats.value("ttft_prompt_intercept_ms") == pytest.approx(2.0, rel=1e-6)
    assert feats.value("ttft_prompt_r2") == pytest.approx(1.0)
    assert feats.value("ttft_prompt_fit_n") == 20


def test_prompt_fit_needs_varied_prompts() -> None:
    feats = compute_features(make_tables(make_requests([0.01] * 20, input_tokens=[64] * 20, queue_s=[0.0] * 20)))
    assert not feats.available("ttft_prompt_r2")
    assert "prompt-length sweep" in feats.get("ttft_prompt_r2").reason


def test_parameters_come_from_the_rules_toml_and_params_override_them() -> None:
    from rules.config import default_feature_params, default_thresholds

    assert default_feature_params() == default_thresholds()["features"]
    assert default_feature_params()["min_fit_requests"] == 5
    tokens = [100, 200, 400, 800, 1600] * 4
    req = make_requests([0.002 + 0.0001 * t for t in tokens], input_tokens=tokens, queue_s=[0.0] * 20)
    assert compute_features(make_tables(req)).available("ttft_prompt_r2")
    feats = compute_features(make_tables(req), params={"min_fit_requests": 1000})
    assert not feats.available("ttft_prompt_r2") and "needs 1000" in feats.get("ttft_prompt_r2").reason


def test_a_narrow_prompt_range_fits_when_the_slope_is_resolved() -> None:
    # one workload's spread (1033..1261 tokens, a 20%-of-mean range is not reached), TTFT
    # clearly growing with the prompt: the fit resolves the slope
    tokens = [1033 + 19 * i for i in range(12)]
    ttft = [0.02 + 0.0002 * t + (0.001 if i % 2 else -0.001) for i, t in enumerate(tokens)]
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=tokens, queue_s=[0.0] * 12)))
    assert feats.available("ttft_prompt_r2")
    assert feats.value("ttft_prompt_slope_ms_per_token") == pytest.approx(0.2, rel=0.1)
    assert feats.value("ttft_prompt_explained_frac") <= 1.0


def test_a_narrow_prompt_range_with_noisy_ttft_stays_unfitted() -> None:
    tokens = [1033 + 19 * i for i in range(12)]
    ttft = [0.2 + (0.03 if i % 3 == 0 else -0.01 * (i % 3)) for i in range(12)]  # no slope, just noise
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=tokens, queue_s=[0.0] * 12)))
    assert not feats.available("ttft_prompt_r2")
    assert "prompt-length sweep" in feats.get("ttft_prompt_r2").reason
