"""Scenario plans as a user's machine sizes them: what the engine is asked to do must be valid
on any speed of machine, and sizes follow speed ratios, not one box's constants."""

from __future__ import annotations

from dataclasses import replace

import pytest

from diag.bundled_engine.config import EngineConfig
from diag.analysis.scenarios import SCENARIOS, Calibration
from diag.analysis.scenarios.engine_process import EngineProcess, engine_threads
from diag.ground.slo import parse_slo

#: a 2-core CPU box as measured here, one 3x slower, and a GPU-like one (fast prefill per token)
MACHINES = {
    "cpu": Calibration(ttft_short_ms=6.4, prefill_ms_per_token=0.092, decode_step_ms=2.4),
    "slow-cpu": Calibration(ttft_short_ms=19.0, prefill_ms_per_token=0.28, decode_step_ms=7.3),
    "gpu-like": Calibration(ttft_short_ms=4.0, prefill_ms_per_token=0.004, decode_step_ms=6.0, device="cuda"),
}


def _prompt_tokens(step) -> list[int]:
    if step.prompts:
        return [inp + out for inp, out in step.prompts]
    out = int(step.output_tokens.split(":")[-1])
    if step.sweep == "prompt":
        return [int(v) + out for v in step.sweep_values]
    return [int(step.input_tokens.split(":")[-1]) + out]


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_every_plan_fits_the_engine_and_its_slo_parses(scenario, machine):
    plan = scenario.build(MACHINES[machine])
    max_context = EngineConfig().max_context
    for phase in plan.phases:
        for step in phase.steps:
            assert max(_prompt_tokens(step)) <= max_context, (scenario.name, step)
    if plan.slo:
        slo = parse_slo(plan.slo)
        assert slo and all(v > 0 for v in slo.values())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_a_uniformly_slower_machine_gets_the_same_tokens_and_proportionally_longer_targets(scenario):
    fast = MACHINES["cpu"]
    slow = replace(fast, ttft_short_ms=3 * fast.ttft_short_ms, prefill_ms_per_token=3 * fast.prefill_ms_per_token,
                   decode_step_ms=3 * fast.decode_step_ms)
    a, b = scenario.build(fast), scenario.build(slow)
    assert [[_prompt_tokens(s) for s in p.steps] for p in a.phases] == [[_prompt_tokens(s) for s in p.steps] for p in b.phases]
    if a.slo:
        sa, sb = parse_slo(a.slo), parse_slo(b.slo)
        assert sa.keys() == sb.keys()
        for k in sa:
            assert sb[k] == pytest.approx(3 * sa[k], rel=0.02), k


def test_interference_pair_differs_only_in_policy_and_holds_users_to_the_same_targets():
    from diag.analysis.scenarios import get

    cal = MACHINES["cpu"]
    pf, ch = get("interference").build(cal), get("interference_chunked").build(cal)
    assert pf.slo == ch.slo
    assert pf.phases[0].steps == ch.phases[0].steps
    assert "prefill-first" in pf.phases[0].serve_args and "chunked" in ch.phases[0].serve_args
    # the ITL target is many single-stream steps, and far below the longest prompt's prefill
    itl = parse_slo(pf.slo)["itl_p99"] * 1e3
    longest = max(inp for inp, _ in pf.phases[0].steps[0].prompts)
    assert 10 * cal.decode_step_ms < itl < longest * cal.prefill_ms_per_token / 1.5


def test_engines_beside_their_client_leave_it_a_core():
    assert engine_threads(2) == 1 and engine_threads(8) == 7 and engine_threads(1) == 1
    assert EngineProcess([]).command()[-2:] == ["--threads", str(engine_threads())]
    cmd = EngineProcess(["--threads", "3"]).command()
    assert cmd.count("--threads") == 1 and cmd[cmd.index("--threads") + 1] == "3"


def test_a_calibration_file_without_a_spread_still_reads_and_a_noisy_one_says_so():
    old = {"ttft_short_ms": 6.0, "prefill_ms_per_token": 0.09, "decode_step_ms": 2.5, "device": "cpu"}
    cal = Calibration.from_dict(old)
    assert cal.spread == 1.0 and not cal.noisy
    noisy = Calibration.from_dict({**old, "spread": 2.4})
    assert noisy.noisy and Calibration.from_dict(noisy.to_dict()) == noisy
