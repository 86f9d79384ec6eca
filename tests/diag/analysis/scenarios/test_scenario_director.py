"""The demo's scenario runner: its phases come from the catalog, its probe chunks from the
same step translation as the scenario runner's."""

from __future__ import annotations

from collectors.probe import LoadSpec, SweepSpec
from diag.analysis.scenarios.calibrate import Calibration
from diag.analysis.scenarios.catalog import ProbeStep
from diag.analysis.scenarios.director import PHASES, build_plans
from diag.analysis.scenarios.runner import step_chunks, step_load, step_sweep


def test_demo_phases_come_from_the_scenario_catalog() -> None:
    """The demo's phases reuse the catalog's plans: engine arguments, sweeps, SLOs, truth."""
    plans = build_plans(Calibration(ttft_short_ms=7.0, prefill_ms_per_token=0.09, decode_step_ms=3.5))
    assert [p.expected for p in plans] == ["healthy", "prefill_compute", "kv_cache", "tokenize"]
    assert plans[0].slo and not plans[1].slo
    assert "--kv-blocks" in plans[2].serve_args
    assert any(a.startswith("tokenize_ms_per_token=") for a in plans[3].serve_args)
    chunks = step_chunks(plans[1].steps[0], plans[1].name)
    assert [c[2] for c in chunks] == ["prompt=64", "prompt=128", "prompt=256", "prompt=512", "prompt=1024"]
    assert all(c[0].concurrency == 1 and c[1] is not None for c in chunks)
    kv = step_chunks(plans[2].steps[0], plans[2].name)
    assert [c[0].concurrency for c in kv] == [1, 2, 3, 6, 12] and all(c[1] is None for c in kv)
    (load, inp, seg), = step_chunks(plans[0].steps[0], plans[0].name)
    assert seg == "healthy" and inp is None and load.requests == 24


def test_one_step_translation_serves_the_runner_and_the_demo() -> None:
    step = ProbeStep(concurrency=3, requests=12, rate_rps=2.0, warmup=2)
    assert step_load(step, warmup_requests=step.warmup) == LoadSpec(concurrency=3, requests=12, warmup_requests=2,
                                                                    rate_rps=2.0)
    assert step_sweep(step) is None
    ((load, inp, seg),) = step_chunks(step, "phase")
    assert load == LoadSpec(concurrency=3, rate_rps=2.0, requests=12) and inp is None and seg == "phase"
    timed = step_chunks(ProbeStep(concurrency=2), "p")[0][0]
    assert timed.requests is None and timed.duration_s == 4.0  # no count: a 4 s chunk
    sweep = ProbeStep(sweep="prompt", sweep_values=(64, 128), requests_per_point=5)
    assert step_sweep(sweep) == SweepSpec("prompt", values=[64.0, 128.0], requests_per_point=5)
    assert len(build_plans(Calibration(ttft_short_ms=7.0, prefill_ms_per_token=0.09, decode_step_ms=3.5))) == len(PHASES)
