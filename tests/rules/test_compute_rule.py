"""rules.compute.prefill_compute from the client's prompt fit, with and without the engine's own
prefill-time histogram (vLLM / SGLang /metrics scraped beside the probe)."""

from __future__ import annotations

from rules import evidence
from rules.base import RuleContext
from rules.compute import prefill_compute
from rules.config import load_thresholds
from rules.features import Feature, Features

#: a lone stream of 1,000-1,800-token prompts: TTFT linear in the prompt, 29 decode steps of prompt work
FIT = {"requests_n": 24.0, "ttft_p95_s": 0.16, "ttft_prompt_r2": 0.97, "ttft_prompt_explained_frac": 1.0,
       "ttft_prompt_slope_ms_per_token": 0.12, "ttft_prompt_intercept_ms": -47.0, "prompt_work_steps_p50": 29.1,
       "prompt_slope_per_itl": 0.02, "inflight_at_arrival_max": 1.0}


def _ctx(prefill_share: float | None, **over: float) -> RuleContext:
    """The lone stream's features; ``over`` replaces or adds features (a span's ``prefill_share_tail``
    makes the capture a server one)."""
    feats = Features()
    for name, value in {**FIT, "metrics_prefill_share": prefill_share, **over}.items():
        feats.add(Feature(name, value, "", value is not None, source="prometheus" if name.startswith("metrics") else "client"))
    th = load_thresholds(None)
    return RuleContext(feats, th["prefill_compute"], th["general"], {}, "prefill_share_tail" not in over)


def test_the_prompt_fit_alone_is_black_box_and_under_the_verdict_floor() -> None:
    out = prefill_compute(_ctx(None))
    assert not isinstance(out, str) and out.black_box and out.confidence < 0.7


def test_the_engines_prefill_histogram_measures_what_the_fit_infers() -> None:
    out = prefill_compute(_ctx(0.95))
    assert not isinstance(out, str) and not out.black_box and out.confidence >= 0.7
    assert "(engine metrics)" in out.title
    row = next(e for e in out.evidence if e.key == evidence.PREFILL_SHARE_METRICS)
    assert row.crossed and row.value == 0.95


def test_a_small_measured_prefill_share_leaves_the_black_box_reading() -> None:
    """The engine says prefill is a fifth of TTFT (the rest waits or is outside it): not measured prompt work."""
    out = prefill_compute(_ctx(0.2))
    assert not isinstance(out, str) and out.black_box and out.confidence < 0.7


#: real vLLM 0.32, one stream of 926-1486-token prompts with its spans joined: prefill 95% of TTFT,
#: the prompt fit loose (an intercept of 30 ms in a 90 ms TTFT)
LOOSE = {"prefill_share_tail": 0.95, "ttft_prompt_r2": 0.69, "ttft_prompt_explained_frac": 0.63, "prompt_work_steps_p50": 22.6}


def test_a_loose_fit_never_makes_a_lone_requests_prefill_span_less_sure() -> None:
    """Alone in flight, a prefill span that is most of TTFT is the request's own forward pass: the
    fit agrees loosely and must not drag the verdict under the floor the span alone reaches."""
    out = prefill_compute(_ctx(None, **LOOSE))
    assert not isinstance(out, str) and not out.black_box and out.confidence >= 0.7
    share_alone = prefill_compute(_ctx(None, **{**LOOSE, "ttft_prompt_r2": None, "ttft_prompt_explained_frac": None}))
    assert not isinstance(share_alone, str) and out.confidence >= share_alone.confidence


def test_with_batch_mates_in_flight_the_loose_fit_still_weighs() -> None:
    """Others in flight could share the prefill steps: the span alone is not the request's own work."""
    out = prefill_compute(_ctx(None, **LOOSE, inflight_at_arrival_max=3.0))
    assert not isinstance(out, str) and out.confidence < 0.7


def test_a_resolved_slope_over_a_narrow_prompt_range_stands_for_r2() -> None:
    """Real vLLM, one stream of 1,000-1,700-token prompts on a busy machine: TTFT followed the
    prompt (slope 5.3 standard errors above zero, all of TTFT prompt-proportional) but the noise over
    that narrow range held R² at 0.56, and the verdict was healthy. A resolved slope stands for R²;
    an unresolved one (2 standard errors) does not."""
    narrow = {"ttft_prompt_r2": 0.56, "ttft_prompt_fit_alone_frac": 1.0}
    out = prefill_compute(_ctx(None, **narrow, ttft_prompt_slope_t=5.3))
    assert not isinstance(out, str) and out.confidence >= 0.7, out
    rows = {e.key: e for e in out.evidence}
    assert rows[evidence.PROMPT_SLOPE_T].crossed and rows[evidence.PROMPT_FIT_R2].threshold is None
    assert isinstance(prefill_compute(_ctx(None, **narrow, ttft_prompt_slope_t=2.0)), str)
