"""Samplers and stop rules."""

from __future__ import annotations

import pytest
import torch

from diag.bundled_engine.sampler import SamplerState, SamplingParams, filter_logits, sample, stop_reason


def _st(**kw) -> SamplerState:
    return SamplerState(SamplingParams(**kw), default_seed=0)


def test_greedy_is_argmax():
    logits = torch.randn(5, 100)
    assert sample(logits, [_st(temperature=0.0)] * 5) == logits.argmax(-1).tolist()


def test_top_k_1_and_tiny_top_p_are_greedy():
    logits = torch.randn(4, 50)
    want = logits.argmax(-1).tolist()
    assert sample(logits, [_st(temperature=1.0, top_k=1) for _ in range(4)]) == want
    assert sample(logits, [_st(temperature=1.0, top_p=1e-6) for _ in range(4)]) == want


def test_seed_reproduces_and_differs():
    logits = torch.zeros(1, 1000)
    a = [sample(logits, [s])[0] for s in [_st(seed=7)] for _ in range(20)]
    s2 = _st(seed=7)
    b = [sample(logits, [s2])[0] for _ in range(20)]
    s3 = _st(seed=8)
    c = [sample(logits, [s3])[0] for _ in range(20)]
    assert a == b and a != c


def test_top_k_and_top_p_restrict_support():
    logits = torch.tensor([5.0, 4.0, 3.0, -1.0, -2.0, -3.0])
    st = _st(top_k=3, seed=1)
    assert {sample(logits[None], [st])[0] for _ in range(200)} <= {0, 1, 2}
    probs = logits.softmax(-1)  # ~[.66, .24, .09, ...]: top_p .8 keeps exactly the first two
    assert probs[0] < 0.8 < probs[0] + probs[1]
    st = _st(top_p=0.8, seed=2)
    seen = {sample(logits[None], [st])[0] for _ in range(300)}
    assert seen == {0, 1}
    f = filter_logits(logits, 1.0, 0, 0.8)
    assert torch.isinf(f[2:]).all() and torch.isfinite(f[:2]).all()


def test_temperature_flattens():
    logits = torch.tensor([2.0, 0.0])
    hot, cold = _st(temperature=2.0, seed=3), _st(temperature=0.5, seed=3)
    n = 2000
    hot_share = sum(sample(logits[None], [hot])[0] == 1 for _ in range(n)) / n
    cold_share = sum(sample(logits[None], [cold])[0] == 1 for _ in range(n)) / n
    assert hot_share == pytest.approx(1 / (1 + 2.718281828**1.0), abs=0.04)  # softmax([1, 0])
    assert cold_share == pytest.approx(1 / (1 + 2.718281828**4.0), abs=0.02)  # softmax([4, 0])


def test_stop_reason():
    p = SamplingParams(max_tokens=3)
    eos = frozenset({0})
    assert stop_reason(0, 1, 10, p, eos, 100) == "stop"
    assert stop_reason(5, 3, 10, p, eos, 100) == "length"
    assert stop_reason(5, 1, 100, p, eos, 100) == "length"
    assert stop_reason(5, 1, 10, p, eos, 100) is None
    assert stop_reason(0, 1, 10, SamplingParams(max_tokens=3, ignore_eos=True), eos, 100) is None


@pytest.mark.parametrize(
    "kw,msg",
    [({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 1 << 30}, "max_tokens"), ({"top_p": 0.0}, "top_p"),
     ({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k")],
)
def test_params_validate(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw).validate()
