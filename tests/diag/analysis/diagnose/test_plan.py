"""The step choice of ``ttft diagnose`` (diag.analysis.diagnose.plan) on recorded results: what each
step showed, in order, as ``ttft diagnose`` recorded it against real servers
(``recorded/*.json``: the bundled engine with one request at a time, its defaults, a slow
tokenizer, and transformers serve in plain mode), replayed one step at a time; and on points
built to sit on either side of each stop line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from diag.analysis.diagnose import PlanConfig, Point, confident_stop, goodput, next_step
from diag.analysis.diagnose.limits import limit_from_models
from support.diagnose_points import BASE, LADDER, pt, too_long

RECORDED = Path(__file__).with_name("recorded")


def _recorded(name: str) -> tuple[list[Point], list[dict]]:
    doc = json.loads((RECORDED / f"{name}.json").read_text())
    return [Point.from_dict(p) for p in doc["points"]], doc["steps"]


def _replay(name: str, cfg: PlanConfig | None = None) -> list:
    """The plan's decision after each recorded step (given the points up to it)."""
    cfg = cfg or PlanConfig()
    points, steps = _recorded(name)
    return [next_step(cfg, points[: i + 1], steps[i]["ended_s"]) for i in range(len(points))]




def test_the_run_starts_with_a_lone_request_baseline_then_climbs_the_prompt_ladder() -> None:
    d = next_step(PlanConfig(), [])
    assert d.step is not None and d.step.kind == "baseline" and d.step.stage == "baseline"
    d = next_step(PlanConfig(), [BASE])
    assert d.step is not None and (d.step.kind, d.step.value) == ("prompt", 128)
    assert "fixed part and a per-token part" in d.step.reason


def test_recorded_one_at_a_time_server_climbs_to_a_clear_prompt_fit_then_ramps_past_the_break() -> None:
    decisions = _replay("max_running_1")
    steps = [(d.step.kind, d.step.value) if d.step else None for d in decisions]
    # after the baseline and two rungs the fit is not yet judged (3 rungs); after 512 it is
    assert steps[:3] == [("prompt", 128), ("prompt", 256), ("prompt", 512)]
    assert steps[3] == ("concurrency", 2) and "the per-token cost and the fixed part are measured" in decisions[3].step.reason
    # TTFT broke at 2 in flight: one more level, since two levels cannot tell serialisation from a knee
    assert steps[4] == ("concurrency", 4) and "one more level" in decisions[4].step.reason
    assert steps[5] is None and decisions[5].done.startswith("TTFT broke at concurrency=2")


def test_recorded_default_engine_ramps_while_ttft_holds_then_fills_in_the_levels_the_break_skipped() -> None:
    decisions = _replay("default_engine")
    steps = [(d.step.kind, d.step.value, d.step.stage) if d.step else None for d in decisions]
    assert steps[4] == ("concurrency", 4, "ramp") and "still holding" in decisions[4].step.reason
    assert steps[5] == ("concurrency", 8, "ramp")
    # broke at 8 (TTFT 6.5x, decode halved): the levels between 4 and 8 place the limit
    assert steps[6] == ("concurrency", 5, "refine") and "where capacity runs out at 5 and 7" in decisions[6].step.reason
    assert steps[7] == ("concurrency", 7, "refine")
    assert steps[8] is None and "TTFT broke at concurrency=8" in decisions[8].done


def test_recorded_slow_tokenizer_ramps_on_past_a_rise_that_is_no_knee() -> None:
    # 1 -> 2 -> 4 in flight: TTFT x1.3 then x2.3, a step not 1.8x steeper than the one before it
    # (the rules' knee_sharpness): no knee, and 3.1x the lone request's is no break yet
    decisions = _replay("slow_tokenizer")
    assert decisions[5].step is not None and (decisions[5].step.value, decisions[5].step.stage) == (8, "ramp")
    assert "still holding" in decisions[5].step.reason


def test_a_flat_curve_then_a_cliff_is_a_knee_and_the_levels_inside_it_are_tested() -> None:
    ramp = [pt("concurrency", 2, 0.0105), pt("concurrency", 4, 0.011), pt("concurrency", 8, 0.035)]
    d = next_step(PlanConfig(), [BASE, *LADDER, *ramp], 6.0)
    assert d.step is not None and d.step.stage == "refine" and d.step.value == 5
    assert "serialisation at 5 and 7" in d.step.reason
    d = next_step(PlanConfig(), [BASE, *LADDER, *ramp, pt("concurrency", 5, 0.012), pt("concurrency", 7, 0.02)], 7.0)
    assert d.step is None and d.done.startswith("a knee: TTFT flat to concurrency=4 (1.1x), then x3.2 at concurrency=8")


def test_recorded_transformers_serve_plain_mode_is_ramped_to_three_levels() -> None:
    decisions = _replay("hf_plain")
    assert [d.step.value for d in decisions[3:5]] == [2, 4]
    assert decisions[5].step is None


def test_a_confident_verdict_ends_the_refinement() -> None:
    points, steps = _recorded("default_engine")
    d = next_step(PlanConfig(), points[:7], steps[6]["ended_s"], confident=True)
    assert d.step is None and "TTFT broke at concurrency=8" in d.done


def test_a_rung_refused_as_too_long_is_the_context_limit_and_the_ladder_ends_below_it() -> None:
    d = next_step(PlanConfig(), [BASE, LADDER[0], LADDER[1], too_long(512)], 3.0)
    assert d.learned == {"context_limit_tokens": 512}
    assert d.step is not None and d.step.kind == "concurrency"
    assert "refused as longer than the server's context" in d.step.reason and "stops at 256" in d.step.reason


def test_another_4xx_at_a_rung_is_a_failure_not_the_context_limit() -> None:
    bad = replace(pt("prompt", 512, 0.0, n=4, ok=0, errors={"http_4xx": 4}, error_example="HTTP 400: bad request"),
                  ttft_p50_s=None, ttft_p99_s=None, e2e_p50_s=None)
    d = next_step(PlanConfig(), [BASE, LADDER[0], LADDER[1], bad], 3.0)
    assert "context_limit_tokens" not in d.learned  # not a limit: its refusals stay failures
    assert d.step is not None and d.step.kind == "concurrency"  # the ladder ends there, the run goes on
    assert "every request at prompt=512 failed (http_4xx)" in d.step.reason


def test_the_ladder_stops_below_a_context_limit_from_v1_models() -> None:
    cfg = PlanConfig(context_limit_tokens=300)  # room for 32 output tokens: prompts up to 260
    d = next_step(cfg, [BASE, LADDER[0]], 1.0)
    assert d.step is not None and (d.step.kind, d.step.value) == ("prompt", 256)
    d = next_step(cfg, [BASE, LADDER[0], pt("prompt", 256, 0.03)], 1.5)
    assert d.step is not None and d.step.kind == "concurrency"
    assert "context limit (300 tokens)" in d.step.reason


def test_a_ladder_with_no_room_above_the_users_prompts_steps_down_for_its_fit() -> None:
    """Real vLLM, users' prompts of 1,361 tokens under a 2,048-token context: one rung up (2,023)
    left two lengths and no prompt fit. The ladder then halves from the baseline until a fit can
    be judged, and stops above the shortest rung it allows."""
    cfg = PlanConfig(input_tokens=1361, output_tokens=17, context_limit_tokens=2048)
    base = pt("baseline", 1, 0.104, tokens=1361.0)
    d = next_step(cfg, [base], 1.0)
    assert d.step is not None and (d.step.kind, d.step.value) == ("prompt", 2023)  # climbs first, to the limit
    top = pt("prompt", 2023, 0.150)
    d = next_step(cfg, [base, top], 2.0)
    assert d.step is not None and (d.step.kind, d.step.value) == ("prompt", 680) and "steps down" in d.step.reason
    d = next_step(cfg, [base, top, pt("prompt", 680, 0.052)], 3.0)
    assert d.step is not None and (d.step.kind, d.step.value) == ("prompt", 340)
    d = next_step(cfg, [base, top, pt("prompt", 680, 0.052), pt("prompt", 340, 0.026)], 4.0)
    assert d.step is not None and d.step.kind == "concurrency" and "from 340 to 2023 tokens" in d.step.reason
    # with three lengths answered below the limit, the ladder ends there as before
    d = next_step(replace(cfg, input_tokens=500), [pt("baseline", 1, 0.04, tokens=500.0), pt("prompt", 1000, 0.075),
                                                   pt("prompt", 2000, 0.15)], 3.0)
    assert d.step is not None and d.step.kind == "concurrency"


def test_a_flat_ladder_ends_early_with_the_fixed_part_named() -> None:
    flat = [pt("prompt", v, 0.200) for v in (128, 256, 512)]
    d = next_step(PlanConfig(), [pt("baseline", 1, 0.190), *flat], 3.0)
    assert d.step is not None and d.step.kind == "concurrency" and "hardly grows with the prompt" in d.step.reason
    # a line that fits over 8x the tokens ends it with both parts measured (the fixed part named)
    mid = [pt("prompt", 128, 0.012), pt("prompt", 256, 0.013), pt("prompt", 512, 0.016)]
    d = next_step(PlanConfig(), [BASE, *mid], 3.0)
    assert d.step is not None and d.step.kind == "concurrency" and "fixed part is" in d.step.reason
    # a ladder whose TTFT fits no line (noise) climbs on for more spread
    noisy = [pt("prompt", 128, 0.019), pt("prompt", 256, 0.011), pt("prompt", 512, 0.017)]
    d = next_step(PlanConfig(), [BASE, *noisy], 3.0)
    assert d.step is not None and (d.step.kind, d.step.value) == ("prompt", 1024)


def test_a_rung_that_would_eat_the_ramps_share_of_the_budget_is_not_sent() -> None:
    slow = [pt("prompt", 128, 1.0), pt("prompt", 256, 1.05)]
    d = next_step(PlanConfig(budget_s=20), [pt("baseline", 1, 0.95), *slow], 8.0)
    assert d.step is not None and d.step.kind == "concurrency" and "the ramp needs the rest" in d.step.reason


def test_failures_stop_the_ramp_and_an_error_burst_stops_the_run() -> None:
    some = pt("concurrency", 4, 0.02, n=10, ok=9, errors={"http_5xx": 1})
    d = next_step(PlanConfig(), [BASE, *LADDER, pt("concurrency", 2, 0.012), some], 5.0)
    assert d.step is None and d.done.startswith("requests started failing at concurrency=4 (10%")
    burst = pt("concurrency", 8, 0.02, n=16, ok=4, errors={"http_5xx": 12})
    d = next_step(PlanConfig(), [BASE, *LADDER, pt("concurrency", 4, 0.012), burst], 5.0)
    assert d.step is None and d.done.startswith("error burst: 75%")


def test_every_lone_request_failing_ends_the_run_with_the_kinds() -> None:
    dead = replace(pt("baseline", 1, 0.0, ok=0, errors={"http_4xx": 8}), ttft_p50_s=None)
    d = next_step(PlanConfig(), [dead])
    assert d.step is None and "every lone request failed (http_4xx x8" in d.done


def test_the_budget_the_request_cap_and_the_concurrency_cap_bound_the_run() -> None:
    pts = [BASE, *LADDER]
    assert "budget is spent" in next_step(PlanConfig(budget_s=10), pts, 10.5).done
    assert "request cap (30)" in next_step(PlanConfig(max_requests=30), pts, 2.0, requests_sent=31).done
    held = [BASE, *LADDER, pt("concurrency", 2, 0.011), pt("concurrency", 4, 0.012)]
    d = next_step(PlanConfig(max_concurrency=4), held, 5.0)
    assert d.step is None and d.done.startswith("the server held up to concurrency=4 (the cap)")


def test_a_crossed_slo_ends_the_ramp() -> None:
    over = pt("concurrency", 4, 0.02, slo_met=False, goodput_rps=1.0)
    d = next_step(PlanConfig(), [BASE, *LADDER, pt("concurrency", 2, 0.012, slo_met=True, goodput_rps=5.0), over], 5.0)
    assert d.step is None and d.done == "the SLO was crossed at concurrency=4"


def test_an_open_loop_ramp_starts_below_the_lone_request_service_rate() -> None:
    cfg = PlanConfig(ramp="rate")
    d = next_step(cfg, [BASE, *LADDER], 3.0)
    e2e = BASE.e2e_p50_s
    assert d.step is not None and d.step.kind == "rate"
    assert d.step.value == pytest.approx(0.5 / e2e, rel=0.01)


def test_confidence_ends_the_run_but_never_for_healthy_or_an_outcome() -> None:
    # server spans joined: prefill_compute at 0.80 after the ladder, on a server that runs one
    # request at a time -- concurrency 1 cannot show the queue, so the ramp runs first
    assert confident_stop("prefill_compute", 0.8, [BASE, *LADDER], PlanConfig()) is None
    assert confident_stop("prefill_compute", 0.8, [BASE, *LADDER, pt("concurrency", 2, 0.011)], PlanConfig()) is None
    pts = [BASE, *LADDER, pt("concurrency", 2, 0.011), pt("concurrency", 4, 0.012)]
    assert confident_stop("queue", 0.75, pts, PlanConfig()).startswith("the verdict is confident: queue")
    assert confident_stop("queue", 0.69, pts, PlanConfig()) is None
    for cat in ("healthy", "inconclusive", "failures", "no_data", "loadgen"):
        assert confident_stop(cat, 0.95, pts, PlanConfig()) is None
    # client only: the same queue at 0.75 waits for the design (the long ramp tells it from a KV limit)
    assert confident_stop("queue", 0.75, pts, PlanConfig(), black_box=True) is None


def test_goodput_is_the_best_level_within_the_slo_and_without_failures() -> None:
    pts = [replace(BASE, slo_met=True, goodput_rps=5.0), pt("concurrency", 2, 0.01, slo_met=True, goodput_rps=9.0),
           pt("concurrency", 4, 0.02, slo_met=False, goodput_rps=3.0)]
    g = goodput(pts, {"ttft_p99": 0.05}, "concurrency")
    assert g["held"] == "concurrency=2" and g["goodput_rps"] == 9.0
    assert goodput(pts[2:], {"ttft_p99": 0.05}, "concurrency")["held"] is None
    g = goodput([BASE, pt("concurrency", 2, 0.01, n=16)], None, "concurrency")
    assert g["held"] == "concurrency=2" and g["slo"] is None and "give --slo" in g["why"]


def test_context_limit_from_a_models_listing() -> None:
    vllm = {"object": "list", "data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 8192}]}
    assert limit_from_models(vllm, "b") == 8192 and limit_from_models(vllm, None) == 4096
    assert limit_from_models({"data": [{"id": "m"}]}, "m") is None
    assert limit_from_models({"data": [{"id": "m", "max_model_len": True}]}, "m") is None
    assert limit_from_models("nonsense", None) is None


def test_bad_plan_settings_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="unknown ramp"):
        PlanConfig(ramp="burst")
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        PlanConfig(max_concurrency=0)
