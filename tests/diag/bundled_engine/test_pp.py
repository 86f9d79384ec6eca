"""Pipeline parallel over torch.distributed (gloo on CPU): same tokens as pp=1, a measured bubble on spans."""

from __future__ import annotations

import pytest

from diag.ground import stages
from diag.bundled_engine import SamplingParams, SyncEventStream, build_engine
from diag.bundled_engine.config import EngineConfig
from diag.bundled_engine.model import SeqInput
from diag.bundled_engine.model_config import PRESETS, stage_layers
from diag.bundled_engine.pp import PipelineAccount, split_microbatches
from support.engine_testutil import finished_spans, spans_by_request

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = ([5, 6, 7, 8, 9, 10], list(range(300, 400)), list(range(40, 90)))


def _seq(n: int) -> SeqInput:
    return SeqInput(list(range(1, n + 1)), 0, [0])


def test_stage_layers_cover_every_layer_once_and_evenly():
    for layers, pp in ((4, 2), (4, 3), (4, 4), (12, 5)):
        parts = [stage_layers(layers, pp, k) for k in range(pp)]
        assert [i for r in parts for i in r] == list(range(layers))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_microbatches_keep_order_and_balance_tokens():
    seqs = [_seq(n) for n in (40, 3, 35, 1, 1)]
    groups = split_microbatches(seqs, 2)
    assert [s for g in groups for s in g] == seqs and len(groups) == 2
    assert [sum(len(s.token_ids) for s in g) for g in groups] == [40, 40]
    assert split_microbatches(seqs[:1], 4) == [seqs[:1]]  # never more groups than sequences
    assert all(split_microbatches(seqs, 5))


def test_bad_pp_is_a_one_line_error():
    layers = PRESETS["tiny"].num_layers
    with pytest.raises(ValueError, match=f"--pp {layers + 1} is more stages than the model's {layers} layers"):
        EngineConfig(pp=layers + 1).validate()
    with pytest.raises(ValueError, match="--pp 2 with --tp 2"):
        EngineConfig(pp=2, tp=2).validate()
    with pytest.raises(ValueError, match="--pp-microbatches"):
        EngineConfig(pp=2, pp_microbatches=0).validate()


def test_bubble_share_is_idle_over_stage_time():
    acct = PipelineAccount(1, 1.0, (0.45, 0.45), (0.05, 0.05), (0.5, 0.5))
    assert acct.pp_size == 2 and acct.bubble_share == pytest.approx(0.5) and acct.mean_comm_s == pytest.approx(0.05)


@pytest.fixture(scope="module")
def pp2_engine():
    eng = build_engine(model="tiny", pp=2, trace_memory=True)
    yield eng
    eng.shutdown()


def _tokens(engine, prompt) -> list[int]:
    return [e.token_id for e in engine.generate(prompt, GREEDY)[1] if e.token_id is not None]


@pytest.mark.slow
def test_pp2_greedy_output_equals_pp1_token_for_token(pp2_engine):
    ref = build_engine(model="tiny", warmup=False)
    try:
        want = [_tokens(ref, p) for p in PROMPTS]
    finally:
        ref.shutdown()
    assert [_tokens(pp2_engine, p) for p in PROMPTS] == want  # one at a time: one micro-batch per step
    streams = []
    for p in PROMPTS:  # together: the steps' sequences split into two micro-batches
        s = SyncEventStream()
        pp2_engine.submit(s.push, GREEDY, prompt_ids=p)
        streams.append(s)
    assert [[e.token_id for e in s if e.token_id is not None] for s in streams] == want


@pytest.mark.slow
def test_pp2_spans_carry_compute_comm_and_bubble_per_stage(pp2_engine):
    before = {s.context.span_id for s in finished_spans(pp2_engine)}
    pp2_engine.generate(list(range(20, 220)), GREEDY)  # alone: each step is one micro-batch
    spans = [s for s in finished_spans(pp2_engine) if s.context.span_id not in before]
    steps = [s for s in spans if s.name == stages.SPAN_ENGINE_STEP]
    assert steps
    for st in steps:
        a = st.attributes
        assert a[stages.ATTR_STEP_PP_SIZE] == 2 and a[stages.ATTR_STEP_PP_MICROBATCHES] == 1
        wall_s = (st.end_time - st.start_time) / 1e9
        for c, m, b in zip(a[stages.ATTR_STEP_PP_COMPUTE_S], a[stages.ATTR_STEP_PP_COMM_S], a[stages.ATTR_STEP_PP_BUBBLE_S]):
            assert c > 0 and m > 0 and b >= 0
            assert c + m + b <= wall_s + 1e-3  # within the step span (stage 0's window sits inside it)
        assert a[stages.ATTR_STEP_COMM_S] == pytest.approx(sum(a[stages.ATTR_STEP_PP_COMM_S]) / 2)
    (by,) = spans_by_request(spans).values()
    prefill, comm = by[stages.PREFILL][0], by[stages.COMM][0]
    assert prefill.start_time <= comm.start_time <= comm.end_time <= prefill.end_time
    # one micro-batch: while one stage runs, the other waits; idle is about half of the stage time
    first = steps[0].attributes
    share = sum(first[stages.ATTR_STEP_PP_BUBBLE_S]) / (sum(first[stages.ATTR_STEP_PP_BUBBLE_S])
                                                        + sum(first[stages.ATTR_STEP_PP_COMPUTE_S])
                                                        + sum(first[stages.ATTR_STEP_PP_COMM_S]))
    assert 0.25 < share < 0.75
    bubble_s = prefill.attributes[stages.ATTR_PP_BUBBLE_S]
    assert bubble_s == pytest.approx(sum(first[stages.ATTR_STEP_PP_BUBBLE_S]) / 2)
    assert by[stages.SPAN_REQUEST][0].attributes[stages.ATTR_PP_SIZE] == 2
