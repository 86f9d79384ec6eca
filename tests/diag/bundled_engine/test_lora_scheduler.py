"""LoRA slots in the scheduler: at most max_loras adapters in the running batch; a request for another
adapter is passed over (never blocking those behind it) until its adapter's turn."""

from __future__ import annotations

import pytest

from diag.bundled_engine.kv_cache import BlockManager
from diag.bundled_engine.sampler import SamplerState, SamplingParams
from diag.bundled_engine.scheduler import Scheduler
from diag.bundled_engine.scheduler_types import WAIT_LORA, SchedulerConfig, Sequence, StepPlan


def _seq(i: int, lora: str | None, prompt: int = 8, max_tokens: int = 3) -> Sequence:
    p = SamplingParams(max_tokens=max_tokens)
    return Sequence(f"s{i}", list(range(1, prompt + 1)), p, SamplerState(p, 0), lora=lora)


def _run_step(s: Scheduler, plan: StepPlan) -> list[Sequence]:
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


@pytest.mark.parametrize("policy", ["prefill-first", "decode-first", "chunked"])
@pytest.mark.parametrize("admission", ["fcfs", "skip-blocked"])
def test_one_slot_passes_over_another_adapter_without_blocking_those_behind(policy, admission):
    s = Scheduler(SchedulerConfig(policy=policy, admission=admission, max_loras=1), BlockManager(64, 4))
    for i, lora in enumerate(("a", "b", None, "a")):
        s.add(_seq(i, lora))
    plan = s.schedule()
    assert [it.seq.seq_id for it in plan.items] == ["s0", "s2", "s3"]  # b passed over; base and a behind it run
    assert s.waiting_reasons == {WAIT_LORA: 1} and s.lora_waiting == {"s1"}
    assert s.running_loras() == {"a"}
    finished: list[str] = []
    while "s1" not in {q.seq_id for q in s.running}:
        assert "s1" in s.lora_waiting
        finished += [q.seq_id for q in _run_step(s, plan)]
        plan = s.schedule()
    assert {"s0", "s3"} <= set(finished)  # b ran once a's requests had finished
    assert s.running_loras() == {"b"} and not s.lora_waiting


def test_two_slots_hold_two_adapters_and_base_requests_need_none():
    s = Scheduler(SchedulerConfig(max_loras=2), BlockManager(64, 4))
    for i, lora in enumerate(("a", "b", None, "c", "b")):
        s.add(_seq(i, lora))
    plan = s.schedule()
    assert [it.seq.seq_id for it in plan.items] == ["s0", "s1", "s2", "s4"]
    assert s.lora_waiting == {"s3"} and s.running_loras() == {"a", "b"}


def test_no_limit_without_slots():
    s = Scheduler(SchedulerConfig(), BlockManager(64, 4))
    for i, lora in enumerate(("a", "b", "c")):
        s.add(_seq(i, lora))
    assert len(s.schedule().items) == 3 and not s.lora_waiting


def test_max_loras_must_be_positive():
    with pytest.raises(ValueError, match="--max-loras must be >= 1"):
        SchedulerConfig(max_loras=0).validate()
