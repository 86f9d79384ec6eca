"""Continuous-batching scheduler: budgets, policies, preemption, admission checks."""

from __future__ import annotations

import random

import pytest

from diag.bundled_engine.kv_cache import BlockManager
from diag.bundled_engine.sampler import SamplerState, SamplingParams
from diag.bundled_engine.scheduler import Scheduler
from diag.bundled_engine.scheduler_types import RequestRejected, SchedulerConfig, Sequence, StepPlan


def _seq(i: int, prompt: int, max_tokens: int = 4) -> Sequence:
    p = SamplingParams(max_tokens=max_tokens)
    return Sequence(f"s{i}", list(range(1, prompt + 1)), p, SamplerState(p, 0))


def _run_step(s: Scheduler, plan: StepPlan) -> list[Sequence]:
    """Pretend to execute the plan: tokens land in the cache, completing seqs get a token."""
    done = []
    for item in plan.items:
        s.on_step_done(item)
        if item.completes:
            item.seq.output_ids.append(7)
            if len(item.seq.output_ids) >= item.seq.params.max_tokens:
                done.append(item.seq)
    for seq in done:
        s.remove(seq)
    return done


def _check_blocks(s: Scheduler) -> None:
    bm = s.blocks
    owned = [b for q in s.running for b in bm.block_table(q.seq_id)]
    assert len(owned) == len(set(owned))
    assert len(owned) + bm.num_free_blocks == bm.num_blocks
    for q in s.waiting:
        assert not bm.has(q.seq_id)  # waiting (incl. preempted) sequences hold no blocks


def test_prefill_first_pauses_decodes():
    s = Scheduler(SchedulerConfig(policy="prefill-first"), BlockManager(64, 4))
    s.add(_seq(0, 10))
    plan = s.schedule()
    _run_step(s, plan)
    assert plan.num_prefill_tokens == 10 and plan.num_decode_seqs == 0
    s.add(_seq(1, 12))
    plan = s.schedule()
    assert plan.num_prefill_seqs == 1 and plan.num_decode_seqs == 0  # s0's decode waits
    _run_step(s, plan)
    plan = s.schedule()
    assert plan.num_decode_seqs == 2 and plan.num_prefill_tokens == 0


def test_decode_first_keeps_decodes_and_admits_into_remaining_budget():
    s = Scheduler(SchedulerConfig(policy="decode-first", max_num_batched_tokens=16), BlockManager(64, 4))
    s.add(_seq(0, 10))
    _run_step(s, s.schedule())
    s.add(_seq(1, 15))  # 1 decode + 15 = 16 fits exactly
    plan = s.schedule()
    assert plan.num_decode_seqs == 1 and plan.num_prefill_tokens == 15
    _run_step(s, plan)
    s.add(_seq(2, 15))  # 2 decodes + 15 > 16: waits, decodes go on
    plan = s.schedule()
    assert plan.num_decode_seqs == 2 and plan.num_prefill_tokens == 0 and len(s.waiting) == 1


def test_chunked_splits_long_prompts_and_mixes_decodes():
    s = Scheduler(SchedulerConfig(policy="chunked", chunk_size_tokens=8), BlockManager(64, 4))
    s.add(_seq(0, 5, max_tokens=10))
    _run_step(s, s.schedule())
    s.add(_seq(1, 20))
    sizes = []
    while True:
        plan = s.schedule()
        assert plan.num_prefill_tokens <= 8
        pre = [i for i in plan.items if i.is_prefill]
        if not pre:
            break
        assert plan.num_decode_seqs == 1  # s0 decodes every step
        sizes.append(pre[0].num_new_tokens)
        _run_step(s, plan)
        _check_blocks(s)
    assert sizes == [8, 8, 4]


def test_lone_oversize_prompt_still_runs_without_chunking():
    s = Scheduler(SchedulerConfig(policy="prefill-first", max_num_batched_tokens=8), BlockManager(64, 4))
    s.add(_seq(0, 30))
    plan = s.schedule()
    assert plan.num_prefill_tokens == 30


def test_max_running_caps_the_batch():
    s = Scheduler(SchedulerConfig(policy="prefill-first", max_running=3), BlockManager(64, 4))
    for i in range(5):
        s.add(_seq(i, 4))
    plan = s.schedule()
    assert plan.num_prefill_seqs == 3 and len(s.waiting) == 2


def test_preemption_by_recompute_when_blocks_run_out():
    # 6 blocks of 4 tokens; two sequences of 8-token prompts growing by decode
    s = Scheduler(SchedulerConfig(policy="prefill-first"), BlockManager(6, 4))
    a, b = _seq(0, 8, max_tokens=12), _seq(1, 8, max_tokens=12)
    s.add(a)
    s.add(b)
    _run_step(s, s.schedule())
    preempted_seen = False
    for _ in range(60):
        if not s.has_work():
            break
        plan = s.schedule()
        _check_blocks(s)
        if plan.preempted:
            preempted_seen = True
            assert plan.preempted == [b] and s.waiting[0] is b and b.num_computed_tokens == 0
            assert all(i.seq is not b for i in plan.items)
        _run_step(s, plan)
    assert preempted_seen and b.preemptions >= 1 and s.num_preemptions_total >= 1
    assert not s.has_work() and s.blocks.num_free_blocks == 6
    # the recompute prefill covered prompt + output so far, then decoding went on to max_tokens
    assert len(a.output_ids) == 12 and len(b.output_ids) == 12


@pytest.mark.parametrize("policy", ["prefill-first", "decode-first", "chunked"])
def test_random_workload_respects_budgets_and_frees_everything(policy):
    rng = random.Random(hash(policy) & 0xFFFF)
    cfg = SchedulerConfig(policy=policy, chunk_size_tokens=24, max_num_batched_tokens=48, max_running=6)
    s = Scheduler(cfg, BlockManager(40, 4))
    seqs = []
    for i in range(40):
        seqs.append(_seq(i, rng.randint(1, 40), max_tokens=rng.randint(1, 12)))
    pending = list(seqs)
    steps = 0
    while pending or s.has_work():
        for _ in range(rng.randint(0, 3)):
            if pending:
                s.add(pending.pop(0))
        plan = s.schedule()
        steps += 1
        assert steps < 5000
        assert len(s.running) <= cfg.max_running
        lone = len(plan.items) == 1 and plan.items[0].is_prefill
        assert plan.num_tokens <= cfg.max_num_batched_tokens or lone
        if policy == "chunked":
            assert plan.num_prefill_tokens <= cfg.chunk_size_tokens
        if policy == "prefill-first":
            assert plan.num_prefill_seqs == 0 or plan.num_decode_seqs == 0
        ids = [id(i.seq) for i in plan.items]
        assert len(ids) == len(set(ids))
        _check_blocks(s)
        _run_step(s, plan)
    assert all(len(q.output_ids) == q.params.max_tokens for q in seqs)
    assert s.blocks.num_free_blocks == s.blocks.num_blocks


def test_admission_checks():
    s = Scheduler(SchedulerConfig(max_context_tokens=100), BlockManager(10, 4))
    s.check_admissible(20, 10)
    with pytest.raises(RequestRejected, match="maximum context length is 100"):
        s.check_admissible(100, 1)
    with pytest.raises(RequestRejected, match="90 in the prompt, 20 in the completion"):
        s.check_admissible(90, 20)
    with pytest.raises(RequestRejected, match="KV-cache blocks"):
        s.check_admissible(30, 20)  # 50 tokens = 13 blocks > 10
    with pytest.raises(RequestRejected, match="empty"):
        s.check_admissible(0, 5)
    with pytest.raises(ValueError, match="policy"):
        SchedulerConfig(policy="fifo").validate()
