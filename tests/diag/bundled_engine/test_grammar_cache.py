"""The grammar cache: hits, joins of a compile in flight, LRU eviction, no cache at size 0,
failed compiles, metrics."""

from __future__ import annotations

import pytest

from diag.bundled_engine.grammar import TokenVocab
from diag.bundled_engine.grammar_schema import GrammarError, grammar_source
from diag.bundled_engine.grammar_cache import GrammarCache
from diag.bundled_engine.metrics import EngineMetrics
from diag.bundled_engine.outputs import EngineStoppedError
from diag.bundled_engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def vocab() -> TokenVocab:
    tok = Tokenizer.bundled()
    return TokenVocab.build(tok.token_bytes(), 2048, tok.eos_token_ids)


def _src(n: int):
    props = {f"p{i}": {"type": "integer", "minimum": 0, "maximum": 9} for i in range(n)}
    return grammar_source({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": props}}})


def _cache(vocab, capacity=4, delay_s=0.0):
    m = EngineMetrics("t")
    return GrammarCache(capacity, 1, lambda: vocab, m, extra_delay_s=delay_s), m


def _value(m: EngineMetrics, name: str) -> float:
    return m.registry.get_sample_value("ttft_engine:" + name, {"model_name": "t"}) or 0.0


def test_a_miss_compiles_then_the_same_key_hits(vocab):
    c, m = _cache(vocab)
    first = c.get(_src(2))
    assert not first.cache_hit and first.future.result(10).key == first.key
    again = c.get(_src(2))
    assert again.cache_hit and again.future.done() and again.future.result() is first.future.result()
    assert c.num_compiles == 1 and c.keys() == [first.key]
    assert _value(m, "grammar_cache_hits_total") == 1 and _value(m, "grammar_cache_misses_total") == 1
    assert _value(m, "grammar_compile_time_seconds_count") == 1
    c.shutdown()


def test_a_request_for_a_key_in_flight_joins_its_compile(vocab):
    c, m = _cache(vocab, delay_s=0.3)
    a, b = c.get(_src(3)), c.get(_src(3))
    assert not a.future.done() and b.future is a.future and not b.cache_hit
    a.future.result(10)
    assert c.num_compiles == 1 and _value(m, "grammar_cache_misses_total") == 2
    assert _value(m, "grammar_compile_time_seconds_sum") >= 0.3  # the fault's delay is part of the compile
    c.shutdown()


def test_lru_eviction_at_size_one(vocab):
    c, _ = _cache(vocab, capacity=1)
    a = c.get(_src(1))
    a.future.result(10)
    c.get(_src(2)).future.result(10)  # evicts a
    assert c.keys() == [_src(2).key]
    again = c.get(_src(1))
    assert not again.cache_hit and again.future.result(10) is not a.future.result()
    assert c.num_compiles == 3 and c.keys() == [_src(1).key]
    c.shutdown()


def test_size_zero_keeps_nothing_and_joins_nothing(vocab):
    c, m = _cache(vocab, capacity=0, delay_s=0.2)
    a, b = c.get(_src(2)), c.get(_src(2))
    assert b.future is not a.future
    a.future.result(10), b.future.result(10)
    assert not c.get(_src(2)).cache_hit and c.keys() == []
    assert c.num_compiles == 3 and _value(m, "grammar_cache_hits_total") == 0
    c.shutdown()


def test_a_failed_compile_fails_everyone_who_shared_it_and_is_not_kept(vocab, monkeypatch):
    import diag.bundled_engine.grammar as grammar

    monkeypatch.setattr(grammar, "MAX_DFA_STATES", 10)
    c, _ = _cache(vocab, delay_s=0.2)
    a, b = c.get(_src(4)), c.get(_src(4))
    for t in (a, b):
        with pytest.raises(GrammarError, match="more than 10 automaton states"):
            t.future.result(10)
    assert c.keys() == []
    monkeypatch.setattr(grammar, "MAX_DFA_STATES", 40_000)
    assert c.get(_src(4)).future.result(10).num_states > 10  # tried again, not remembered as failed
    c.shutdown()


def test_after_shutdown_a_miss_is_refused(vocab):
    c, _ = _cache(vocab)
    c.get(_src(1)).future.result(10)
    c.shutdown()
    assert c.get(_src(1)).cache_hit  # what is cached still serves
    with pytest.raises(EngineStoppedError):
        c.get(_src(5))


def test_shutdown_ends_a_compile_in_its_injected_delay(vocab):
    import time

    c, _ = _cache(vocab, delay_s=60)
    t = c.get(_src(6))
    time.sleep(0.05)
    t0 = time.monotonic()
    c.shutdown()
    with pytest.raises(EngineStoppedError):
        t.future.result(5)
    assert time.monotonic() - t0 < 2
