"""Next checks in the terms of the engine a capture came from (rules.base.engine_checks, fed by
the engines_seen feature): a vLLM capture gets vLLM's knobs, a client-only one every engine's."""

from __future__ import annotations

from pathlib import Path

from diag.analysis import analyze_paths
from rules.admission import HOL_BY_ENGINE, HOL_CHECKS
from rules.base import RuleContext, engine_checks
from rules.features import Feature, Features

ROOT = Path(__file__).resolve().parents[2]


def _ctx(seen: dict[str, float] | None) -> RuleContext:
    f = Features()
    f.add(Feature("engines_seen", seen, "", seen is not None))
    return RuleContext(f, {}, {}, {}, False)


def test_the_engines_seen_pick_their_lines_and_the_common_ones_follow() -> None:
    assert engine_checks(_ctx({"vllm": 12.0}), HOL_BY_ENGINE, HOL_CHECKS) == [HOL_BY_ENGINE["vllm"], *HOL_CHECKS]
    assert engine_checks(_ctx({"ttft-engine": 3.0}), HOL_BY_ENGINE) == [HOL_BY_ENGINE["bundled"]]
    # client only, or an engine no line is written for: every engine's line
    assert engine_checks(_ctx(None), HOL_BY_ENGINE, HOL_CHECKS) == [*HOL_BY_ENGINE.values(), *HOL_CHECKS]
    assert engine_checks(_ctx({"tgi": 0.0}), HOL_BY_ENGINE) == list(HOL_BY_ENGINE.values())


def test_engines_seen_come_from_server_spans_and_the_detected_scrape() -> None:
    spans = analyze_paths([ROOT / "samples" / "external" / "vllm" / "capture"]).diagnosis.features.value("engines_seen")
    assert set(spans) == {"vllm"} and spans["vllm"] > 0
    client_only = analyze_paths([ROOT / "samples" / "queue" / "client"]).diagnosis.features
    assert not client_only.available("engines_seen")
