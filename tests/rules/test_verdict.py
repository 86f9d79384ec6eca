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


#: the n012 queue near-miss of the bundled random matrix (seed 73514), spans joined: 4 streams on a
#: chunked engine, the slowest requests queued 48% of a 42 ms TTFT p95 (queue 0.81), yet every TTFT
#: was within 0.93x (median) and 1.35x (90th percentile) of its own work, p95 2.6x the median's
QUEUE_NEAR_MISS = {"ttft_over_floor_p50": 0.93, "ttft_over_floor_p90": 1.35, "ttft_floor_p50_s": 0.016,
                   "ttft_floor_n": 22.0, "ttft_p95_s": 0.0419}


@pytest.mark.parametrize("category", ["queue", "kv_cache", "frontend"])
def test_a_wait_the_own_work_floor_does_not_see_is_not_the_verdict(category: str) -> None:
    """Never name a bottleneck where nothing waits: a waiting cause above the verdict floor yields
    to healthy when TTFT is within the floor's factors of each request's own work, and stays the
    leading candidate, demoted, with the reason."""
    th = load_thresholds(None)
    wait = _finding(category, 0.81)
    verdict, leading = settle([wait], _feats(**QUEUE_NEAR_MISS), th, 1.0, itl_broken=False)
    assert verdict.category == "healthy" and leading is wait
    assert wait.confidence < th["general"]["verdict_floor"] and "own-work floor" in wait.note


def test_a_wait_stays_the_verdict_when_the_tail_or_the_floor_shows_it() -> None:
    th = load_thresholds(None)
    tail = _feats(**{**QUEUE_NEAR_MISS, "ttft_p95_s": 1.64})  # the slowest 5% waited 100x their own work
    assert settle([_finding("queue", 0.81)], tail, th, 1.0, itl_broken=False)[0].category == "queue"
    past = _feats(**{**QUEUE_NEAR_MISS, "ttft_over_floor_p90": 4.2})
    assert settle([_finding("queue", 0.81)], past, th, 1.0, itl_broken=False)[0].category == "queue"
    # prompt work is own work, not a wait: the floor never demotes it
    assert settle([_finding("prefill_compute", 0.81)], _feats(**QUEUE_NEAR_MISS), th, 1.0,
                  itl_broken=False)[0].category == "prefill_compute"
    # an SLO broken is never healthy
    assert settle([_finding("queue", 0.81)], _feats(**QUEUE_NEAR_MISS), th, 1.0, itl_broken=False,
                  slo_broken=True)[0].category == "queue"


def test_a_near_tie_ranks_the_stage_most_requests_spend_their_ttft_in() -> None:
    """The r012 tokenize draw (seed 90417) on a busy machine: a few streams' first tokens sat in the
    network (29% of the slowest 5%, 7% of all TTFT) while every request spent 54% of its TTFT in the
    tokenizer (23% of the slowest 5%). Both rules carry their stage's share of every request's TTFT,
    so the near tie goes to the tokenizer, not to the tail's network gaps."""
    from rules.base import REGISTRY
    from rules.verdict import near_tie
    from support.rulectx import rule_context

    feats = _feats(tokenize_share_tail=0.23, network_share_tail=0.29, client_server_gap_p50_s=0.0074,
                   client_server_ttft_ratio=1.04, itl_p50_s=0.0025, ttft_p95_s=1.06, requests_n=25.0)
    feats.add(Feature("stage_shares_all", {"tokenize": 0.54, "prefill": 0.3, "network": 0.07}, "share", True))

    def run(rid: str) -> Finding:
        out = REGISTRY[rid].evaluate(rule_context(rid, feats, client_only=False))
        assert isinstance(out, Finding), out
        out.category, out.rule_id, out.weight = rid, rid, 0.25
        return out

    tok, net = run("tokenize"), run("network")
    assert (tok.population_share, net.population_share) == (0.54, 0.07)
    assert net.explained_pct > tok.explained_pct  # the tail alone would rank the network first
    findings = [net, tok]
    near_tie(findings, 0.2, itl_broken=False)
    assert [f.category for f in findings] == ["tokenize", "network"]
    assert "larger share of all requests' TTFT" in tok.note


def test_the_deciding_experiment_is_named_once() -> None:
    """A black-box queue lead whose own first check is the concurrency sweep: the sweep is listed once."""
    from rules.verdict import deciding_experiment

    sweep = "confirm with a concurrency sweep: `ttft probe URL --sweep concurrency`"
    lead = Finding("queue", "queue", "queue finding", 0.32, 0.4, 100.0, [], [sweep, "admission limits"],
                   black_box=True)
    checks = deciding_experiment(lead, _feats(requests_n=32.0), 20)
    assert sum("--sweep concurrency" in c for c in checks) == 1 and sweep in checks
    other = Finding("queue", "queue", "queue finding", 0.32, 0.4, 100.0, [], ["admission limits"], black_box=True)
    assert sum("--sweep concurrency" in c for c in deciding_experiment(other, _feats(requests_n=32.0), 20)) == 1
