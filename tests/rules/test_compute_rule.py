"""rules.compute.prefill_compute from the client's prompt fit, with and without the engine's own
prefill-time histogram (vLLM / SGLang /metrics scraped beside the probe); comm's checks, the
engine's collective time before the TP degrees compared."""

from __future__ import annotations

from pathlib import Path

import rules.compute  # noqa: F401  (registers prefill_compute and comm)
from rules import evidence
from rules.base import REGISTRY, RuleContext, checks_of
from rules.features import Feature, Features
from support.rulectx import applying, capture_context, features_of, rule_context

prefill_compute = REGISTRY["prefill_compute"].evaluate

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
    return rule_context("prefill_compute", feats, client_only="prefill_share_tail" not in over)


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


SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def _sample(*captures: str) -> RuleContext:
    """A context of ``samples/prefill_compute``'s ``captures`` (joined when several), default thresholds."""
    return capture_context("prefill_compute", [SAMPLES / "prefill_compute" / c for c in captures])


def _first_applicable(ctx: RuleContext) -> str:
    return applying("prefill_compute", ctx)[0]


def test_the_checks_are_tried_spans_then_fit_then_busy() -> None:
    assert [c.id for c in checks_of("prefill_compute")] == [
        "prefill_compute.spans", "prefill_compute.fit", "prefill_compute.busy"]
    assert REGISTRY["prefill_compute"].needs == (("prefill_share_tail",),
                                                 ("ttft_prompt_r2", "ttft_prompt_explained_frac"),
                                                 ("prefill_busy_ratio",))


def test_the_prefill_span_answers_before_the_prompt_fit_of_the_same_capture() -> None:
    ctx = _sample("client", "server-0")
    assert _first_applicable(ctx) == "prefill_compute.spans" and ctx.has("ttft_prompt_r2")
    out = prefill_compute(ctx)
    assert not isinstance(out, str) and not out.black_box
    rows = {e.key: e for e in out.evidence}
    assert [e.key for e in out.evidence][:2] == [evidence.stage_share_tail("prefill"), evidence.PROMPT_FIT_R2]
    share = rows[evidence.stage_share_tail("prefill")]
    assert share.crossed and share.value == ctx.v("prefill_share_tail") and share.threshold == ctx.th["share_min"]
    assert evidence.SLOPE_PER_ITL not in rows  # the black-box fit's per-token check is not asked


def test_the_client_alone_is_judged_by_the_prompt_fit() -> None:
    ctx = _sample("client")
    assert _first_applicable(ctx) == "prefill_compute.fit"
    out = prefill_compute(ctx)
    assert not isinstance(out, str) and out.black_box
    rows = {e.key: e for e in out.evidence}
    assert rows[evidence.PROMPT_FIT_R2].crossed and rows[evidence.PROMPT_FIT_R2].value == ctx.v("ttft_prompt_r2")
    assert rows[evidence.SLOPE_PER_ITL].crossed and rows[evidence.SLOPE_PER_ITL].op == "<"


def test_the_prompt_seconds_counter_answers_only_without_a_prompt_fit() -> None:
    busy = {"prefill_busy_ratio": 0.9, "ttft_prompt_r2": None, "ttft_prompt_explained_frac": None}
    out = prefill_compute(_ctx(None, **busy))
    assert not isinstance(out, str) and [e.key for e in out.evidence] == [evidence.PREFILL_BUSY_RATIO]
    assert out.evidence[0].value == 0.9 and out.explained_s is None
    # a fit whose prompt-proportional part is unknown is still the fit's to judge, not the counter's
    assert prefill_compute(_ctx(None, **{**busy, "ttft_prompt_r2": 0.97})) == (
        "TTFT vs prompt length: R² 0.97, prompt-proportional part -")


comm = REGISTRY["comm"].evaluate


def _comm_ctx(black_box: bool = False, **features: float | None) -> RuleContext:
    return rule_context("comm", features_of({"requests_n": 40.0, "ttft_p95_s": 1.0, **features}, source="client"),
                        black_box)


def test_comms_checks_are_tried_spans_then_tp() -> None:
    assert [c.id for c in checks_of("comm")] == ["comm.spans", "comm.tp"]
    assert REGISTRY["comm"].needs == (("comm_share_of_prefill",), ("tp_ttft_ratio",))


def test_a_large_collective_share_shows_the_tp_comparison_beside_it() -> None:
    out = comm(_comm_ctx(comm_share_of_prefill=0.5, tp_ttft_ratio=1.5, comm_share_tail=0.2))
    assert not isinstance(out, str) and not out.black_box
    assert [(e.key, e.value) for e in out.evidence] == [(evidence.COMM_SHARE_PREFILL, 0.5), (evidence.TP_SLOPE_X, 1.5)]
    assert out.explained_pct == 20.0


def test_a_small_collective_share_lets_the_tp_comparison_answer() -> None:
    out = comm(_comm_ctx(black_box=True, comm_share_of_prefill=0.1, tp_ttft_ratio=2.0))
    assert not isinstance(out, str)
    assert [e.key for e in out.evidence] == [evidence.TP_SLOPE_X]
    assert not out.black_box and out.note is None  # the engine's collective time was measured, though small
    client = comm(_comm_ctx(black_box=True, tp_ttft_ratio=2.0))
    assert not isinstance(client, str) and client.black_box and client.explained_pct == 50.0
    both = comm(_comm_ctx(comm_share_of_prefill=0.1, tp_ttft_ratio=1.0))
    assert isinstance(both, str) and both.count("; ") == 1  # both checks' reasons, joined
