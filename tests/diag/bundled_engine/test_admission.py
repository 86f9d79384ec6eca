"""Admission policies of the scheduler: fcfs head-of-line stop vs skip-blocked, the cap on
concurrent partial prefills (chunked), and KV admission by worst-case reservation."""

from __future__ import annotations

import random

import pytest

from diag.bundled_engine.kv_cache import BlockManager
from diag.bundled_engine.sampler import SamplerState, SamplingParams
from diag.bundled_engine.scheduler import Scheduler
from diag.bundled_engine.scheduler_types import (WAIT_HEAD_OF_LINE, WAIT_KV_BLOCKS, WAIT_KV_RESERVATION, WAIT_PARTIAL_PREFILLS,
                                         SchedulerConfig, Sequence, StepPlan)
from test_scheduler import _run_step as _run  # pretend to execute a plan (the scheduler tests' helper)


def _seq(name: str, prompt: int, max_tokens: int = 4, given: bool = True) -> Sequence:
    p = SamplingParams(max_tokens=max_tokens)
    return Sequence(name, list(range(1, prompt + 1)), p, SamplerState(p, 0), max_tokens_given=given)


def _admitted(plan: StepPlan) -> list[str]:
    return [i.seq.seq_id for i in plan.items if i.is_prefill and i.start_pos == 0]


# -- fcfs vs skip-blocked ----------------------------------------------------------------------


def _blocked_head(admission: str) -> Scheduler:
    """8 blocks of 4 tokens; a running 12-token sequence holds 3; the head needs 6, two shorts 1 each."""
    s = Scheduler(SchedulerConfig(policy="prefill-first", admission=admission), BlockManager(8, 4))
    s.add(_seq("run", 12, max_tokens=50))
    _run(s, s.schedule())
    s.add(_seq("long", 24))
    s.add(_seq("short1", 3))
    s.add(_seq("short2", 3))
    return s


def test_fcfs_stops_the_walk_at_a_head_that_does_not_fit():
    s = _blocked_head("fcfs")
    plan = s.schedule()
    assert _admitted(plan) == []  # the shorts fit (5 blocks free) but wait behind the head
    assert [q.seq_id for q in s.waiting] == ["long", "short1", "short2"]
    assert s.waiting_reasons == {WAIT_KV_BLOCKS: 1, WAIT_HEAD_OF_LINE: 2}


def test_skip_blocked_admits_what_fits_behind_the_head():
    s = _blocked_head("skip-blocked")
    plan = s.schedule()
    assert _admitted(plan) == ["short1", "short2"]
    assert [q.seq_id for q in s.waiting] == ["long"]
    assert s.waiting_reasons == {WAIT_KV_BLOCKS: 1}


def test_skip_blocked_still_stops_at_max_running():
    s = Scheduler(SchedulerConfig(policy="prefill-first", admission="skip-blocked", max_running=2),
                  BlockManager(8, 4))
    s.add(_seq("long", 40))  # needs 10 blocks of 8: never fits now
    for i in range(4):
        s.add(_seq(f"s{i}", 3))
    assert _admitted(s.schedule()) == ["s0", "s1"]
    assert s.waiting_reasons == {WAIT_KV_BLOCKS: 1, "max_running": 2}


def test_default_admission_is_fcfs():
    assert SchedulerConfig().admission == "fcfs" and SchedulerConfig().kv_admission == "on-demand"
    assert SchedulerConfig().max_partial_prefills is None


# -- partial prefills (chunked) ----------------------------------------------------------------


def _long_then_shorts(cap: int | None) -> tuple[Scheduler, dict[str, int]]:
    """A 400-token prompt admitted first, then four 8-token prompts; chunk 64. Returns the step at
    which each request got its first token."""
    s = Scheduler(SchedulerConfig(policy="chunked", chunk_size_tokens=64, max_num_batched_tokens=512,
                                  max_partial_prefills=cap), BlockManager(256, 16))
    s.add(_seq("long", 400, max_tokens=2))
    _run(s, s.schedule())
    for i in range(4):
        s.add(_seq(f"s{i}", 8, max_tokens=2))
    first: dict[str, int] = {}
    for step in range(1, 40):
        plan = s.schedule()
        assert plan.num_prefill_tokens <= 64
        if cap is not None:
            assert plan.num_prefill_seqs <= cap
        for item in plan.items:
            if item.completes and item.seq.seq_id not in first:
                first[item.seq.seq_id] = step
        _run(s, plan)
        if not s.has_work():
            break
    return s, first


def test_without_a_cap_a_long_partial_prefill_holds_new_prompts_back():
    # today's chunked (and vLLM before --max-num-partial-prefills): the running partial prefill takes
    # the chunk first; the shorts start only once the long prompt is done
    s, first = _long_then_shorts(None)
    assert all(first[f"s{i}"] >= first["long"] for i in range(4))
    assert not s.has_work()


def test_the_cap_splits_the_chunk_so_short_prompts_pass_a_long_one():
    s, first = _long_then_shorts(4)
    assert all(first[f"s{i}"] < first["long"] for i in range(4))
    assert not s.has_work()


def test_a_cap_of_one_admits_nothing_beside_a_partial_prefill():
    s = Scheduler(SchedulerConfig(policy="chunked", chunk_size_tokens=64, max_partial_prefills=1),
                  BlockManager(256, 16))
    s.add(_seq("long", 400))
    _run(s, s.schedule())
    s.add(_seq("s0", 8))
    plan = s.schedule()
    assert [i.seq.seq_id for i in plan.items] == ["long"] and plan.num_prefill_tokens == 64
    assert s.waiting_reasons == {WAIT_PARTIAL_PREFILLS: 1}


def test_the_cap_needs_chunked():
    with pytest.raises(ValueError, match="needs --policy chunked"):
        SchedulerConfig(policy="prefill-first", max_partial_prefills=2).validate()
    with pytest.raises(ValueError, match=">= 1"):
        SchedulerConfig(policy="chunked", max_partial_prefills=0).validate()
    with pytest.raises(ValueError, match="admission 'lifo' unknown"):
        SchedulerConfig(admission="lifo").validate()


def test_serve_refuses_the_cap_without_chunked_in_one_line(capsys):
    from diag.cli import main

    assert main(["serve", "--max-partial-prefills", "2", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--max-partial-prefills needs --policy chunked" in err and len(err.splitlines()) == 1


# -- KV admission by reservation ---------------------------------------------------------------


def _concurrent(kv_admission: str, given: bool) -> tuple[Scheduler, int, float]:
    """Four 16-token prompts, 8 output tokens, context 256, 32 blocks of 16 (one context = 16 blocks).
    Returns (scheduler, most sequences running at once, highest KV usage seen)."""
    s = Scheduler(SchedulerConfig(policy="prefill-first", max_context_tokens=256, kv_admission=kv_admission),
                  BlockManager(32, 16))
    for i in range(4):
        s.add(_seq(f"r{i}", 16, max_tokens=8, given=given))
    most, usage = 0, 0.0
    for _ in range(200):
        plan = s.schedule()
        most = max(most, len(s.running))
        usage = max(usage, s.blocks.usage_ratio())
        if s.waiting:
            assert sum(s.waiting_reasons.values()) == len(s.waiting)
        _run(s, plan)
        if not s.has_work():
            break
    assert not s.has_work() and s.blocks.num_free_blocks == 32
    return s, most, usage


def test_on_demand_runs_them_together():
    _, most, _ = _concurrent("on-demand", given=False)
    assert most == 4


def test_reserve_without_max_tokens_reserves_the_context_and_serialises():
    # each request may grow to the context (16 blocks): two fit the 32-block pool, so at most two run,
    # while the blocks really used stay at 2 per request (usage <= 4/32)
    s, most, usage = _concurrent("reserve", given=False)
    assert most == 2 and usage <= 4 / 32
    assert s.num_preemptions_total == 0


def test_reserve_with_max_tokens_reserves_prompt_plus_max_tokens():
    _, most, _ = _concurrent("reserve", given=True)  # 16 + 8 tokens: 2 blocks each, all four fit
    assert most == 4


def test_reserve_reports_why_requests_wait():
    s = Scheduler(SchedulerConfig(policy="prefill-first", max_context_tokens=256, kv_admission="reserve"),
                  BlockManager(32, 16))
    for i in range(3):
        s.add(_seq(f"r{i}", 16, given=False))
    plan = s.schedule()
    assert _admitted(plan) == ["r0", "r1"]
    assert s.waiting_reasons == {WAIT_KV_RESERVATION: 1}
    assert s.reserved_blocks_outstanding() == 2 * 15  # each holds 1 of its 16 reserved blocks


@pytest.mark.parametrize("admission,kv", [("fcfs", "reserve"), ("skip-blocked", "on-demand"),
                                          ("skip-blocked", "reserve")])
def test_random_workload_under_each_admission_frees_everything(admission, kv):
    rng = random.Random(f"{admission}{kv}")
    for policy, cap in (("prefill-first", None), ("chunked", None), ("chunked", 2)):
        cfg = SchedulerConfig(policy=policy, chunk_size_tokens=24, max_num_batched_tokens=48, max_running=6,
                              max_context_tokens=128, admission=admission, kv_admission=kv, max_partial_prefills=cap)
        s = Scheduler(cfg, BlockManager(24, 4))
        pending = [_seq(f"q{i}", rng.randint(1, 60), rng.randint(1, 12), given=rng.random() < 0.7) for i in range(25)]
        for _ in range(3000):
            if pending and rng.random() < 0.4:
                s.add(pending.pop())
            plan = s.schedule()
            assert plan.num_tokens <= cfg.max_num_batched_tokens or len(plan.items) == 1
            owned = [b for q in s.running for b in s.blocks.block_table(q.seq_id)]
            assert len(owned) == len(set(owned)) and len(owned) + s.blocks.num_free_blocks == 24
            if kv == "reserve":
                assert s.reserved_blocks_outstanding() <= s.blocks.num_free_blocks
            _run(s, plan)
            if not pending and not s.has_work():
                break
        assert not s.has_work() and s.blocks.num_free_blocks == 24
