"""``ttft diagnose``'s follow-ups (diag.analysis.diagnose.followups), chosen by its plan after the ladder and the
ramp: the repeated-prefix design, the long ramp, long prompts mixed among short streams and longer
answers, each on points built to sit on either side of its start line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from diag.analysis.diagnose import PlanConfig, Step, next_step
from diag.analysis.diagnose.followups import UNFIT
from support.diagnose_points import BASE, LADDER, pt, too_long

CAPPED = PlanConfig(max_concurrency=1)  # no ramp level: the design ends after the ladder

def test_when_prompt_work_leads_a_repeated_prefix_follows_the_design_sized_from_the_longest_rung() -> None:
    d = next_step(CAPPED, [BASE, *LADDER], 5.0, leading="prefill_compute")
    assert d.step is not None and (d.step.kind, d.step.stage) == ("prefix", "follow-up")
    assert d.step.value == 512 - CAPPED.input_tokens and d.step.requests == 12
    assert "(the cap)" in d.step.reason and "prefix caching" in d.step.reason
    ps = d.step.probe_step(CAPPED)
    assert ps.shared_prefix == (448, 3) and ps.concurrency == 1 and ps.input_tokens == "fixed:512"
    # it ran: the design ends
    done = next_step(CAPPED, [BASE, *LADDER, pt("prefix", 448, 0.06, n=12)], 8.0, leading="prefill_compute")
    assert done.step is None and "(the cap)" in (done.done or "")


def test_the_users_prefix_sizes_the_follow_up_and_none_skips_it() -> None:
    # --workload shared_prefix=200: their prefix, not the longest rung's
    d = next_step(replace(CAPPED, users_shared_prefix_tokens=200), [BASE, *LADDER], 5.0, leading="prefill_compute")
    assert d.step is not None and d.step.kind == "prefix" and d.step.value == 200
    # longer than the ladder reached: as long as it reached
    d = next_step(replace(CAPPED, users_shared_prefix_tokens=4000), [BASE, *LADDER], 5.0, leading="prefill_compute")
    assert d.step is not None and d.step.value == 512 - CAPPED.input_tokens
    # shared_prefix=0: no cache would reach them, no test
    assert next_step(replace(CAPPED, users_shared_prefix_tokens=0), [BASE, *LADDER], 5.0,
                     leading="prefill_compute").step is None


@pytest.mark.parametrize("leading", ["queue", "kv_cache", None])
def test_no_prefix_follow_up_when_something_else_leads(leading) -> None:
    assert next_step(CAPPED, [BASE, *LADDER], 5.0, leading=leading).step is None


#: a ladder whose TTFT barely grows: prompt work is a small part of TTFT
FLAT_LADDER = [pt("prompt", 128, 0.011), pt("prompt", 256, 0.013), pt("prompt", 512, 0.018)]


@pytest.mark.parametrize("leading", ["healthy", "inconclusive"])
def test_with_no_cause_named_prompt_work_leads_when_the_ladder_grew(leading) -> None:
    """Healthy (nothing waited in the experiment) or inconclusive: the ladder's TTFT growing 6x to its
    longest rung still says prompt work leads, and what a repeated prefix saves is tested; a ladder
    that grew 1.8x does not."""
    d = next_step(CAPPED, [BASE, *LADDER], 5.0, leading=leading)
    assert d.step is not None and d.step.kind == "prefix"
    assert f"prompt work leads ({leading}, but TTFT grew 6.0x to 512-token prompts" in d.step.reason
    assert next_step(CAPPED, [BASE, *FLAT_LADDER], 5.0, leading=leading).step is None


def test_no_prefix_follow_up_on_a_failing_server_a_short_ladder_or_without_the_budget() -> None:
    cfg = PlanConfig(max_concurrency=2)
    failing = pt("concurrency", 2, 0.02, n=8, ok=6, errors={"http_5xx": 2})
    d = next_step(cfg, [BASE, *LADDER, failing], 5.0, leading="prefill_compute")
    assert d.step is None or d.step.kind != "prefix"
    small = replace(CAPPED, context_limit_tokens=200)  # the ladder tops out at 128 tokens: a prefix of 64 says little
    assert next_step(small, [BASE, pt("prompt", 128, 0.017), pt("prompt", 32, 0.008)], 5.0,
                     leading="prefill_compute").step is None
    assert next_step(replace(CAPPED, budget_s=5.5), [BASE, *LADDER], 5.0, leading="prefill_compute").step is None


RAMPED = PlanConfig(max_concurrency=8)
SHORT_RAMP = [pt("concurrency", 2, 0.011), pt("concurrency", 4, 0.012), pt("concurrency", 8, 0.013)]


@pytest.mark.parametrize("leading", ["prefill_compute", "kv_cache", "queue", "inconclusive"])
def test_after_the_ramp_a_long_ramp_tells_a_token_limit_from_a_request_limit(leading) -> None:
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP], 6.0, leading=leading)
    assert d.step is not None and (d.step.kind, d.step.value, d.step.stage) == ("long", 1, "follow-up")
    assert "256-token prompts" in d.step.reason and "limit in tokens" in d.step.reason
    ps = d.step.probe_step(RAMPED)
    assert ps.concurrency == 1 and ps.input_tokens == "fixed:256" and ps.segment == "long=1"
    # it climbs 1, 2, 3, 4, 6, 8 (the short ramp's top) while TTFT holds, whatever leads meanwhile
    ran = [pt("long", v, 0.030 * (1 + 0.05 * v), tokens=256) for v in (1, 2, 3, 4, 6)]
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *ran], 9.0, leading="healthy")
    assert d.step is not None and (d.step.kind, d.step.value) == ("long", 8)


def test_beneath_a_healthy_verdict_prompt_work_that_grew_on_the_ladder_runs_the_long_ramp() -> None:
    """Nothing waited at the short prompts, but TTFT grew 6x on the ladder: longer prompts hold more
    tokens, and a limit in tokens the short ramp never reached may bite them. A flat ladder (1.8x)
    leaves a healthy verdict alone."""
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP], 6.0, leading="healthy")
    assert d.step is not None and (d.step.kind, d.step.value) == ("long", 1)
    assert "prompt work leads (healthy, but TTFT grew 6.0x to 512-token prompts" in d.step.reason
    assert "limit in tokens" in d.step.reason
    d = next_step(RAMPED, [BASE, *FLAT_LADDER, *SHORT_RAMP], 6.0, leading="healthy")
    assert d.step is None or d.step.kind != "long"


def test_a_long_prompt_refused_as_longer_than_the_context_ends_the_long_ramp() -> None:
    refused = replace(pt("long", 1, 0.0, n=0, ok=0, over_context=3, tokens=256), ttft_p50_s=None, ttft_p99_s=None,
                      e2e_p50_s=None)
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, refused], 7.0, leading="prefill_compute")
    assert d.step is None or d.step.kind != "long"


def test_a_step_names_the_prompt_length_it_chose_past_the_users_own() -> None:
    """What a too-long refusal means: the experiment's limit for a length the design chose, a
    failure for the users' own (the baseline's and the ramp's)."""
    cfg = PlanConfig(input_tokens=100)
    chosen = {k: Step(k, v, 4, "x", "").chosen_prompt_tokens(cfg)
              for k, v in (("baseline", 1), ("concurrency", 4), ("prompt", 800), ("long", 3), ("longout", 128),
                           ("mixed", 1500), ("prefix", 400))}
    assert chosen == {"baseline": None, "concurrency": None, "prompt": 800, "long": cfg.long_prompt_tokens,
                      "longout": cfg.long_prompt_tokens, "mixed": 1500, "prefix": 500}


def test_when_client_timing_is_invalid_the_long_ramp_still_counts_the_streams_decoding_at_once() -> None:
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP], 6.0, leading="loadgen")
    assert d.step is not None and (d.step.kind, d.step.value) == ("long", 1)
    assert "client's timing is invalid" in d.step.reason and "decode at once" in d.step.reason
    # the follow-ups read from TTFT alone do not run on it
    assert next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN], 12.0, leading="loadgen").step is None


def test_the_long_ramp_ends_where_ttft_breaks_past_12_in_flight_and_not_on_a_failing_or_cramped_server() -> None:
    ran = [pt("long", v, 0.030 * (1 + 0.05 * v), tokens=256) for v in (1, 2)]
    broke = [*ran, pt("long", 3, 0.300, tokens=256)]
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *broke], 9.0, leading="prefill_compute")
    assert d.step is not None and (d.step.kind, d.step.value) == ("long", 4)  # below 12: on, to see a cap
    wide = PlanConfig(max_concurrency=16)
    short = [*SHORT_RAMP, pt("concurrency", 16, 0.02)]
    mid = [*ran, *(pt("long", v, 0.040, tokens=256) for v in (3, 4, 6))]
    d = next_step(wide, [BASE, *LADDER, *short, *mid, pt("long", 8, 0.400, tokens=256)], 9.0, leading="prefill_compute")
    assert d.step is not None and (d.step.kind, d.step.value) == ("long", 12)  # a cap of 5 or 6 shows there
    high = [*mid, pt("long", 8, 0.050, tokens=256), pt("long", 12, 0.400, tokens=256)]
    d = next_step(wide, [BASE, *LADDER, *short, *high], 9.0, leading="prefill_compute")
    assert d.step is None or d.step.kind != "long"
    failing_long = [*ran, pt("long", 3, 0.05, ok=6, errors={"http_5xx": 2}, tokens=256)]
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *failing_long], 9.0, leading="prefill_compute")
    assert d.step is None or d.step.kind != "long"
    failing = [*SHORT_RAMP[:2], pt("concurrency", 8, 0.02, ok=6, errors={"http_5xx": 2})]
    d = next_step(RAMPED, [BASE, *LADDER, *failing], 6.0, leading="prefill_compute")
    assert d.step is None or d.step.kind != "long"
    cramped = replace(RAMPED, context_limit_tokens=150)  # 4x the prompt would not fit
    d = next_step(cramped, [BASE, pt("prompt", 100, 0.015), *SHORT_RAMP], 6.0, leading="prefill_compute")
    assert d.step is None or d.step.kind != "long"
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP], 6.0, leading="decode")
    assert d.step is None or d.step.kind != "long"


LONG_RAN = [pt("long", v, 0.030 * (1 + 0.05 * v), tokens=256) for v in (1, 2, 3, 4, 6, 8)]


def _lone_ttft_s(tokens: float) -> float:
    """The ladder's straight line (BASE and LADDER) at ``tokens``."""
    from diag.analysis.diagnose.ladder import prompt_fit

    slope, icpt, _ = prompt_fit([BASE, *LADDER])
    return icpt + slope * tokens


def test_when_prompt_work_leads_long_prompts_are_mixed_among_short_streams_sized_from_the_ladder() -> None:
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN], 12.0, leading="prefill_compute")
    assert d.step is not None and (d.step.kind, d.step.stage) == ("mixed", "follow-up")
    # the long prompt's lone TTFT is 20x the baseline's, by the ladder's fit
    assert _lone_ttft_s(d.step.value) == pytest.approx(20 * BASE.ttft_p50_s, rel=0.02)
    assert "head-of-line" in d.step.reason and "interference" in d.step.reason
    ps = d.step.probe_step(RAMPED)
    assert ps.concurrency == 4 and ps.inject_long == (int(d.step.value), 4) and ps.input_tokens == "fixed:64"
    assert ps.output_tokens == "uniform:16-48" and ps.segment == f"mixed={d.step.value:g}"
    # it ran: next the prefix follow-up, never the mixed one again
    ran = pt("mixed", d.step.value, 0.05, n=48)
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN, ran], 15.0, leading="prefill_compute")
    assert d.step is not None and d.step.kind == "prefix"


def test_with_an_itl_target_the_long_prompt_prefills_for_twice_it_below_the_context_limit() -> None:
    cfg = replace(RAMPED, itl_target_s=0.15)
    # (the long ramp ran first: prompt work leads beneath the healthy verdict)
    d = next_step(cfg, [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN], 8.0, leading="healthy")
    assert d.step is not None and d.step.kind == "mixed" and "ITL target of 150.0 ms" in d.step.reason
    assert _lone_ttft_s(d.step.value) == pytest.approx(0.300, rel=0.02)  # above 20x the baseline's 10 ms
    tight = replace(cfg, itl_target_s=0.5, context_limit_tokens=2048)
    d = next_step(tight, [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN], 8.0, leading="healthy")
    assert d.step is not None and d.step.value == tight.prompt_limit_tokens  # 1 s of prefill would not fit
    # a rung the server refused bounds it too
    d = next_step(cfg, [BASE, *LADDER, too_long(1024), *SHORT_RAMP, *LONG_RAN], 8.0, leading="healthy")
    assert d.step is not None and d.step.kind == "mixed" and d.step.value < 1024


@pytest.mark.parametrize("leading,itl_target_s,ladder", [("healthy", None, FLAT_LADDER), ("decode", None, LADDER),
                                                         ("queue", 0.05, LADDER), ("kv_cache", None, LADDER)])
def test_no_mixed_follow_up_when_nothing_it_decides_leads(leading, itl_target_s, ladder) -> None:
    cfg = replace(RAMPED, itl_target_s=itl_target_s)
    d = next_step(cfg, [BASE, *ladder, *SHORT_RAMP, *LONG_RAN], 12.0, leading=leading)
    assert d.step is None or d.step.kind != "mixed"


def test_no_mixed_follow_up_before_a_ramp_on_a_failing_server_or_a_cramped_context() -> None:
    assert next_step(CAPPED, [BASE, *LADDER], 5.0, leading="prefill_compute").step.kind == "prefix"
    failing = [*SHORT_RAMP[:2], pt("concurrency", 8, 0.02, ok=6, errors={"http_5xx": 2})]
    d = next_step(RAMPED, [BASE, *LADDER, *failing], 6.0, leading="prefill_compute")
    assert d.step is None or d.step.kind != "mixed"
    cramped = replace(RAMPED, context_limit_tokens=250)  # no room for 4x the 64-token prompt
    d = next_step(cramped, [BASE, pt("prompt", 128, 0.017), *SHORT_RAMP], 6.0, leading="prefill_compute")
    assert d.step is None or d.step.kind != "mixed"


@pytest.mark.parametrize("leading", ["kv_cache", "queue"])
def test_after_a_capped_long_ramp_longer_answers_tell_a_limit_from_a_stage_taking_prompts_one_at_a_time(
        leading) -> None:
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN], 12.0, leading=leading)
    assert d.step is not None and (d.step.kind, d.step.stage) == ("longout", "follow-up")
    assert d.step.value == 4 * RAMPED.output_tokens and d.step.requests == 16  # 2 rounds at 8 in flight
    assert "one at a time before the engine" in d.step.reason
    ps = d.step.probe_step(RAMPED)
    assert (ps.concurrency, ps.input_tokens, ps.output_tokens, ps.segment) == (8, "fixed:256", "fixed:128",
                                                                               "longout=128")
    ran = pt("longout", d.step.value, 0.05, n=16, tokens=256)
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN, ran], 20.0, leading=leading)
    assert d.step is None or d.step.kind != "longout"


def test_longer_answers_outlast_a_long_prompts_per_token_part_within_the_context() -> None:
    # a prompt token costs 1 ms at concurrency 1: a stage taking the 256-token prompt one at a time
    # could spend 256 ms on it, so the answers decode for 3x that: 192 tokens at 4 ms
    steep = [pt("prompt", v, 0.010 + 0.001 * (v - 64)) for v in (128, 256, 512)]
    d = next_step(RAMPED, [BASE, *steep, *SHORT_RAMP, *LONG_RAN], 12.0, leading="kv_cache")
    assert d.step is not None and d.step.kind == "longout" and d.step.value == 192
    roomy = replace(RAMPED, context_limit_tokens=400)  # 256 + 136 + 8
    assert next_step(roomy, [BASE, *steep, *SHORT_RAMP, *LONG_RAN], 12.0, leading="kv_cache").step.value == 136
    cramped = replace(RAMPED, context_limit_tokens=320)  # 56 tokens: under twice the ramp's answer
    d = next_step(cramped, [BASE, *steep, *SHORT_RAMP, *LONG_RAN], 12.0, leading="kv_cache")
    assert d.step is None or d.step.kind != "longout"


@pytest.mark.parametrize("leading", ["prefill_compute", "healthy", "decode"])
def test_no_longer_answers_unless_a_limit_leads_or_without_the_budget(leading) -> None:
    d = next_step(RAMPED, [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN], 12.0, leading=leading)
    assert d.step is None or d.step.kind != "longout"
    d = next_step(replace(RAMPED, budget_s=13.0), [BASE, *LADDER, *SHORT_RAMP, *LONG_RAN], 12.0, leading="kv_cache")
    assert d.step is None or d.step.kind != "longout"
    # it applied but did not fit: the design's end says so (diagnose then calls the verdict unconfirmed)
    assert d.step is None and "the longout follow-up" in d.done and UNFIT in d.done and "1 s left" in d.done


def test_a_ramp_on_the_users_short_prompts_keeps_the_ladders_and_the_long_ramps_lengths() -> None:
    """Users who send 11-token prompts: the baseline and the ramp send theirs (a 64-token ramp puts
    six times their prompt work under load), while the ladder still doubles from 64 and the long
    ramp still holds 256-token prompts (rungs of 22 and 44 tokens would measure the fixed part only)."""
    cfg = PlanConfig(input_tokens=11)
    base = pt("baseline", 1, 0.010, tokens=11)
    d = next_step(cfg, [])
    assert d.step.probe_step(cfg).input_tokens == "fixed:11" and "11-token" in d.step.reason
    d = next_step(cfg, [base])
    assert (d.step.kind, d.step.value) == ("prompt", 128)
    ramp = [pt("concurrency", c, 0.010 * (1 + 0.1 * c), tokens=11) for c in (2, 4, 8)]
    d = next_step(replace(cfg, max_concurrency=8), [base, *LADDER, *ramp], 6.0, leading="kv_cache")
    assert d.step is not None and d.step.kind == "long"
    assert d.step.probe_step(cfg).input_tokens == "fixed:256" and "(23x," in d.step.reason
    assert Step("concurrency", 2, 8, "ramp", "").probe_step(cfg).input_tokens == "fixed:11"


def _analysis(verdict: str, *others: tuple[str, float], leading: str | None = None):  # noqa: ANN202
    from diag.analysis import Analysis
    from rules import Diagnosis, Finding
    from rules.features.feature import Features

    def f(cat: str, conf: float) -> Finding:
        return Finding(cat, cat, cat, conf, None, None, [], [])

    found = [f(verdict, 0.9), *(f(c, x) for c, x in others)]
    lead = next((x for x in found if x.category == leading), None)
    return Analysis([], None, {}, Diagnosis(found[0], found, [], Features(), leading=lead))


def test_the_follow_ups_are_chosen_for_the_leading_cause_and_beneath_a_client_limit() -> None:
    from diag.analysis.diagnose.result import named_of

    assert named_of(None) is None
    assert named_of(_analysis("queue")) == "queue"
    assert named_of(_analysis("inconclusive", ("kv_cache", 0.6), leading="kv_cache")) == "kv_cache"
    # client timing invalid: the best cause beneath it the long ramp decides, else loadgen itself
    assert named_of(_analysis("loadgen", ("tokenize", 0.4), ("queue", 0.35))) == "queue"
    assert named_of(_analysis("loadgen", ("tokenize", 0.4))) == "loadgen"
    assert named_of(_analysis("healthy")) == "healthy"


def test_users_json_schemas_get_the_grammar_follow_up_once() -> None:
    cfg = replace(CAPPED, users_response_format="schema")
    d = next_step(cfg, [BASE, *LADDER], 5.0, leading="healthy")
    assert d.step is not None and (d.step.kind, d.step.stage) == ("grammar", "follow-up")
    ps = d.step.probe_step(cfg)
    assert ps.response_format == "schema:4" and ps.concurrency == 1 and ps.requests == 24
    assert "first use" in d.step.reason
    ran = [BASE, *LADDER, pt("grammar", 4, 0.05, n=24)]
    assert next_step(cfg, ran, 8.0, leading="healthy").step.kind != "grammar"  # once (the prefix test is next)
    # json_object, no structured output, or not said: no grammar test
    for said in ("json", "none", None):
        d = next_step(replace(CAPPED, users_response_format=said), [BASE, *LADDER], 5.0, leading="healthy")
        assert d.step is None or d.step.kind != "grammar"


def test_users_adapters_get_a_one_adapter_control_then_all_of_them() -> None:
    cfg = replace(CAPPED, users_lora=("a", "b", "c"))
    d = next_step(cfg, [BASE, *LADDER], 5.0, leading="healthy")
    assert d.step is not None and (d.step.kind, d.step.value) == ("lora", 1.0)
    ps = d.step.probe_step(cfg)
    assert ps.lora == ("a",) and ps.concurrency == min(4, CAPPED.max_concurrency) and ps.requests == 32
    assert ps.segment == "lora=1"
    d = next_step(cfg, [BASE, *LADDER, pt("lora", 1, 0.05, n=32)], 6.0, leading="healthy")
    assert d.step is not None and (d.step.kind, d.step.value) == ("lora", 3.0)
    assert d.step.probe_step(cfg).lora == ("a", "b", "c")
    done = next_step(cfg, [BASE, *LADDER, pt("lora", 1, 0.05, n=32), pt("lora", 3, 0.2, n=32)], 7.0, leading="healthy")
    assert done.step is None or done.step.kind != "lora"
    # one adapter cannot wait for another
    d = next_step(replace(CAPPED, users_lora=("a",)), [BASE, *LADDER], 5.0, leading="healthy")
    assert d.step is None or d.step.kind != "lora"
    # a budget too short for it: said, not run
    d = next_step(replace(cfg, budget_s=5.5), [BASE, *LADDER], 5.0, leading="queue")
    assert d.step is None and "LoRA" in (d.done or ""), d
