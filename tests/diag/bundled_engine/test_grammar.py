"""Structured-output grammars: response_format checks, the schema's automaton (valid JSON in,
invalid out, against jsonschema), the per-state token masks and the matcher."""

from __future__ import annotations

import hashlib
import json
import random

import jsonschema
import numpy as np
import pytest

from diag.bundled_engine.grammar import GrammarMatcher, TokenVocab, compile_grammar
from diag.bundled_engine.grammar_schema import JSON_OBJECT_KEY, GrammarError, grammar_source, schema_key
from diag.bundled_engine.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["ann", "bob", "Zoë"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "score": {"type": "number", "minimum": -5, "maximum": 5},
        "code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"},
        "ok": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 12, "description": "free text"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
        "pos": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "exclusiveMinimum": -3}},
                "required": ["x"], "additionalProperties": False},
        "nothing": {"type": "null"},
    },
    "required": ["name", "age", "code"],
    "additionalProperties": False,
}


def _rf(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


@pytest.fixture(scope="module")
def vocab() -> TokenVocab:
    tok = Tokenizer.bundled()
    return TokenVocab.build(tok.token_bytes(), 2048, tok.eos_token_ids)


@pytest.fixture(scope="module")
def compiled(vocab):
    return compile_grammar(grammar_source(_rf(SCHEMA)), vocab)


def _instance(rnd: random.Random) -> dict:
    """A random instance of SCHEMA, properties in schema order."""
    text = "".join(rnd.choice(['a', 'Z', ' ', '"', '\\', '\n', 'é', '€', '😀', '/']) for _ in range(rnd.randint(0, 12)))
    values = {
        "name": rnd.choice(["ann", "bob", "Zoë"]), "age": rnd.randint(0, 120),
        "score": rnd.choice([rnd.randint(-5, 5), round(rnd.uniform(-4.99, 3.99), rnd.randint(1, 3))]),
        "code": "".join(rnd.choice("ABCXYZ") for _ in range(2)) + "-" + str(rnd.randint(100, 999)),
        "ok": rnd.random() < 0.5, "note": text, "tags": [rnd.choice("ab") for _ in range(rnd.randint(1, 3))],
        "pos": {"x": rnd.randint(-10**6, 10**6), **({"y": rnd.randint(-2, 50)} if rnd.random() < 0.5 else {})},
        "nothing": None,
    }
    return {k: v for k, v in values.items() if k in SCHEMA["required"] or rnd.random() < 0.6}


def _dump(obj, rnd: random.Random) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=rnd.choice([(", ", ": "), (",", ":")]))


def test_valid_instances_are_accepted(compiled):
    rnd = random.Random(7)
    for _ in range(300):
        obj = _instance(rnd)
        jsonschema.validate(obj, SCHEMA)
        text = _dump(obj, rnd)
        assert compiled.accepts(text), text


@pytest.mark.parametrize("change", [
    lambda o: o.pop("code"),
    lambda o: o.update(name="carl"),
    lambda o: o.update(age=121),
    lambda o: o.update(age=-1),
    lambda o: o.update(age=1.5),
    lambda o: o.update(score=5.5),
    lambda o: o.update(score=-6),
    lambda o: o.update(code="AB-12"),
    lambda o: o.update(code="ab-123"),
    lambda o: o.update(tags=[]),
    lambda o: o.update(tags=["a", "b", "a", "b"]),
    lambda o: o.update(tags=["c"]),
    lambda o: o.update(pos={"x": 1, "y": -3}),
    lambda o: o.update(pos={"y": 4}),
    lambda o: o.update(note="x" * 13),
    lambda o: o.update(ok="true"),
    lambda o: o.update(zzz=1),
])
def test_invalid_instances_are_rejected(compiled, change):
    rnd = random.Random(3)
    for _ in range(20):
        obj = _instance(rnd)
        change(obj)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(obj, SCHEMA)
        assert not compiled.accepts(_dump(obj, rnd))


def test_json_syntax_errors_are_rejected(compiled):
    good = '{"name": "ann", "age": 3, "code": "AB-123"}'
    assert compiled.accepts(good)
    for bad in (good[:-1], good + " ", good.replace("3,", "3,,"), good.replace('"age"', "age"),
                good.replace("3", "03"), good.replace(", ", ",  "), '{"age": 3, "name": "ann", "code": "AB-123"}'):
        assert not compiled.accepts(bad), bad


def test_masks_are_the_tokens_that_keep_the_walk_alive(compiled, vocab):
    dfa = compiled.dfa
    rng = np.random.default_rng(0)
    states = sorted(set(rng.integers(0, dfa.num_states, 40).tolist()) | {0})
    for s in states:
        want = np.zeros(vocab.size, dtype=bool)
        for tid, data in enumerate(vocab.token_bytes):
            if data and tid not in vocab.eos_ids:
                want[tid] = dfa.walk(s, data) != dfa.dead
        want[sorted(vocab.eos_ids)] = bool(dfa.accepting[s])
        assert (compiled.allowed(s) == want).all(), s
    assert not compiled.allowed(dfa.dead).any()
    special = [i for i, b in enumerate(vocab.token_bytes) if b is None and i not in vocab.eos_ids]
    assert special and not any(compiled.allowed(s)[special].any() for s in states)  # <|im_start|>, <|pad|>


def test_matcher_follows_a_tokenized_answer_to_completion(compiled):
    tok = Tokenizer.bundled()
    text = '{"name": "Zoë", "age": 120, "code": "XY-999", "tags": ["b"], "nothing": null}'
    m = GrammarMatcher(compiled)
    for tid in tok.encode(text):
        assert m.allowed()[tid], (tid, tok.decode([tid]))
        assert not m.complete
        m.advance(tid)
    assert m.complete
    allowed = m.allowed()
    assert set(np.nonzero(allowed)[0].tolist()) == set(compiled.vocab.eos_ids)  # nothing but EOS after the root closes


def test_json_object_is_any_bounded_object(vocab):
    src = grammar_source({"type": "json_object"})
    assert src.key == JSON_OBJECT_KEY and src.kind == "json_object"
    g = compile_grammar(src, vocab)
    for ok in ('{}', '{"a": 1}', '{"a": [1, {"b": null}], "c": "x\\u00e9", "d": -1.5e3}', '{"k":{"k":{"k":true}}}'):
        assert g.accepts(ok), ok
    for bad in ('[]', '1', '{"a"}', '{a: 1}', '{"k":{"k":{"k":{"k":1}}}}', '{"a": tru}'):
        assert not g.accepts(bad), bad


def test_keys_are_short_stable_and_the_probes():
    a = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "boolean", "enum": [True, False]}}}
    reordered = {"properties": {"y": {"enum": [True, False], "type": "boolean"}, "x": {"type": "integer"}}, "type": "object"}
    other = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "boolean", "enum": [False, True]}}}
    assert schema_key(a) == schema_key(reordered) == grammar_source(_rf(a)).key  # the same JSON value
    assert schema_key(a) != schema_key(other)  # list order is kept
    canon = json.dumps(a, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert schema_key(a) == hashlib.sha256(canon.encode("utf-8")).hexdigest()[:16]  # what the probe records
    assert grammar_source(None) is None and grammar_source({"type": "text"}) is None


@pytest.mark.parametrize("rf,msg", [
    ("json", "'response_format' must be an object"),
    ({"type": "yaml"}, "'response_format.type' must be"),
    ({"type": "json_schema"}, "'response_format.json_schema' must be an object"),
    ({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}, "name' must be a string"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "must be a JSON schema object"),
    (_rf({"type": "object", "properties": {"a": {"$ref": "#/x"}}}), "schema.properties.a.type must be one of"),
    (_rf({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}), "unsupported keyword 'format'"),
    (_rf({"anyOf": [{"type": "string"}]}), "type must be one of"),
    (_rf({"type": ["string", "null"]}), "type lists are not supported"),
    (_rf({"type": "string", "pattern": "(a|b)"}), "schema.pattern: groups and alternation"),
    (_rf({"type": "string", "pattern": "a", "maxLength": 3}), "pattern with minLength/maxLength"),
    (_rf({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}), "required names a property"),
    (_rf({"type": "integer", "minimum": 5, "maximum": 4}), "no whole number"),
    (_rf({"type": "array", "items": {"type": "integer"}, "maxItems": 1000}), "maxItems must be an integer in"),
    (_rf({"type": "string", "enum": []}), "enum must be a list"),
    (_rf({"type": "object", "properties": {"multi\nline name": {"type": "set"}}}), "multi line name"),
])
def test_malformed_or_unsupported_formats_fail_with_one_line(rf, msg):
    with pytest.raises(GrammarError) as err:
        grammar_source(rf)
    assert msg in str(err.value) and "\n" not in str(err.value)


def test_a_grammar_past_the_state_limit_fails_to_compile(vocab, monkeypatch):
    import diag.bundled_engine.grammar as grammar

    monkeypatch.setattr(grammar, "MAX_DFA_STATES", 50)
    with pytest.raises(GrammarError, match="cannot compile the grammar: .*more than 50 automaton states"):
        compile_grammar(grammar_source(_rf(SCHEMA)), vocab)


def test_compile_work_grows_with_the_schema(vocab):
    def schema(n):
        return {"type": "object", "properties": {f"f{i}": {"type": "string", "pattern": "[a-z]{2,6}"} for i in range(n)}}
    small, large = (compile_grammar(grammar_source(_rf(schema(n))), vocab) for n in (4, 16))
    assert large.num_states > 3 * small.num_states
    assert small.compile_s > 0 and large.compile_s > 0 and large.ready_ns > small.ready_ns
