"""rules.features.prompt_fit: TTFT against prompt length."""

from __future__ import annotations

import pytest
from support.featcap import make_requests, make_tables

from rules import evidence
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
    # the slope stands many standard errors above zero (0.2 ms/token against a +-1 ms scatter)
    assert feats.value("ttft_prompt_slope_t") > 10


def test_a_narrow_prompt_range_with_noisy_ttft_stays_unfitted() -> None:
    tokens = [1033 + 19 * i for i in range(12)]
    ttft = [0.2 + (0.03 if i % 3 == 0 else -0.01 * (i % 3)) for i in range(12)]  # no slope, just noise
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=tokens, queue_s=[0.0] * 12)))
    assert not feats.available("ttft_prompt_r2")
    assert "prompt-length sweep" in feats.get("ttft_prompt_r2").reason


def test_a_diagnose_ladder_is_fitted_per_rung_with_the_baseline_and_without_the_ramps_lone_requests() -> None:
    # ttft diagnose: a lone-request baseline (concurrency=1, 64 tokens) and three ladder rungs whose
    # token counts vary a little per request (the server's tokenizer); then ramp requests that
    # happened to be alone in flight, their TTFT off the line (a pipeline's bubbles, noise): the
    # fit is the rungs' and the baseline's medians, not theirs (seed 31337 draw 12 had R² 0.44)
    rows = [("concurrency=1", 64 + d % 3, 0.010) for d in range(8)]
    rows += [(f"prompt={n}", n + d % 3 - 1, 0.010 + 0.0001 * (n - 64)) for n in (128, 256, 512) for d in range(3)]
    rows += [("concurrency=8", 64, t) for t in (0.060, 0.004, 0.090, 0.002, 0.070, 0.003, 0.080, 0.005, 0.050)]
    seg, tokens, ttft = map(list, zip(*rows))
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=tokens, segment=seg,
                                                       has_client=[True] * len(rows), has_server=[False] * len(rows))))
    assert "per prompt-sweep point" in feats.get("ttft_prompt_r2").source
    assert feats.value("ttft_prompt_r2") > 0.99 and feats.value("ttft_prompt_fit_n") == 17
    assert feats.value("ttft_prompt_slope_ms_per_token") == pytest.approx(0.1, rel=0.02)
    assert feats.value("ttft_prompt_fit_alone_frac") == 1.0


def _ladder_with_a_fixed_part(users: list[int] | None):  # noqa: ANN202
    """ttft diagnose's ladder at 1 in flight behind a 380 ms fixed latency and 3.4 ms a prompt
    token (seed 20261203 r017: a network delay and a slow tokenizer), client only."""
    rows = [("concurrency=1", 29, 0.380 + 0.0034 * 29)] * 6
    rows += [(f"prompt={n}", n, 0.380 + 0.0034 * n) for n in (128, 256, 512) for _ in range(3)]
    seg, tokens, ttft = map(list, zip(*rows))
    n = len(rows)
    meta = {"kind": "diagnose"} | ({"users_workload": {"prompt_tokens": users}} if users else {})
    return make_tables(make_requests(ttft, input_tokens=tokens, segment=seg, has_client=[True] * n,
                                     has_server=[False] * n, client_ttft_s=ttft, itl_p50_s=[0.0067] * n), meta=meta)


def test_prompt_work_is_shared_out_at_the_users_typical_prompt_when_it_is_known() -> None:
    """Over the ladder's rungs (128-512 tokens) prompt work is most of TTFT; at the users' 15-44
    tokens (29 in the middle) it is a fifth: the share that matters is theirs, on the fitted line."""
    theirs = compute_features(_ladder_with_a_fixed_part([15, 44]))
    assert theirs.value("ttft_prompt_explained_frac") == pytest.approx(0.0034 * 29.5 / (0.380 + 0.0034 * 29.5), rel=0.01)
    assert "your users' 29.5-token prompts" in theirs.get("ttft_prompt_explained_frac").source
    assert theirs.value("users_prompt_mid_tokens") == 29.5
    design = compute_features(_ladder_with_a_fixed_part(None))
    assert design.value("ttft_prompt_explained_frac") > 0.5 and not design.available("users_prompt_mid_tokens")


def test_at_the_users_short_prompts_the_fixed_part_is_network_and_the_tokenizer_is_not_the_story() -> None:
    from rules import run_rules

    d = run_rules(_ladder_with_a_fixed_part([15, 44]))
    assert d.named == "network"  # client only, what the rules name (maybe under the verdict floor)
    share = next(e for e in (d.leading or d.verdict).evidence if e.key == evidence.INTERCEPT_SHARE)
    assert share.value == pytest.approx(0.380 / (0.380 + 0.0034 * 29.5), rel=0.01) and "29.5-token" in share.meaning
    tok = next(p.reason for p in d.passed if p.rule_id == "tokenize")
    assert "at your users' 29.5-token prompts prompt work is 21% of TTFT" in tok
    # not knowing the users' prompts, the ladder's lengths stand in for them, as before
    assert run_rules(_ladder_with_a_fixed_part(None)).named == "tokenize"


def test_a_two_length_sweep_pins_the_fixed_part_over_every_request() -> None:
    """Seed 71208 r016: a prompt sweep of 32 and 64 tokens, 7 requests each, TTFT ~495 ms at both.
    The scatter within each length pins the intercept (the fixed part) to a few ms; with two
    lengths a fit of their medians would be exact and say nothing of how well it is pinned."""
    tokens = [32] * 7 + [64] * 7
    ttft = [0.4945 + 0.002 * ((i * 3) % 5 - 2) / 2 + 0.0001 * t for i, t in enumerate(tokens)]
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=tokens, queue_s=[0.0] * 14)))
    assert feats.value("ttft_prompt_fit_n") == 14
    assert feats.value("ttft_prompt_intercept_ms") == pytest.approx(494.5, abs=2.0)
    assert 0 < feats.value("ttft_prompt_intercept_se_ms") < 3.0
    assert feats.value("ttft_prompt_r2") < 1.0  # not the two medians' perfect line
    # three requests at one of the lengths are too few to be a sweep point
    few = compute_features(make_tables(make_requests(ttft[:3] + ttft[7:], input_tokens=tokens[:3] + tokens[7:],
                                                     queue_s=[0.0] * 10)))
    assert not few.available("ttft_prompt_intercept_ms") and "prompt-length sweep" in \
        few.get("ttft_prompt_intercept_ms").reason
