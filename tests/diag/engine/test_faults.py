"""Fault injection: parsing, and each injection moves the stage it targets (measured, not faked)."""

from __future__ import annotations

import pytest

from diag import stages
from diag.engine import FaultError, SamplingParams, SyncEventStream, build_engine, parse_injections
from diag.engine.faults import FaultConfig, fault_from_mapping
from engine_testutil import finished_spans, spans_by_request

PROMPT = "the server and the queue and the cache " * 6  # ~50 tokens


def test_parse_injections():
    f = parse_injections(["scheduler_stall_ms=20", "load_delay_s=0.5", "scheduler_stall_ms=30"])
    assert f.scheduler_stall_ms == 30 and f.load_delay_s == 0.5
    assert f.active() == {"scheduler_stall_ms": 30.0, "load_delay_s": 0.5}
    assert parse_injections(None) == FaultConfig()
    assert fault_from_mapping({"tokenize_ms_per_token": 2}).tokenize_ms_per_token == 2


@pytest.mark.parametrize(
    "item,msg",
    [
        ("bogus=1", "unknown fault 'bogus'; known: tokenize_ms_per_token"),
        ("scheduler_stall_ms", "expected NAME=VALUE"),
        ("scheduler_stall_ms=abc", "is not a number"),
        ("scheduler_stall_ms=-1", "must be between 0 and"),
        ("load_delay_s=inf", "must be between 0 and"),
    ],
)
def test_bad_injections_have_clear_messages(item, msg):
    with pytest.raises(FaultError, match=msg) as ei:
        parse_injections([item])
    assert "\n" not in str(ei.value)


def test_collective_latency_needs_tp():
    with pytest.raises(ValueError, match="needs --tp 2"):
        build_engine(model="tiny", faults=parse_injections(["collective_latency_ms=5"]), start=False)


def _stage_s(engine, stage: str) -> float:
    """Mean duration (s) of ``stage`` over 2 fresh requests."""
    before = {s.context.span_id for s in finished_spans(engine)}
    for _ in range(2):
        s = SyncEventStream()
        engine.submit(s.push, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), prompt=PROMPT)
        list(s)
    spans = [s for s in finished_spans(engine) if s.context.span_id not in before]
    durs = [by[stage][0].end_time - by[stage][0].start_time for by in spans_by_request(spans).values()]
    assert len(durs) == 2
    return sum(durs) / len(durs) / 1e9


@pytest.mark.parametrize(
    "fault,stage,at_least_s",
    [
        ("tokenize_ms_per_token=2", stages.TOKENIZE, 0.09),  # ~50 tokens x 2 ms
        ("scheduler_stall_ms=120", stages.QUEUE, 0.11),
        ("detokenize_ms_per_token=80", stages.DETOKENIZE, 0.075),
    ],
)
def test_each_injection_moves_its_stage(traced_engine, fault, stage, at_least_s):
    base = _stage_s(traced_engine, stage)
    eng = build_engine(model="tiny", trace_memory=True, warmup=False, faults=parse_injections([fault]))
    try:
        slow = _stage_s(eng, stage)
    finally:
        eng.shutdown()
    assert slow >= at_least_s
    assert slow - base >= at_least_s * 0.9


def test_load_delay_moves_cold_start():
    eng = build_engine(model="tiny", trace_memory=True, warmup=False, faults=parse_injections(["load_delay_s=0.3"]))
    try:
        cold = [s for s in finished_spans(eng) if s.name == stages.SPAN_COLD_START]
        load = [s for s in cold if s.attributes[stages.ATTR_COLD_START_PHASE] == "load"][0]
        assert (load.end_time - load.start_time) / 1e9 >= 0.3
        assert eng.cold_start_s["load"] >= 0.3
    finally:
        eng.shutdown()
