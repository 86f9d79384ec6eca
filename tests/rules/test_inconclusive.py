"""rules.inconclusive: when TTFT is "far above" what the capture says it should be."""

from __future__ import annotations

from rules import evidence
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


def test_the_line_proxy_counts_only_past_a_lone_requests_start() -> None:
    """The v006 draw (designed healthy): 5.4 decode steps is how long a lone short prompt takes on vLLM
    (its front end and detokenizer), so 0.30x the service time ahead says nothing; the same ratio at 12
    steps says far above."""
    th = load_thresholds(None)
    assert inconclusive(_feats(), [], th, [], True, no_floor=True) is None
    out = inconclusive(_feats(ttft_in_itl_steps_p50=12.0), [], th, [], True, no_floor=True)
    assert out is not None and out.category == "inconclusive"
    assert next(e for e in out.evidence if e.key == evidence.INLINE_RATIO).crossed


def test_the_engines_prefill_time_close_to_ttft_overrules_the_line_proxy() -> None:
    """With /metrics the engine says TTFT is 1.7x its own prefill time: nothing waits in a line."""
    assert inconclusive(_feats(ttft_vs_engine_prefill_ratio=1.7), [], load_thresholds(None), [], False,
                        no_floor=True) is None
    far = inconclusive(_feats(ttft_vs_engine_prefill_ratio=9.0), [], load_thresholds(None), [], False, no_floor=True)
    assert far is not None


#: real vLLM 0.32.0 with a KV pool of 6 usable blocks (768 tokens), 4 closed-loop streams of
#: 99-token prompts and 245-token answers, client only: the median started in 5.6 decode steps,
#: the slowest 5% waited 96 on prompts like the others' (the v008 draw of seed 37910)
KV_TAIL = {"ttft_p50_s": 0.0296, "ttft_in_itl_steps_p50": 5.57, "ttft_inline_ratio": 0.0,
           "inflight_at_arrival_max": 4.0, "ttft_in_itl_steps_p95": 96.0, "ttft_tail_prompt_x": 0.93}


def test_a_tail_that_waited_on_prompts_like_the_others_is_far_above_with_no_floor() -> None:
    th = load_thresholds(None)
    out = inconclusive(_feats(**KV_TAIL), [], th, [], True, no_floor=True)
    assert out is not None and out.category == "inconclusive"
    row = next(e for e in out.evidence if e.key == evidence.TTFT_TAIL_STEPS)
    assert row.crossed and "17.2x the median's" in row.meaning
    # the slowest sent prompts 3x the others': their own prefill, not a wait
    assert inconclusive(_feats(**{**KV_TAIL, "ttft_tail_prompt_x": 3.0}), [], th, [], True, no_floor=True) is None
    # a tail 2x the median's is spread, not a wait
    assert inconclusive(_feats(**{**KV_TAIL, "ttft_in_itl_steps_p95": 11.0}), [], th, [], True, no_floor=True) is None
