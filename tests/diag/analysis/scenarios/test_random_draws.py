"""Random scenario draws (no engine runs): every draw's plan is valid for the engine on any
machine speed, draws are reproducible from (seed, index), every category, mix and near-miss
appears, the ground truth is set from the injection alone, and the matrix's tables add up."""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from collectors.probe import LengthSpec, LoadSpec, SweepSpec
from diag.bundled_engine.config import EngineConfig
from diag.bundled_engine.faults import parse_injections
from diag.analysis.scenarios import Calibration
from diag.analysis.scenarios.matrix import MODES, Verdict
from diag.analysis.scenarios.random_draws import (ADDED_FAMILIES, ALL_FAMILIES, FAMILIES, LIGHT_PROMPT_STEPS, MIX_SECOND, NEAR_MISS, NEAR_MISS_EXTRA,
                                         NEAR_MISS_SPACE, SLO_NEAR_MISS, draw, draws, near_miss_draw)
from diag.analysis.scenarios.random_matrix import BINS, DrawResult, RandomResult, reproduce_command
from diag.analysis.scenarios.random_plans import (MAX_CONTEXT_TOKENS, build_plan, draw_chunk_tokens, input_tokens, length_spec,
                                        max_tokens, scenario)
from diag.ground.slo import parse_slo

#: a 2-core CPU box as measured here, one 3x slower, and a GPU-like one (fast prefill per token)
MACHINES = {
    "cpu": Calibration(ttft_short_ms=6.4, prefill_ms_per_token=0.092, decode_step_ms=2.4),
    "slow-cpu": Calibration(ttft_short_ms=19.0, prefill_ms_per_token=0.28, decode_step_ms=7.3),
    "gpu-like": Calibration(ttft_short_ms=4.0, prefill_ms_per_token=0.004, decode_step_ms=6.0, device="cuda"),
}
SEEDS = (0, 1, 7, 12012, 987654)
N = 60


def _serve_parser() -> argparse.ArgumentParser:
    from diag.cli.commands import serve

    root = argparse.ArgumentParser()
    return serve.add_parser(root.add_subparsers())


def _tokens(step) -> list[int]:
    if step.prompts:
        return [inp + out for inp, out in step.prompts]
    out = max_tokens(step.output_tokens)
    if step.sweep == "prompt":
        return [int(v) + out for v in step.sweep_values]
    return [max_tokens(step.input_tokens) + out]


def _near_misses(seed: int, n: int = N) -> list:
    return [near_miss_draw(seed, i) for i in range(n)]


@pytest.mark.parametrize("machine", list(MACHINES))
def test_every_draws_plan_is_valid_for_the_engine_and_fits_its_context(machine):
    cal, parser = MACHINES[machine], _serve_parser()
    for seed in SEEDS:
        for d in draws(seed, N) + _near_misses(seed):
            plan = build_plan(d, cal)
            assert plan.phases, d
            for phase in plan.phases:
                a = parser.parse_args(list(phase.serve_args))
                cfg = EngineConfig(tp=a.tp, policy=a.policy, chunk_size=a.chunk_size, kv_blocks=a.kv_blocks,
                                   block_size=a.block_size, max_running=a.max_running, faults=parse_injections(a.inject),
                                   lazy_load=a.lazy_load, http_keepalive_s=a.keepalive_timeout, pd=a.pd)
                cfg.validate()
                for step in phase.steps:
                    longest = max(_tokens(step))
                    assert longest <= min(cfg.max_context, MAX_CONTEXT_TOKENS), (d.name, step)
                    # a KV budget always holds at least one whole sequence: pressure, never a refusal
                    assert cfg.num_kv_blocks() * cfg.block_size >= longest, (d.name, step)
                    LengthSpec.parse(step.input_tokens), LengthSpec.parse(step.output_tokens)
                    LoadSpec(concurrency=step.concurrency, requests=step.requests, rate_rps=step.rate_rps)
                    if step.sweep:
                        assert len(SweepSpec(step.sweep, values=list(step.sweep_values)).point_values()) >= 2
                    assert step.concurrency <= 32  # under the engine's running cap unless a draw sets one
                    # sized for CI: a draw's requests stay in the tens
                    n = step.requests or step.requests_per_point * len(step.sweep_values)
                    assert n <= 64, (d.name, step)
            if plan.slo:
                assert all(v > 0 for v in parse_slo(plan.slo).values())


def test_a_draw_is_a_pure_function_of_seed_and_index():
    assert draw(5, 3) == draw(5, 3)
    assert near_miss_draw(5, 3) == near_miss_draw(5, 3) and near_miss_draw(5, 3) != draw(5, 3)
    assert [d.params for d in draws(5, 20)] != [d.params for d in draws(6, 20)]
    assert draw(5, 3) == draws(5, 4)[3]  # index i does not depend on the draws before it
    cal = MACHINES["cpu"]
    assert build_plan(draw(5, 3), cal) == build_plan(draw(5, 3), cal)
    # the draws are in calibration units: a uniformly slower machine runs the same tokens
    slow = replace(cal, ttft_short_ms=3 * cal.ttft_short_ms, prefill_ms_per_token=3 * cal.prefill_ms_per_token,
                   decode_step_ms=3 * cal.decode_step_ms)
    for d in draws(5, N) + _near_misses(5):
        a, b = build_plan(d, cal), build_plan(d, slow)
        assert [[_tokens(s) for s in p.steps] for p in a.phases] == [[_tokens(s) for s in p.steps] for p in b.phases]
        if a.slo:
            sa, sb = parse_slo(a.slo), parse_slo(b.slo)
            assert {k: pytest.approx(3 * v, rel=0.02) for k, v in sa.items()} == sb


def test_every_category_is_drawn_with_mixes_and_near_misses():
    ds = [d for seed in SEEDS for d in draws(seed, 2 * N)]  # every kind of ~20 families: 600 draws
    assert {d.family for d in ds} == set(ALL_FAMILIES)
    assert {d.expected for d in ds} == set(ALL_FAMILIES)
    kinds = Counter((d.family, d.kind) for d in ds)
    for fam in MIX_SECOND:
        assert kinds[(fam, "mix")], fam
    for fam in NEAR_MISS:
        assert kinds[(fam, "near-miss")], fam
    for d in ds:
        assert d.expected == ("healthy" if d.kind == "near-miss" else d.family)


def test_near_misses_are_weak_and_mixes_dominated_by_their_family():
    from diag.analysis.scenarios.random_plans import dominant_cost_ms, faults_ms

    cal = MACHINES["cpu"]
    for d in (d for seed in SEEDS for d in draws(seed, N)):
        f = faults_ms(d, cal)
        if d.kind == "near-miss" and d.family == "tokenize":
            assert f["tokenize_ms_per_token"] <= 0.15 * cal.prefill_ms_per_token + 1e-9
        if d.kind == "near-miss" and d.family == "network":
            assert f["network_delay_ms"] <= 0.3 * cal.decode_step_ms + 1e-9
        if d.family == "engine_overhead":  # a loop idle 1.5..5 steps before each step, or a few % of one
            near = d.kind == "near-miss"
            assert (f["scheduler_stall_ms"] <= 0.1 * cal.decode_step_ms + 1e-9) if near else \
                (f["scheduler_stall_ms"] >= 1.5 * cal.decode_step_ms - 1e-9)
        if d.kind == "near-miss" and d.family == "cold_start":
            assert "--lazy-load" not in build_plan(d, cal).phases[0].serve_args
        if d.kind == "mix":
            dominant = dominant_cost_ms(d, cal)
            second = (f["tokenize_ms_per_token"] * d.params["input_tokens"] if d.params["mix_second"] == "tokenize"
                      else f["network_delay_ms"])
            assert second <= 0.25 * dominant + 1e-6, d


def test_ground_truth_never_comes_from_the_rules():
    """The drawing and planning modules import nothing that diagnoses."""
    root = Path(__file__).resolve().parents[4] / "diag" / "analysis" / "scenarios"
    for name in ("random_draws.py", "random_plans.py"):
        tree = ast.parse((root / name).read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in mods if m and (m.startswith(("rules", "diag.analysis.diagnose")) or m == "diag.analysis")}, name
    sc = scenario(draw(3, 2))
    assert sc.category == draw(3, 2).expected


def _result(verdicts: dict[int, list[tuple[str, float]]], seed: int = 4) -> RandomResult:
    rs = []
    for i, vs in verdicts.items():
        d = draw(seed, i)
        rs.append(DrawResult(d, {m: [Verdict(c if c != "=" else d.expected, conf, "t") for c, conf in vs] for m in MODES}))
    return RandomResult(seed, MACHINES["cpu"], MODES, rs, calibration_file="runs/calibration.json")


def test_the_matrix_scores_reliability_flips_and_misses():
    res = _result({0: [("=", 0.85), ("=", 0.82)], 1: [("=", 0.95), ("zzz", 0.55)], 2: [("zzz", 0.65), ("zzz", 0.65)]})
    for m in MODES:
        assert res.accuracy(m) == (3, 6)
        assert res.flip_rate(m) == pytest.approx(1 / 3)
    rel = {tuple(b["bin"]): (b["right"], b["runs"]) for b in res.reliability()}
    assert rel[(0.8, 0.9)] == (4, 4) and rel[(0.9, 1.0)] == (2, 2) and rel[(0.5, 0.6)] == (0, 2)
    assert rel[(0.6, 0.7)] == (0, 4) and len(rel) == len(BINS)
    assert len(res.misses()) == 6
    text = res.format_text()
    assert "seed 4" in text and "prefill 0.092 ms/token" in text and "flip rate server: 33%" in text
    assert f"reproduce: ttft scenarios check --random 1 --seed 4 --draw 2 --calibration runs/calibration.json" in text
    doc = json.loads(json.dumps(res.to_dict(), default=str))
    assert doc["seed"] == 4 and doc["accuracy"]["server"]["right"] == 3 and len(doc["misses"]) == 6
    assert doc["draws"][0]["injected"]["draw"] == {"seed": 4, "index": 0, "family": draw(4, 0).family,
                                                   "kind": draw(4, 0).kind}


def test_reproduce_command_names_one_draw():
    d = draw(11, 7)
    assert reproduce_command(d) == "ttft scenarios check --random 1 --seed 11 --draw 7"
    assert reproduce_command(d, "client", "c.json").endswith("--draw 7 --mode client --calibration c.json")


def test_check_random_refuses_names_and_bad_counts(capsys):
    from diag.cli import main

    cal = Path(__file__).parent / "_cal.json"
    try:
        cal.write_text(json.dumps(MACHINES["cpu"].to_dict()))
        assert main(["scenarios", "check", "--random", "2", "healthy", "--calibration", str(cal)]) == 2
        assert main(["scenarios", "check", "--random", "0", "--calibration", str(cal)]) == 2
        assert main(["scenarios", "check", "--near-miss", "0", "--calibration", str(cal)]) == 2
        assert main(["scenarios", "check", "--near-miss", "2", "healthy", "--calibration", str(cal)]) == 2
        assert main(["scenarios", "check", "--near-miss", "1", "--via", "diagnose", "--calibration", str(cal)]) == 2
    finally:
        cal.unlink()


def test_near_misses_of_many_stream_families_keep_their_streams():
    for d in (d for seed in SEEDS for d in draws(seed, N)):
        if d.family == "decode":
            assert d.params["concurrency"] >= 16, d
        if d.family == "interference":
            assert 3 <= d.params["concurrency"] <= 5, d


def test_a_mixs_truth_follows_the_engines_own_stage_accounting():
    """On recorded captures: the cause whose stage holds more TTFT is the truth; other draws keep theirs."""
    from diag.analysis.scenarios.random_truth import accounted_truth

    samples = Path(__file__).resolve().parents[4] / "samples"
    ds = [d for seed in SEEDS for d in draws(seed, N)]
    queue_mix = next(d for d in ds if d.kind == "mix" and d.family == "queue" and d.params["mix_second"] == "tokenize")
    net_mix = next(d for d in ds if d.kind == "mix" and d.family == "network" and d.params["mix_second"] == "tokenize")
    caps = {name: [samples / name / "client", samples / name / "server-0"] for name in ("queue", "tokenize", "network")}
    truth, means = accounted_truth(queue_mix, caps["queue"])
    assert truth == "queue" and means["queue"] > means["tokenize"]
    assert accounted_truth(net_mix, caps["network"])[0] == "network"
    # where the second cause holds more of TTFT, it is the truth
    truth, means = accounted_truth(net_mix, caps["tokenize"])
    assert truth == "tokenize" and means["tokenize"] > means["network"]
    plain = next(d for d in ds if d.kind == "plain" and d.family == "queue")
    assert accounted_truth(plain, caps["tokenize"]) == ("queue", {})


def test_a_designed_healthy_run_whose_slo_broke_is_void_and_not_scored():
    from diag.analysis.scenarios.random_truth import VOID, run_truth, slo_broken

    samples = Path(__file__).resolve().parents[4] / "samples" / "healthy"
    caps = [samples / "client", samples / "server-0"]
    assert slo_broken("ttft_p99=1000s,tpot_p99=1000s", caps) == {}
    broken = slo_broken("ttft_p99=0.001ms,tpot_p99=1000s", caps)
    assert list(broken) == ["ttft_p99"] and broken["ttft_p99"][0] > broken["ttft_p99"][1]
    healthy = next(d for d in draws(1, N) if d.expected == "healthy")
    assert run_truth(healthy, "ttft_p99=0.001ms", caps)[0] == VOID
    assert run_truth(healthy, "ttft_p99=1000s", caps) == ("healthy", {})
    res = _result({healthy.index: [("zzz", 0.9)]}, seed=1)
    res.results[0].truths, res.results[0].accounting = [VOID], [{"ttft_p99": 1.0}]
    assert res.accuracy("server") == (0, 0) and not res.misses() and res.voids() == [(res.results[0], 0)]
    assert "void (not as designed" in res.format_text() and res.to_dict()["void"][0]["draw"] == healthy.index


def test_an_slo_defined_cause_whose_slo_held_is_void():
    """Interference is a bottleneck through the ITL target it breaks: pooled token gaps decide."""
    from diag.analysis.scenarios.random_truth import VOID, run_truth, slo_broken

    samples = Path(__file__).resolve().parents[4] / "samples" / "interference"
    caps = [samples / "client", samples / "server-0"]
    slo = json.loads((samples / "client" / "meta.json").read_text())["slo"]
    assert "itl_p99" in slo_broken(slo, caps)  # the catalogue's interference breaks its ITL target
    d = next(d for seed in SEEDS for d in draws(seed, N) if d.family == "interference" and d.kind == "plain")
    assert run_truth(d, slo, caps) == ("interference", {})
    assert run_truth(d, "itl_p99=1000s", caps)[0] == VOID


def test_a_kv_limit_seen_only_from_the_client_may_be_named_queue():
    # a client cannot see KV: the requests a KV limit holds back wait in the engine's queue
    d = next(d for d in draws(5, 400) if d.expected == "kv_cache")
    res = RandomResult(5, MACHINES["cpu"], MODES, [DrawResult(d, {m: [Verdict("queue", 0.5, "t")] for m in MODES})])
    assert res.accuracy("client-only") == (1, 1)
    assert res.accuracy("server") == (0, 1)  # with the server's spans the KV pressure is there to see
    assert [m for _, m, _, _ in res.misses()] == ["server"]
    assert "scored right as not observable from the client (client-only)" in res.format_text()
    other = RandomResult(5, MACHINES["cpu"], MODES, [DrawResult(d, {m: [Verdict("tokenize", 0.5, "t")] for m in MODES})])
    assert other.accuracy("client-only") == (0, 1)


def test_a_prefill_or_network_draw_at_one_load_level_has_prompts_that_vary():
    # one fixed prompt length at one level cannot tell a fixed delay from prompt work
    one_level = [d for d in draws(9, 600) if d.family in ("network", "prefill_compute") and d.kind != "near-miss"
                 and d.params["design"] != "sweep"]
    assert {d.family for d in one_level} == {"network", "prefill_compute"}
    assert all(d.params["input_spread"] >= 0.25 for d in one_level)


@pytest.mark.parametrize("machine", list(MACHINES))
def test_a_kv_draws_chunk_budget_never_binds_before_its_kv_pool(machine):
    # a 16-token chunk under 269-token prompts admitted no faster than 3 fitting sequences did:
    # room for every stream left TTFT as it was, so the truth was the chunk budget's queue
    cal = MACHINES[machine]
    kv = [d for seed in SEEDS for d in draws(seed, N) if d.expected == "kv_cache" and d.params["policy"] == "chunked"]
    assert kv
    for d in kv:
        p = d.params
        prefill_steps = max_tokens(length_spec(input_tokens(d, cal), p["input_spread"])) / draw_chunk_tokens(d, cal)
        pool_rate = p["kv_fits"] / (prefill_steps + p["output_tokens"])  # requests admitted per step
        assert 1 / prefill_steps >= 2 * pool_rate * 0.99, (d.name, draw_chunk_tokens(d, cal))


def test_the_ci_seeds_draws_are_the_ones_it_always_ran():
    """Reproduce commands printed by earlier runs keep their meaning: the main space is unchanged by
    the near-miss space (its own key), and a family added later takes a draw on a key of its own, so
    the CI seed's 12 draws are what they were when it was fixed, except those an added family took."""
    got = [(d.family, d.kind) for d in draws(20261201, 12)]
    fixed = [("head_of_line", "plain"), ("prefill_compute", "plain"), ("healthy", "plain"), ("healthy", "plain"),
             ("pipeline_bubble", "plain"), ("comm", "plain"), ("prefill_compute", "plain"), ("tokenize", "plain"),
             ("kv_cache", "plain"), ("queue", "plain"), ("network", "near-miss"), ("prefix_cache", "plain")]
    taken = [i for i, (g, f) in enumerate(zip(got, fixed)) if g != f]
    assert all(got[i][0] in ADDED_FAMILIES for i in taken)
    # engine_overhead took 4 and 8, pd_transfer 7, 9 and 10, lora_adapters 1 (each on its own key, by chance)
    assert taken == [1, 4, 7, 8, 9, 10]
    assert [got[i][0] for i in taken] == ["lora_adapters", "engine_overhead", "pd_transfer", "engine_overhead",
                                          "pd_transfer", "pd_transfer"]
    assert all(d.space == "main" and d.name.startswith("r") for d in draws(20261201, 12))


def test_the_near_miss_space_takes_every_family_in_turn_with_truth_healthy():
    k = len(NEAR_MISS_SPACE)
    assert set(NEAR_MISS_SPACE) | set(ADDED_FAMILIES) == set(NEAR_MISS) | set(NEAR_MISS_EXTRA)
    assert len(set(NEAR_MISS_SPACE)) == k
    for seed in SEEDS:
        ds = _near_misses(seed, 2 * k)
        # the families cycle, each once in any k draws, except where an added family took the draw
        start = NEAR_MISS_SPACE.index(next(d.family for d in ds if d.family not in ADDED_FAMILIES))
        start -= next(i for i, d in enumerate(ds) if d.family not in ADDED_FAMILIES)
        for i, d in enumerate(ds):
            assert d.family in ADDED_FAMILIES or d.family == NEAR_MISS_SPACE[(start + i) % k], (seed, i)
        for d in ds:
            assert (d.kind, d.expected, d.space) == ("near-miss", "healthy", "near-miss") and d.name.startswith("n")
    firsts = {_near_misses(seed, 1)[0].family for seed in range(40)}
    assert len(firsts) > 3  # the start is drawn per seed
    ds = [d for seed in SEEDS for d in _near_misses(seed)]
    assert all(d.params["slo_given"] for d in ds if d.family in SLO_NEAR_MISS)
    assert {d.params["slo_given"] for d in ds if d.family not in SLO_NEAR_MISS} == {True, False}
    cal = MACHINES["cpu"]
    for d in ds:  # no SLO given: the plan carries none (healthy must come from the own-work floor)
        assert (build_plan(d, cal).slo is None) == (not d.params["slo_given"]), d


def test_a_long_prompt_near_miss_waits_behind_nothing():
    """head_of_line's near-miss: the plain family's engine and long prompts, one request at a time."""
    ds = [d for seed in SEEDS for d in _near_misses(seed) if d.family == "head_of_line"]
    assert ds
    for machine, cal in MACHINES.items():
        for d in ds:
            plan = build_plan(d, cal)
            (step,) = plan.phases[0].steps
            args = plan.phases[0].serve_args
            assert step.concurrency == 1 and step.rate_rps is None and step.sweep is None, d
            long_tokens, every = step.inject_long
            assert long_tokens >= 384 and every >= 4 and "chunked" in args and "--max-partial-prefills" not in args
            if plan.slo:  # the users' TTFT target holds the long prompt's own chunked prefill, 5x over
                chunk = int(args[args.index("--chunk-size") + 1])
                own_ms = (long_tokens / chunk + 1) * cal.decode_step_ms + long_tokens * cal.prefill_ms_per_token
                assert parse_slo(plan.slo)["ttft_p99"] * 1e3 >= 5 * own_ms, (machine, d)


def test_an_idle_closing_keepalive_near_miss_probes_across_the_servers_timeout():
    """keepalive's near-miss: the server closes idle connections after S seconds, the probe's mean
    gap is 1.2..2x S, below the probe's own idle pool limit (so it meets connections the server closed)."""
    from collectors.probe.client import KEEPALIVE_S

    ds = [d for seed in SEEDS for d in _near_misses(seed) if d.family == "keepalive"]
    assert ds
    for d in ds:
        plan = build_plan(d, MACHINES["cpu"])
        args = plan.phases[0].serve_args
        timeout_s = float(args[args.index("--keepalive-timeout") + 1])
        (step,) = plan.phases[0].steps
        gap_s = 1 / step.rate_rps
        assert 1.15 * timeout_s <= gap_s <= 2.05 * timeout_s and gap_s < KEEPALIVE_S, d
        assert step.concurrency >= 4 and not d.params["faults"]  # arrivals never wait in the client; no fault
        slow = build_plan(d, MACHINES["slow-cpu"])  # wall-clock: the same server and arrivals on any machine
        assert slow.phases[0].serve_args == args and slow.phases[0].steps[0].rate_rps == step.rate_rps


@pytest.mark.parametrize("machine", list(MACHINES))
def test_light_load_on_long_prompts_stays_under_the_contracts_prompt_work_bar(machine):
    """prefill_compute's near-miss: the median request's prompt (the centre of the spread, the top of
    a sweep) costs at most 2.5 decode steps of prefill at the calibrated rate, under half the 6 the
    verdict contract needs for prompt work to be a cause; one stream, a prompt sweep at concurrency
    1, or open-loop arrivals at half a stream or less."""
    from diag.analysis.scenarios.random_plans import input_tokens

    cal = MACHINES[machine]
    ds = [d for seed in SEEDS for d in _near_misses(seed) if d.family == "prefill_compute"]
    assert {d.params["design"] for d in ds} == {"closed", "open", "sweep"}
    for d in ds:
        plan = build_plan(d, cal)
        (step,) = plan.phases[0].steps
        n = input_tokens(d, cal)
        assert n * cal.prefill_ms_per_token <= LIGHT_PROMPT_STEPS[1] * cal.decode_step_ms + 1e-9 or n == 16, d
        if step.sweep:
            assert max(step.sweep_values) == n
        else:
            assert step.input_tokens == length_spec(n, d.params["input_spread"]) and d.params["input_spread"] >= 0.25
        assert "chunked" not in plan.phases[0].serve_args
        if step.rate_rps is not None:
            assert d.params["load"] <= 0.5
        else:
            assert step.concurrency == 1


def test_near_miss_draws_reproduce_with_their_own_flag():
    d = near_miss_draw(11, 7)
    assert reproduce_command(d) == "ttft scenarios check --near-miss 1 --seed 11 --draw 7"
    assert d.name == f"n007-{d.family}-near-miss"


@pytest.mark.parametrize("machine", list(MACHINES))
def test_a_near_miss_without_an_slo_sends_no_prompt_work_the_contract_calls_a_cause(machine):
    """Without a target met, healthy holds only while no cause is there: the median prompt of a
    near-miss given no SLO costs at most 2.5 decode steps of prefill (the contract's bar is 6),
    except the shared-prefix design (its first uses) and the long-prompt one (a short median)."""
    from diag.analysis.scenarios.random_draws import prompt_capped
    from diag.analysis.scenarios.random_plans import input_tokens

    cal = MACHINES[machine]
    ds = [d for seed in SEEDS for d in _near_misses(seed) if not d.params["slo_given"]]
    capped = [d for d in ds if prompt_capped(d)]
    assert {d.family for d in ds} - {d.family for d in capped} == {"prefix_cache", "head_of_line"}
    for d in capped:
        n = input_tokens(d, cal)
        assert n <= d.params["input_tokens"] or "light_steps" in d.params
        assert n * cal.prefill_ms_per_token <= LIGHT_PROMPT_STEPS[1] * cal.decode_step_ms + 1e-9 or n == 16, d
        (step,) = build_plan(d, cal).phases[0].steps
        assert step.input_tokens == length_spec(n, d.params["input_spread"]) or step.sweep == "prompt"
    assert not any(prompt_capped(d) for d in draws(5, N))  # the main space's near-misses keep their SLO


def test_a_run_whose_probe_was_starved_is_void_outside_the_loadgen_family():
    """The probe's own client_health (saturated: its event loop stalled) voids a run of any family
    but loadgen: a neighbour on the machine, not the draw, made that run (recorded captures)."""
    from diag.analysis.scenarios.random_truth import VOID, client_starved, run_truth

    samples = Path(__file__).resolve().parents[4] / "samples"
    starved = [samples / "loadgen" / "client", samples / "loadgen" / "server-0"]
    assert client_starved(starved[0]) == pytest.approx(0.4626, abs=1e-3)
    assert client_starved(samples / "healthy" / "client") is None
    ds = [d for seed in SEEDS for d in draws(seed, N)]
    loadgen = next(d for d in ds if d.family == "loadgen")
    assert run_truth(loadgen, None, starved) == ("loadgen", {})  # starved by design: scored
    for d in (next(d for d in ds if d.family == "queue" and d.kind == "plain"), near_miss_draw(3, 0)):
        truth, why = run_truth(d, "ttft_p99=1000s", starved)
        assert truth == VOID and why == {"client_loop_stall_frac": pytest.approx(0.463, abs=1e-3)}


def test_a_decode_run_whose_ttft_target_broke_too_is_void():
    """Decode is "TTFT fine, ITL bad": a run that broke its users' TTFT target as well has a TTFT cause."""
    from diag.analysis.scenarios.random_truth import VOID, run_truth

    samples = Path(__file__).resolve().parents[4] / "samples" / "decode"
    caps = [samples / "client", samples / "server-0"]
    d = next(d for seed in SEEDS for d in draws(seed, N) if d.family == "decode" and d.kind == "plain")
    assert run_truth(d, "ttft_p99=1000s,tpot_p99=0.001ms", caps) == ("decode", {})
    truth, broken = run_truth(d, "ttft_p99=0.001ms,tpot_p99=0.001ms", caps)
    assert truth == VOID and list(broken) == ["ttft_p99"]
