"""LoRA adapters on the running engine (tiny model, CPU): the adapter's output, waits for a slot inside
``queue``, requests not blocked behind such a wait, loads from host memory and from disk, step spans
and /metrics."""

from __future__ import annotations

import time

import pytest

from diag.ground import stages
from diag.bundled_engine import RequestRejected, SamplingParams, SyncEventStream, build_engine
from diag.bundled_engine.lora import merged_state_dict, name_seed, write_adapter
from diag.bundled_engine.model import LlamaModel
from diag.bundled_engine.model_config import PRESETS, random_state_dict
from support.engine_testutil import finished_spans, spans_by_request

TINY = PRESETS["tiny"]
PROMPT = [5, 17, 300, 42, 7, 1999, 64, 8]


def _submit(eng, lora: str | None, max_tokens: int = 8) -> SyncEventStream:
    s = SyncEventStream()
    eng.submit(s.push, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), prompt_ids=PROMPT,
               lora=lora)
    return s


def _tokens(stream: SyncEventStream) -> list[int]:
    events = list(stream)
    assert events[-1].finish_reason == "length", events[-1]
    return [e.token_id for e in events if e.token_id is not None]


def _requests(eng) -> list[dict]:
    """Each finished request's root attributes, its queue seconds and start (ns), oldest first."""
    out = []
    for by in spans_by_request(finished_spans(eng)).values():
        root = by[stages.SPAN_REQUEST][0]
        q = by[stages.QUEUE][0]
        out.append({**dict(root.attributes), "queue_s": (q.end_time - q.start_time) / 1e9, "start": root.start_time})
    return sorted(out, key=lambda a: a["start"])


def _metric(eng, name: str, **labels) -> float:
    return eng.metrics.registry.get_sample_value("ttft_engine:" + name, {"model_name": eng.model_name, **labels}) or 0.0


def _greedy(model: LlamaModel, ids: list[int], n: int) -> list[int]:
    ids, out = list(ids), []
    for _ in range(n):
        tok = int(model.forward_dense(ids)[-1].argmax())
        out.append(tok)
        ids.append(tok)
    return out


def test_an_adapter_s_tokens_are_the_merged_model_s_and_not_the_base_s(tmp_path):
    path = write_adapter(tmp_path / "x", TINY, rank=8, seed=3, b_std=0.08)
    base = random_state_dict(TINY, seed=0)
    want = _greedy(LlamaModel.from_state_dict(TINY, merged_state_dict(base, path, TINY)), PROMPT, 8)
    eng = build_engine(model="tiny", lora_modules=(f"x={path}",), warmup=False)
    try:
        got, plain = _tokens(_submit(eng, "x", 8)), _tokens(_submit(eng, None, 8))
        with pytest.raises(RequestRejected, match="LoRA adapter 'nope' not found; this server serves x"):
            _submit(eng, "nope")
    finally:
        eng.shutdown()
    assert got == want
    assert plain == _greedy(LlamaModel.from_state_dict(TINY, base), PROMPT, 8) and plain != got


def test_an_adapter_named_without_a_path_is_random_from_its_name(tmp_path):
    path = write_adapter(tmp_path / "n", TINY, rank=8, seed=name_seed("n"))
    eng = build_engine(model="tiny", lora_modules=("n", f"same={path}"), max_loras=2, warmup=False)
    try:
        assert _tokens(_submit(eng, "n")) == _tokens(_submit(eng, "same"))
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def one_slot():
    eng = build_engine(model="tiny", trace_memory=True, lora_modules=("a", "b"), max_loras=1, max_cpu_loras=2)
    yield eng
    eng.shutdown()


def test_with_one_slot_the_second_adapter_waits_and_nothing_queues_behind_it(one_slot):
    eng = one_slot
    finished_spans(eng)
    eng.sink.memory.clear()
    long_a = _submit(eng, "a", max_tokens=60)
    while eng.stats()["running"] == 0:
        time.sleep(0.001)
    b = _submit(eng, "b")
    base, a2 = _submit(eng, None), _submit(eng, "a")
    deadline = time.monotonic() + 10
    while not any(s.labels["waiting_lora_adapters"] == "b" for s in _lora_info(eng)) and time.monotonic() < deadline:
        time.sleep(0.001)  # the gauges are set at the end of the step that planned b's wait
    info = {s.labels["running_lora_adapters"]: s for s in _lora_info(eng)}
    assert set(info) == {"a"} and info["a"].labels["waiting_lora_adapters"] == "b"
    assert info["a"].labels["max_lora"] == "1" and info["a"].value > time.time() - 60
    assert _metric(eng, "num_requests_waiting_by_reason", reason="deferred") >= 1
    assert _metric(eng, "num_requests_waiting_by_reason", reason="lora") >= 1
    for s in (base, a2, long_a, b):
        _tokens(s)
    reqs = _requests(eng)
    by = {(r.get(stages.ATTR_LORA_NAME), r["start"]): r for r in reqs}
    la, rb, rbase, ra2 = (by[k] for k in sorted(by, key=lambda k: k[1]))
    assert rb[stages.ATTR_LORA_NAME] == "b" and rb[stages.ATTR_LORA_WAIT_S] > 0.01
    assert rb["queue_s"] >= rb[stages.ATTR_LORA_WAIT_S]  # the queue span covers the slot wait
    assert rbase.get(stages.ATTR_LORA_WAIT_S) is None and rbase["queue_s"] < rb[stages.ATTR_LORA_WAIT_S] / 2
    assert ra2[stages.ATTR_LORA_WAIT_S] == 0 and ra2["queue_s"] < rb[stages.ATTR_LORA_WAIT_S] / 2
    steps = [dict(s.attributes) for s in finished_spans(eng) if s.name == stages.SPAN_ENGINE_STEP]
    assert max(s[stages.ATTR_STEP_WAITING_LORA] for s in steps) >= 1
    assert {s[stages.ATTR_STEP_LORAS] for s in steps} <= {0, 1}  # one slot: never two adapters in a batch


def _lora_info(eng) -> list:
    fam = [f for f in eng.metrics.registry.collect() if f.name == "ttft_engine:lora_requests_info"]
    return fam[0].samples if fam else []


def test_a_reload_comes_from_host_memory_and_after_host_eviction_from_disk(one_slot):
    eng = one_slot
    loads0 = dict(eng.stats()["lora_loads"])
    for name in ("a", "b", "a", "b"):  # one slot: every switch loads; the host holds both
        _tokens(_submit(eng, name, 2))
    loads = eng.stats()["lora_loads"]
    assert loads["host"] - loads0["host"] >= 2 and loads["disk"] == 2  # each read from disk once
    assert _metric(eng, "lora_load_time_seconds_count", source="host") >= 2
    small = build_engine(model="tiny", trace_memory=True, lora_modules=("a", "b"), max_loras=1, warmup=False)
    try:
        for name in ("a", "b", "a"):
            _tokens(_submit(small, name, 2))
        assert small.stats()["lora_loads"] == {"host": 0, "disk": 3}  # host holds one: a is read again
        assert small.stats()["lora_in_host"] == ["a"] and small.stats()["lora_in_slots"] == ["a"]
        last = _requests(small)[-1]
        assert last[stages.ATTR_LORA_NAME] == "a" and last[stages.ATTR_LORA_LOAD_S] > 0
        steps = [dict(s.attributes) for s in finished_spans(small) if s.name == stages.SPAN_ENGINE_STEP]
        assert sum(1 for s in steps if s[stages.ATTR_STEP_LORA_LOAD_S] > 0) == 3
    finally:
        small.shutdown()


def test_two_slots_two_adapters_neither_waits_and_the_batch_holds_both():
    eng = build_engine(model="tiny", trace_memory=True, lora_modules=("a", "b"), max_loras=2, warmup=False)
    try:
        streams = [_submit(eng, "a", 30), _submit(eng, "b", 30)]
        for s in streams:
            _tokens(s)
        reqs = _requests(eng)
        assert [r[stages.ATTR_LORA_WAIT_S] for r in reqs] == [0, 0]
        steps = [dict(s.attributes) for s in finished_spans(eng) if s.name == stages.SPAN_ENGINE_STEP]
        assert max(s[stages.ATTR_STEP_LORAS] for s in steps) == 2
        assert all(s[stages.ATTR_STEP_WAITING_LORA] == 0 for s in steps)
    finally:
        eng.shutdown()


def test_the_load_fault_lengthens_every_load_inside_prefill():
    from diag.bundled_engine import parse_injections

    eng = build_engine(model="tiny", trace_memory=True, lora_modules=("a",), warmup=False,
                       faults=parse_injections(["lora_load_ms=80"]))
    try:
        _tokens(_submit(eng, "a", 2))
        _tokens(_submit(eng, "a", 2))  # in its slot: no load
        spans = spans_by_request(finished_spans(eng))
        first, second = sorted(spans.values(), key=lambda by: by[stages.SPAN_REQUEST][0].start_time)
        root = first[stages.SPAN_REQUEST][0].attributes
        prefill = first[stages.PREFILL][0]
        assert root[stages.ATTR_LORA_LOAD_S] >= 0.08 and (prefill.end_time - prefill.start_time) / 1e9 >= 0.08
        assert second[stages.SPAN_REQUEST][0].attributes[stages.ATTR_LORA_LOAD_S] == 0
        assert eng.config.as_meta()["faults"] == {"lora_load_ms": 80.0}
    finally:
        eng.shutdown()


def test_an_adapter_that_cannot_be_read_fails_its_requests_alone(tmp_path):
    from diag.bundled_engine.lora import ADAPTER_WEIGHTS

    path = write_adapter(tmp_path / "gone", TINY, rank=4, seed=1)
    eng = build_engine(model="tiny", lora_modules=(f"gone={path}", "ok"), max_loras=2, warmup=False)
    try:
        (path / ADAPTER_WEIGHTS).unlink()  # checked at start, gone by its first load
        bad, good, base = _submit(eng, "gone"), _submit(eng, "ok"), _submit(eng, None)
        last = list(bad)[-1]
        assert last.finish_reason == "error" and last.error_status == 500 and "'gone' failed to load" in last.error
        assert len(_tokens(good)) == 8 and len(_tokens(base)) == 8
        assert eng.stats()["kv_free_blocks"] == eng.stats()["kv_total_blocks"]
    finally:
        eng.shutdown()
