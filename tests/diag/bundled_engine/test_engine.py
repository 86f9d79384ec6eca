"""The engine end to end (no HTTP): correctness, spans, aborts, preemption, rejections."""

from __future__ import annotations

import time

import pytest
import torch

from support.engine_testutil import finished_spans, spans_by_request
from diag.ground import stages
from diag.bundled_engine import (
    EngineConfig,
    QueueFullError,
    RequestRejected,
    SamplingParams,
    SyncEventStream,
    build_engine,
)

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _ids(events) -> list[int]:
    return [e.token_id for e in events if e.token_id is not None]


def test_greedy_generation_equals_dense_argmax_loop(traced_engine):
    prompt = list(range(40, 90))
    text, events = traced_engine.generate(prompt, SamplingParams(max_tokens=12, **GREEDY))
    model = traced_engine.runner.model
    ids, want = list(prompt), []
    for _ in range(12):
        nxt = int(model.forward_dense(ids)[-1].argmax())
        want.append(nxt)
        ids.append(nxt)
    assert _ids(events) == want
    assert events[-1].finished and events[-1].finish_reason == "length"
    assert text == traced_engine.tokenizer.decode(want)


def test_every_request_has_all_stage_spans_in_order(traced_engine):
    before = {s.context.span_id for s in finished_spans(traced_engine)}
    streams = []
    prompt = "The scheduler admits the request when the cache has free blocks. " * 4
    for i in range(4):
        s = SyncEventStream()
        traced_engine.submit(s.push, SamplingParams(max_tokens=6, temperature=0.7, seed=i, ignore_eos=True), prompt=prompt)
        streams.append(s)
    for s in streams:
        list(s)
    spans = [s for s in finished_spans(traced_engine) if s.context.span_id not in before]
    reqs = spans_by_request(spans)
    assert len(reqs) == 4
    for by in reqs.values():
        root = by[stages.SPAN_REQUEST][0]
        for name in (stages.TOKENIZE, stages.QUEUE, stages.PREFILL, stages.SAMPLE, stages.DETOKENIZE, stages.DECODE):
            assert len(by[name]) == 1, name
            assert by[name][0].parent.span_id == root.context.span_id
        assert stages.COMM not in by  # tp=1: no comm span
        t = {n: by[n][0] for n in by}
        assert root.start_time <= t["tokenize"].start_time <= t["tokenize"].end_time <= t["queue"].start_time
        assert t["queue"].end_time <= t["prefill"].start_time <= t["prefill"].end_time <= t["sample"].start_time
        assert t["sample"].end_time <= t["detokenize"].start_time <= t["detokenize"].end_time <= root.end_time
        a = root.attributes
        assert a[stages.GEN_AI_REQUEST_MODEL] == "tiny"
        assert a[stages.GEN_AI_USAGE_OUTPUT_TOKENS] == 6 and a[stages.GEN_AI_USAGE_INPUT_TOKENS] > 40
        assert a[stages.GEN_AI_REQUEST_MAX_TOKENS] == 6 and a[stages.ATTR_PREEMPTIONS] == 0
        assert a[stages.ATTR_TP_SIZE] == 1 and list(a[stages.GEN_AI_RESPONSE_FINISH_REASONS]) == ["length"]
        times = list(a[stages.ATTR_TOKEN_TIMES_NS])
        assert len(times) == 6 and times == sorted(times)
        assert times[0] == t["detokenize"].end_time == a[stages.ATTR_FIRST_TOKEN_NS]
        # prompt text is never recorded
        for s in by.values():
            for sp in s:
                assert not any(isinstance(v, str) and "scheduler admits" in v for v in sp.attributes.values())
    steps = [s for s in spans if s.name == stages.SPAN_ENGINE_STEP]
    assert steps and sum(s.attributes[stages.ATTR_STEP_PREFILL_TOKENS] for s in steps) >= 4 * 40
    assert any(s.attributes[stages.ATTR_STEP_DECODE_SEQS] > 1 for s in steps)  # decodes are batched
    for s in steps:
        assert 0.0 <= s.attributes[stages.ATTR_STEP_KV_USAGE] <= 1.0
        assert s.attributes[stages.ATTR_STEP_COMM_S] == 0.0


def test_cold_start_spans_and_meta(traced_engine):
    cold = [s for s in finished_spans(traced_engine) if s.name == stages.SPAN_COLD_START]
    assert sorted(s.attributes[stages.ATTR_COLD_START_PHASE] for s in cold) == ["load", "warmup"]
    assert all(s.parent is None for s in cold)


def test_abort_frees_blocks_and_ends_the_span(traced_engine):
    s = SyncEventStream()
    res = traced_engine.submit(s.push, SamplingParams(max_tokens=1000, **GREEDY), prompt="hello " * 30)
    first = s.get(30)
    assert not first.finished
    traced_engine.abort(res.request_id, "disconnect")
    last = None
    for ev in s:
        last = ev
    assert last.finished and last.finish_reason == "abort"
    deadline = time.time() + 5
    while traced_engine.blocks.num_free_blocks != traced_engine.blocks.num_blocks and time.time() < deadline:
        time.sleep(0.01)
    assert traced_engine.blocks.num_free_blocks == traced_engine.blocks.num_blocks
    spans = finished_spans(traced_engine)
    root = [x for x in spans if x.name == stages.SPAN_REQUEST and x.attributes.get(stages.ATTR_REQUEST_ID) == res.request_id]
    assert root and root[0].attributes[stages.ATTR_ERROR] == "disconnect"


def test_preemption_by_recompute_gives_the_same_tokens():
    prompts = [list(range(10 + i, 50 + i)) for i in range(6)]
    params = SamplingParams(max_tokens=30, **GREEDY)

    def run(**kw):
        eng = build_engine(model="tiny", warmup=False, **kw)
        try:
            streams = []
            for p in prompts:
                s = SyncEventStream()
                eng.submit(s.push, params, prompt_ids=p)
                streams.append(s)
            outs = [_ids(list(s)) for s in streams]
            return outs, eng.stats()
        finally:
            eng.shutdown()

    ref, _ = run()
    # 16 blocks x 16 tokens = 256 token slots for 6 x 70 tokens: must preempt
    got, stats = run(kv_blocks=16, block_size=16)
    assert stats["preemptions"] > 0
    assert stats["kv_free_blocks"] == 16
    assert got == ref


@pytest.mark.parametrize("policy", ["chunked", "decode-first"])
def test_policies_give_the_same_greedy_tokens(policy, traced_engine):
    prompts = [list(range(100 + 3 * i, 160 + 5 * i)) for i in range(3)]
    params = SamplingParams(max_tokens=8, **GREEDY)
    eng = build_engine(model="tiny", warmup=False, policy=policy, chunk_size=16, max_batched_tokens=64)
    try:
        for p in prompts:
            assert _ids(eng.generate(p, params)[1]) == _ids(traced_engine.generate(p, params)[1])
    finally:
        eng.shutdown()


def test_rejections(traced_engine):
    sink = SyncEventStream()
    with pytest.raises(RequestRejected, match="maximum context length"):
        traced_engine.submit(sink.push, SamplingParams(max_tokens=5), prompt_ids=[1] * 2048)
    with pytest.raises(ValueError, match="max_tokens"):
        traced_engine.submit(sink.push, SamplingParams(max_tokens=0), prompt="hi")
    with pytest.raises(RequestRejected, match="token ids"):
        traced_engine.submit(sink.push, SamplingParams(max_tokens=5), prompt_ids=[5000])
    with pytest.raises(RequestRejected, match="empty"):
        traced_engine.submit(sink.push, SamplingParams(max_tokens=5), prompt="")


def test_waiting_queue_limit():
    eng = build_engine(model="tiny", warmup=False, max_waiting=2, max_running=1,
                       faults=EngineConfig().faults.__class__(scheduler_stall_ms=300))
    try:
        got_full = 0
        for _ in range(6):
            try:
                eng.submit(lambda ev: None, SamplingParams(max_tokens=2), prompt="x y z")
            except QueueFullError as exc:
                assert "max_waiting" in str(exc)
                got_full += 1
        assert got_full >= 3
    finally:
        eng.shutdown()


def test_tracing_off_costs_no_spans():
    from collectors.spans import NULL_SINK

    eng = build_engine(model="tiny", warmup=False)
    try:
        assert eng.sink is NULL_SINK and not eng.tracing
        _, events = eng.generate("hello world", SamplingParams(max_tokens=3))
        assert events[-1].finished
    finally:
        eng.shutdown()


def test_capture_dir_gets_spans_and_meta(tmp_path):
    import json

    from diag.bundled_engine import parse_injections

    cap = tmp_path / "cap"
    eng = build_engine(model="tiny", capture_dir=cap, faults=parse_injections(["detokenize_ms_per_token=1"]))
    eng.generate("hello there", SamplingParams(max_tokens=3))
    eng.shutdown()
    meta = json.loads((cap / "meta.json").read_text())
    assert meta["faults_injected"] == {"detokenize_ms_per_token": 1.0}
    assert meta["engine"] == "bundled" and meta["engine_config"]["policy"] == "prefill-first"
    lines = (cap / "spans.otlp.jsonl").read_text().splitlines()
    names = {s["name"] for line in lines for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for s in ss["spans"]}
    assert {"ttft.request", "tokenize", "queue", "prefill", "sample", "detokenize", "ttft.engine.step",
            "ttft.cold_start"} <= names
