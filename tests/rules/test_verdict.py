"""rules.verdict.settle: which finding is the verdict, and what stands in when none reaches the floor."""

from __future__ import annotations

import pytest

from rules.config import load_thresholds
from rules.features import Feature, Features
from rules.model import INCONCLUSIVE, Finding
from rules.verdict import settle

#: the v016 draw of the real-vLLM matrix (seed 37910), ttft diagnose on vLLM's defaults: its own
#: shared-prefix follow-up saved 49% of the prefix (vLLM caches whole 128-token blocks only), while
#: every request's TTFT was within 1.02x (median) and 2.25x (90th percentile) of its own work
NOTHING_WAITS = {"ttft_over_floor_p50": 1.02, "ttft_over_floor_p90": 2.25, "ttft_floor_p50_s": 0.0137,
                 "ttft_floor_n": 31.0, "ttft_p95_s": 0.0514, "ttft_in_itl_steps_p50": 7.8}


def _feats(**values: float) -> Features:
    feats = Features()
    for name, value in values.items():
        feats.add(Feature(name, value, "", True, source="client"))
    return feats


def _finding(category: str, confidence: float, conditional: bool = False) -> Finding:
    return Finding(category, category, f"{category} finding", confidence, 0.02, 50.0, [], ["check"],
                   conditional=conditional)


@pytest.mark.parametrize("conditional", [True, False])
def test_a_conditional_candidate_under_the_floor_leaves_healthy_when_nothing_waits(conditional: bool) -> None:
    """A finding that holds only if the users' prompts are like the tool's own test is not a wait:
    under the floor, the own-work floor still says healthy, and names it. The same finding measured
    on the users' load (not conditional) leaves the verdict undecided, as any cause under the floor."""
    th = load_thresholds(None)
    lead = _finding("prefix_cache", 0.32, conditional=conditional)
    findings = [lead]
    verdict, leading = settle(findings, _feats(**NOTHING_WAITS), th, 1.0, itl_broken=False)
    assert leading is lead and findings[0] is verdict
    if conditional:
        assert verdict.category == "healthy" and "holds only for prompts like the tool's own test" in verdict.note
    else:
        assert verdict.category == INCONCLUSIVE
    # past the own-work factors something waits: undecided either way
    waits = _feats(**{**NOTHING_WAITS, "ttft_over_floor_p90": 3.97})
    assert settle([_finding("prefix_cache", 0.32, conditional)], waits, th, 1.0, False)[0].category == INCONCLUSIVE
