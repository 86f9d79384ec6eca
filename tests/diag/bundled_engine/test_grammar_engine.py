"""Structured output on the running engine (tiny model, CPU): the grammar wait inside ``queue``,
cache hits, requests not blocked behind a compile, constrained answers, failed compiles,
step spans and /metrics."""

from __future__ import annotations

import itertools
import json
import time

import jsonschema
import pytest

from diag.ground import stages
from diag.bundled_engine import SamplingParams, SyncEventStream, build_engine, parse_injections
from diag.bundled_engine.grammar_schema import grammar_source
from support.engine_testutil import finished_spans, spans_by_request

_fresh = itertools.count()


def _schema() -> dict:
    """A bounded schema (every answer ends within ~70 tokens), fresh on every call."""
    n = next(_fresh)
    return {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": [f"oslo{n}", f"rome{n}", "lima"]},
            "temp": {"type": "integer", "minimum": -40, "maximum": 50},
            "code": {"type": "string", "pattern": r"^[A-Z]{3}\d{2}$"},
            "sunny": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["wet", "dry"]}, "maxItems": 2},
        },
        "required": ["city", "temp", "code"],
        "additionalProperties": False,
    }


def _src(schema: dict):
    return grammar_source({"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}})


def _submit(eng, grammar=None, max_tokens: int = 160, seed: int = 0, **kw) -> SyncEventStream:
    s = SyncEventStream()
    eng.submit(s.push, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, **kw),
               prompt="Weather report as JSON:", grammar=grammar)
    return s


def _finish(stream: SyncEventStream):
    """(text, last event)."""
    events = list(stream)
    return "".join(e.text for e in events), events[-1]


def _roots(eng) -> list:
    return [by[stages.SPAN_REQUEST][0] for by in spans_by_request(finished_spans(eng)).values()]


def _metric(eng, name: str, **labels) -> float:
    return eng.metrics.registry.get_sample_value("ttft_engine:" + name, {"model_name": eng.model_name, **labels}) or 0.0


@pytest.fixture(scope="module")
def engine():
    eng = build_engine(model="tiny", trace_memory=True, max_running=8)
    yield eng
    eng.shutdown()


def test_first_request_waits_for_its_grammar_and_a_repeat_hits(engine):
    schema = _schema()
    src = _src(schema)
    hits0, misses0 = _metric(engine, "grammar_cache_hits_total"), _metric(engine, "grammar_cache_misses_total")
    texts = []
    for seed in range(3):
        text, last = _finish(_submit(engine, src, seed=seed))
        assert last.finish_reason == "stop", (last, text)
        jsonschema.validate(json.loads(text), schema)  # the constrained answer follows the schema
        texts.append(text)
    plain, _ = _finish(_submit(engine, None, max_tokens=4))
    roots = sorted(_roots(engine), key=lambda s: s.start_time)[-4:]
    first, *repeats, unconstrained = roots
    a = first.attributes
    assert a[stages.ATTR_GRAMMAR_KEY] == src.key and a[stages.ATTR_GRAMMAR_CACHE_HIT] is False
    assert a[stages.ATTR_GRAMMAR_WAIT_S] > 0
    for r in repeats:
        assert r.attributes[stages.ATTR_GRAMMAR_CACHE_HIT] is True and r.attributes[stages.ATTR_GRAMMAR_WAIT_S] == 0.0
        assert r.attributes[stages.ATTR_GRAMMAR_KEY] == src.key
    assert not any(k.startswith("ttft.grammar.") for k in unconstrained.attributes)
    by = spans_by_request(finished_spans(engine))[first.context.trace_id]
    queue = by[stages.QUEUE][0]
    assert (queue.end_time - queue.start_time) / 1e9 >= a[stages.ATTR_GRAMMAR_WAIT_S]  # the wait is inside queue
    assert not any(json.dumps(schema)[:30] in str(v) for sp in finished_spans(engine) for v in sp.attributes.values())
    assert _metric(engine, "grammar_cache_hits_total") - hits0 == 2
    assert _metric(engine, "grammar_cache_misses_total") - misses0 == 1


def test_json_object_answers_parse(engine):
    text, last = _finish(_submit(engine, grammar_source({"type": "json_object"}), max_tokens=400, seed=1))
    if last.finish_reason == "stop":  # an unbounded grammar may run out of tokens first
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")


def test_a_request_without_a_schema_runs_while_another_compiles():
    eng = build_engine(model="tiny", trace_memory=True, faults=parse_injections(["grammar_compile_ms=1500"]))
    try:
        g = _submit(eng, _src(_schema()), seed=3)
        time.sleep(0.05)
        u = _submit(eng, None, max_tokens=4, ignore_eos=True)
        t0 = time.monotonic()
        _, last_u = _finish(u)
        assert last_u.finish_reason == "length" and time.monotonic() - t0 < 1.0  # not behind the compile
        deadline = time.monotonic() + 2
        while _metric(eng, "num_requests_waiting_by_reason", reason="deferred") != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.stats()["waiting_grammar"] == 1
        assert _metric(eng, "num_requests_waiting_by_reason", reason="deferred") == 1
        assert _metric(eng, "num_requests_waiting_by_reason", reason="capacity") == 0
        assert _metric(eng, "num_requests_waiting_by_reason", reason="grammar") == 1
        assert _metric(eng, "num_requests_waiting") == 1
        text, last_g = _finish(g)
        assert last_g.finish_reason == "stop" and json.loads(text)
        steps = [s for s in finished_spans(eng) if s.name == stages.SPAN_ENGINE_STEP]
        waiting = [s.attributes[stages.ATTR_STEP_WAITING_GRAMMAR] for s in steps]
        assert waiting[0] == 1 and waiting[-1] == 0  # u's steps ran beside the deferred request
        assert all(s.attributes[stages.ATTR_STEP_WAITING] >= w for s, w in zip(steps, waiting))
        root = next(r for r in _roots(eng) if stages.ATTR_GRAMMAR_KEY in r.attributes)
        assert root.attributes[stages.ATTR_GRAMMAR_WAIT_S] >= 1.5
        assert _metric(eng, "num_requests_waiting_by_reason", reason="deferred") == 0
        assert _metric(eng, "grammar_compile_time_seconds_sum") >= 1.5
    finally:
        eng.shutdown()


def test_requests_for_a_schema_in_flight_join_one_compile():
    eng = build_engine(model="tiny", trace_memory=True, faults=parse_injections(["grammar_compile_ms=300"]))
    try:
        src = _src(_schema())
        streams = [_submit(eng, src, seed=i) for i in range(3)]
        for s in streams:
            assert _finish(s)[1].finish_reason == "stop"
        roots = _roots(eng)
        assert len(roots) == 3 and all(r.attributes[stages.ATTR_GRAMMAR_CACHE_HIT] is False for r in roots)
        assert all(r.attributes[stages.ATTR_GRAMMAR_WAIT_S] > 0.2 for r in roots)
        assert eng.grammars.num_compiles == 1 and _metric(eng, "grammar_compile_time_seconds_count") == 1
    finally:
        eng.shutdown()


@pytest.mark.parametrize("size,compiles", [(0, 3), (1, 3), (2, 2)])
def test_cache_size_sets_what_is_compiled_again(size, compiles):
    """Schemas A, B, A one after another: size 0 compiles every time, size 1 evicts A, size 2 keeps it."""
    eng = build_engine(model="tiny", trace_memory=True, grammar_cache_size=size)
    try:
        a, b = _src(_schema()), _src(_schema())
        for src in (a, b, a):
            assert _finish(_submit(eng, src, max_tokens=160))[1].finish_reason == "stop"
        hits = [r.attributes[stages.ATTR_GRAMMAR_CACHE_HIT] for r in sorted(_roots(eng), key=lambda s: s.start_time)]
        assert hits == [False, False, compiles == 2]
        assert eng.grammars.num_compiles == compiles
        assert _metric(eng, "grammar_cache_misses_total") == compiles
    finally:
        eng.shutdown()


def test_a_failed_compile_fails_that_request_only(engine, monkeypatch):
    import diag.bundled_engine.grammar as grammar

    monkeypatch.setattr(grammar, "MAX_DFA_STATES", 20)
    bad = _submit(engine, _src(_schema()))
    ok = _submit(engine, None, max_tokens=3, ignore_eos=True)
    text, last = _finish(bad)
    assert last.finish_reason == "error" and last.error_status == 400 and text == ""
    assert "cannot compile the grammar" in last.error and "\n" not in last.error
    assert _finish(ok)[1].finish_reason == "length"
    root = sorted(_roots(engine), key=lambda s: s.start_time)[-2]
    assert root.attributes[stages.ATTR_GRAMMAR_CACHE_HIT] is False and stages.ATTR_GRAMMAR_WAIT_S not in root.attributes
    assert not root.status.is_ok
    assert _metric(engine, "request_rejected_total", reason="grammar") >= 1
    assert engine.stats()["waiting_grammar"] == 0 and engine.stats()["requests"] == 0


def test_an_abort_while_waiting_for_the_grammar_frees_the_request():
    eng = build_engine(model="tiny", faults=parse_injections(["grammar_compile_ms=2000"]))
    try:
        s = SyncEventStream()
        res = eng.submit(s.push, SamplingParams(max_tokens=8), prompt="x", grammar=_src(_schema()))
        time.sleep(0.1)
        assert eng.stats()["waiting_grammar"] == 1
        eng.abort(res.request_id, "disconnect")
        last = s.get(5)
        assert last.finished and last.finish_reason == "abort"
        assert eng.stats()["waiting_grammar"] == 0 and eng.stats()["requests"] == 0
    finally:
        eng.shutdown()
