"""Workload specs, synthetic prompts and the JSONL prompts file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.probe.client import StreamingClient
from collectors.probe.endpoint import Endpoint
from collectors.probe.workload import LengthSpec, TokenCounter, Workload, WorkloadError, WorkloadSpec, load_prompts_file

TOKENIZER = Path(__file__).resolve().parents[3] / "diag" / "bundled_engine" / "data" / "tokenizer.json"


def test_length_spec_parse():
    assert LengthSpec.parse("128") == LengthSpec("fixed", 128)
    assert LengthSpec.parse("fixed:64") == LengthSpec("fixed", 64)
    assert LengthSpec.parse("uniform:10-20") == LengthSpec("uniform", 10, 20)
    assert LengthSpec.parse("normal:100,10") == LengthSpec("normal", 100, 10)
    assert str(LengthSpec.parse("uniform:10-20")) == "uniform:10-20"
    # the lengths each kind draws: a normal's tails cut at 2 std, never below one token
    assert [LengthSpec.parse(s).bounds for s in ("64", "uniform:10-20", "normal:100,10", "normal:5,4")] == \
        [(64, 64), (10, 20), (80, 120), (1.0, 13)]
    for bad in ("", "0", "uniform:5-2", "normal:1", "gauss:3,4", "fixed:-1", "abc"):
        with pytest.raises(WorkloadError, match="spec"):
            LengthSpec.parse(bad)


@settings(max_examples=50, deadline=None)
@given(lo=st.integers(1, 500), span=st.integers(0, 500), seed=st.integers(0, 1000))
def test_uniform_samples_stay_in_range(lo, span, seed):
    spec = LengthSpec("uniform", lo, lo + span)
    rng = random.Random(seed)
    assert all(lo <= spec.sample(rng) <= lo + span for _ in range(20))


def test_normal_samples_positive():
    rng = random.Random(0)
    vals = [LengthSpec.parse("normal:5,20").sample(rng) for _ in range(500)]
    assert min(vals) >= 1


def test_prompts_start_differently_and_estimate_length():
    w = Workload(WorkloadSpec(LengthSpec.parse("200"), LengthSpec.parse("8")))
    items = [w.next_item() for _ in range(50)]
    heads = {i.prompt.split()[0] for i in items}
    assert len(heads) == 50  # no shared first token: prefix caches cannot hide prefill
    assert all(190 <= len(i.prompt.split()) <= 210 for i in items)  # 1 word ~ 1 token estimate
    assert all(i.max_tokens == 8 and i.input_tokens_est == 200 for i in items)
    assert "estimate" in w.length_method


def test_tokenizer_builds_exact_lengths_and_shared_prefix():
    tok = TokenCounter(TOKENIZER)
    w = Workload(WorkloadSpec(LengthSpec.parse("uniform:100-300"), shared_prefix_tokens=40), tok)
    items = [w.next_item() for _ in range(10)]
    for i in items:
        assert abs(tok.count(i.prompt) - i.input_tokens_target) <= 3
    prefixes = {tok.decode(tok.ids(i.prompt)[:35]) for i in items}
    assert len(prefixes) == 1  # the deliberate shared prefix
    assert len({tok.decode(tok.ids(i.prompt)[:50]) for i in items}) == 10  # then they differ
    assert "tokenizer" in w.length_method
    sweep = w.with_input(LengthSpec.parse("1024")).next_item()
    assert abs(tok.count(sweep.prompt) - 1024) <= 3


def test_bad_tokenizer_path(tmp_path):
    with pytest.raises(WorkloadError, match="no such tokenizer"):
        TokenCounter(tmp_path / "nope.json")
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    with pytest.raises(WorkloadError, match="not a tokenizers"):
        TokenCounter(bad)


def test_prompts_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello there"}\n\n{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}\n')
    items = load_prompts_file(str(f))
    assert items[0].prompt == "hello there" and items[1].max_tokens == 7
    w = Workload(WorkloadSpec(output_tokens=LengthSpec.parse("5"), prompts_file=str(f)))
    got = [w.next_item() for _ in range(4)]
    assert [g.max_tokens for g in got] == [5, 7, 5, 7]
    assert got[1].messages_for_chat() == [{"role": "user", "content": "hi"}]
    assert got[0].messages_for_chat() == [{"role": "user", "content": "hello there"}]
    assert got[1].text_for_completions() == "hi"


@pytest.mark.parametrize(
    "text,msg",
    [
        ("not json\n", r"p.jsonl:1: not valid JSON"),
        ('{"prompt": "a"}\n[1]\n', r"p.jsonl:2: expected a JSON object"),
        ('{"x": 1}\n', r":1: needs a 'prompt'"),
        ('{"prompt": 3}\n', r"'prompt' must be a string"),
        ('{"messages": "hi"}\n', r"'messages' must be a list"),
        ('{"prompt": "a", "max_tokens": 0}\n', r"'max_tokens' must be a positive integer"),
        ("\n", r"no prompts in file"),
    ],
)
def test_prompts_file_errors_name_file_and_line(tmp_path, text, msg):
    f = tmp_path / "p.jsonl"
    f.write_text(text)
    with pytest.raises(WorkloadError, match=msg):
        load_prompts_file(str(f))
    with pytest.raises(WorkloadError, match="no such prompts file"):
        load_prompts_file(str(tmp_path / "missing.jsonl"))


def test_request_bodies():
    w = Workload(WorkloadSpec(LengthSpec.parse("10"), LengthSpec.parse("3")))
    item = w.next_item()
    chat = StreamingClient(Endpoint("http://x", "chat", "m"), 1).build_body(item)
    assert chat["messages"][0]["role"] == "user" and chat["stream"] is True
    assert chat["max_tokens"] == chat["min_tokens"] == 3 and chat["ignore_eos"] is True
    assert chat["stream_options"] == {"include_usage": True} and chat["model"] == "m"
    comp = StreamingClient(Endpoint("http://x", "completions", None), 1, exact_output=False,
                           extra_body={"temperature": 0}).build_body(item)
    assert comp["prompt"] == item.prompt and "min_tokens" not in comp and comp["temperature"] == 0


def test_lengths_calibrated_from_server_usage(server):
    from collectors.probe import LoadSpec, ProbeConfig, run_probe

    res = run_probe(ProbeConfig(server.url("words2x"), api="completions", load=LoadSpec(requests=2),
                                workload=WorkloadSpec(LengthSpec.parse("400"), LengthSpec.parse("2"))))
    assert any("2.00 tokens/word" in n for n in res.notes)
    for r in res.results:
        assert abs(r.usage_input_tokens - 400) <= 8  # 200 words, not 400


def test_a_context_too_short_for_the_long_calibration_prompt_is_calibrated_below_it(server):
    """A 512-token context refuses the 300-word calibration prompt (600 tokens): 30 and 100 words
    calibrate instead, so the first measured prompts already have the lengths asked for."""
    from collectors.probe import LoadSpec, ProbeConfig, run_probe

    res = run_probe(ProbeConfig(server.url("words2x-512"), api="completions", load=LoadSpec(requests=2),
                                workload=WorkloadSpec(LengthSpec.parse("22"), LengthSpec.parse("2"))))
    assert any("2.00 tokens/word" in n for n in res.notes), res.notes
    got = [r.usage_input_tokens for r in res.results]
    assert all(abs(x - 22) <= 6 for x in got), got  # 1 word ~ 1 token would send 44
