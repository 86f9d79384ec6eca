"""A verdict under the confidence bar says why and names the experiment that would decide."""

from __future__ import annotations

from diag.analysis.diagnose.certainty import CONFIDENT, JOIN, LONGER, SCRAPE, SLO, WORKLOAD, certainty_of
from diag.analysis.diagnose.followups import unfit
from rules import Diagnosis, Evidence, Finding
from rules.features import Feature, Features


def _finding(category: str, confidence: float, *, value: float = 4.0, threshold: float = 2.0, black_box: bool = False,
             conditional: bool = False, checks: list[str] | None = None, note: str | None = None) -> Finding:
    row = Evidence("TTFT at the top level / at 1", value, threshold, "x", "TTFT grows with load", op=">=", crossed=True)
    return Finding(category, category, f"{category} title", confidence, 0.1, 50.0, [row], checks or [f"check {category}"],
                   note=note, black_box=black_box, conditional=conditional)


def _diagnosis(*findings: Finding, requests: float = 200) -> Diagnosis:
    feats = Features({"requests_n": Feature("requests_n", requests, "requests", True)})
    return Diagnosis(findings[0], list(findings), [], feats)


def test_a_verdict_at_the_bar_is_confident_and_says_nothing_more() -> None:
    c = certainty_of(_diagnosis(_finding("queue", CONFIDENT)))
    assert c.confident and not c.why_not and not c.decide
    assert c.lines() == [f"verdict confident: queue ({CONFIDENT:.2f} >= {CONFIDENT:g})"]


def test_a_client_only_verdict_under_the_bar_names_the_server_side_experiments() -> None:
    v = _finding("network", 0.57, black_box=True,
                 note="client-only evidence: the split between network and the server's front end is not observed")
    c = certainty_of(_diagnosis(v))
    assert not c.confident
    assert any("client only" in w for w in c.why_not)
    assert c.decide[:2] == [JOIN, SCRAPE]
    # the engine's metrics are already in the capture: only the server's spans are left
    assert certainty_of(_diagnosis(v), scraped=True).decide == [JOIN]
    text = "\n".join(c.lines())
    assert text.startswith("verdict not confident: network (0.57 < 0.7) is the leading candidate")
    assert "to decide: join the server's own view" in text


def test_a_conditional_verdict_asks_for_the_users_workload() -> None:
    c = certainty_of(_diagnosis(_finding("prefix_cache", 0.4, conditional=True)))
    assert c.decide[0] == WORKLOAD


def test_a_narrow_crossing_few_requests_and_a_cut_short_design_are_each_named() -> None:
    v = _finding("prefill_compute", 0.5, value=2.2, threshold=2.0)
    c = certainty_of(_diagnosis(v, requests=8), stopped="the 120 s budget is spent")
    why = " | ".join(c.why_not)
    assert "crosses the thresholds narrowly" in why and "2.2" in why
    assert "only 8 requests completed" in why and "cut short" in why
    assert c.decide == [LONGER]
    # a strong crossing on plenty of requests: none of those reasons
    strong = certainty_of(_diagnosis(_finding("prefill_compute", 0.5, value=8.0)))
    assert not any("narrowly" in w or "requests completed" in w for w in strong.why_not)


def test_a_runner_up_nearly_as_likely_is_named_with_the_check_that_tells_them_apart() -> None:
    lead = _finding("queue", 0.6)
    near = _finding("kv_cache", 0.55, checks=["KV usage at the knee"])
    far = _finding("tokenize", 0.2)
    c = certainty_of(_diagnosis(lead, near, far))
    assert any(w.startswith("kv_cache is nearly as likely (0.55)") for w in c.why_not)
    assert "to tell it from kv_cache: KV usage at the knee" in c.decide
    assert not any("tokenize" in w for w in c.why_not)


def test_healthy_without_targets_asks_for_them() -> None:
    h = Finding("healthy", "healthy", "no bottleneck", 0.6, None, None, [], [])
    c = certainty_of(_diagnosis(h))
    assert not c.confident and SLO in c.decide


def test_inconclusive_is_never_confident_and_leads_with_its_own_experiment() -> None:
    v = Finding("inconclusive", "inconclusive", "cannot decide", 0.9, None, None, [],
                ["run `ttft probe URL --sweep concurrency`", "join the server's spans"])
    c = certainty_of(_diagnosis(v))
    assert not c.confident
    assert c.decide[0] == "run `ttft probe URL --sweep concurrency`"
    assert c.to_dict()["threshold"] == CONFIDENT


def test_a_follow_up_that_did_not_fit_the_budget_leaves_even_a_strong_verdict_unconfirmed() -> None:
    """The long ramp read a KV limit at 0.81, but the longout follow-up that tells it from a stage
    taking prompts one at a time (a tokenizer) did not fit: not confident, a longer budget decides."""
    stopped = ("TTFT broke at concurrency=8; " + unfit("longout", "a limit on what runs at once from a stage taking "
                                                       "prompts one at a time", 25.0, 14.0))
    c = certainty_of(_diagnosis(_finding("kv_cache", 0.81, value=8.0)), stopped=stopped)
    assert not c.confident and LONGER in c.decide
    assert any("cut short" in w and "longout follow-up" in w for w in c.why_not)
    assert c.lines()[0].startswith("verdict not confident: kv_cache (0.81, but the design did not run to its end) is")
    assert certainty_of(_diagnosis(_finding("kv_cache", 0.81, value=8.0)), stopped="TTFT broke at concurrency=8").confident
