"""Next checks in the terms of the engine a capture came from (rules.base.engine_checks, fed by
the engines_seen feature and each engine's lines in diag.ground.external): a vLLM capture gets vLLM's
knobs, a client-only one every engine's."""

from __future__ import annotations

from pathlib import Path

from diag.analysis import analyze_paths
from diag.ground.external import next_checks, vllm
from rules.admission import HOL_CHECKS
from rules.base import RuleContext, engine_checks
from rules.features import Feature, Features

ROOT = Path(__file__).resolve().parents[2]


def _ctx(seen: dict[str, float] | None) -> RuleContext:
    f = Features()
    f.add(Feature("engines_seen", seen, "", seen is not None))
    return RuleContext(f, {}, {}, {}, False)


def test_the_engines_seen_pick_their_lines_and_the_common_ones_follow() -> None:
    hol = next_checks("head_of_line")
    assert engine_checks(_ctx({"vllm": 12.0}), hol, HOL_CHECKS) == [hol["vllm"], *HOL_CHECKS]
    assert engine_checks(_ctx({"ttft-engine": 3.0}), hol) == [hol["bundled"]]
    # client only, or an engine no line is written for: every engine's line
    assert engine_checks(_ctx(None), hol, HOL_CHECKS) == [*hol.values(), *HOL_CHECKS]
    assert engine_checks(_ctx({"tgi": 0.0}), hol) == list(hol.values())


def test_engines_seen_come_from_server_spans_and_the_detected_scrape() -> None:
    spans = analyze_paths([ROOT / "samples" / "external" / "vllm" / "capture"]).diagnosis.features.value("engines_seen")
    assert set(spans) == {"vllm"} and spans["vllm"] > 0
    client_only = analyze_paths([ROOT / "samples" / "queue" / "client"]).diagnosis.features
    assert not client_only.available("engines_seen")


def test_a_vllm_capture_gets_vllms_line_from_its_engine_module() -> None:
    """The vLLM capture behind a long prompt: head_of_line's next checks are vLLM's own line
    (diag/ground/external/vllm.py), then the common ones; no other engine's."""
    data = ROOT / "tests" / "rules" / "data" / "vllm-hol-half-lost"
    d = analyze_paths([str(data / "cli"), str(data / "srv")]).diagnosis
    f = next(f for f in [d.verdict, *d.findings] if f.rule_id == "head_of_line")
    assert f.next_checks == [vllm.NEXT_CHECKS["head_of_line"], *HOL_CHECKS]
    assert f.next_checks[0].startswith("vLLM: --max-num-partial-prefills")
