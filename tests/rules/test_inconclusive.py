"""rules.inconclusive: when TTFT is "far above" what the capture says it should be."""

from __future__ import annotations

from rules.config import load_thresholds
from rules.features import Feature, Features
from rules.inconclusive import inconclusive

#: real vLLM 0.32.0, 2 closed-loop streams of 140-token prompts and 18-token answers: TTFT 22 ms,
#: 5.4 decode steps, 0.30x the service time of the one request ahead; no request arrived alone
SEEN = {"ttft_p50_s": 0.0223, "ttft_in_itl_steps_p50": 5.41, "ttft_inline_ratio": 0.30, "inflight_at_arrival_max": 2.0}


def _feats(**extra: float) -> Features:
    feats = Features()
    for name, value in {**SEEN, **extra}.items():
        feats.add(Feature(name, value, "", True, source="client"))
    return feats


def test_the_line_proxy_alone_says_far_above_with_no_floor() -> None:
    out = inconclusive(_feats(), [], load_thresholds(None), [], True, no_floor=True)
    assert out is not None and out.category == "inconclusive"
    assert next(e for e in out.evidence if e.name.startswith("TTFT / (requests ahead")).crossed


def test_the_engines_prefill_time_close_to_ttft_overrules_the_line_proxy() -> None:
    """With /metrics the engine says TTFT is 1.7x its own prefill time: nothing waits in a line."""
    assert inconclusive(_feats(ttft_vs_engine_prefill_ratio=1.7), [], load_thresholds(None), [], False,
                        no_floor=True) is None
    far = inconclusive(_feats(ttft_vs_engine_prefill_ratio=9.0), [], load_thresholds(None), [], False, no_floor=True)
    assert far is not None
