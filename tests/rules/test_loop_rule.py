"""The engine_overhead rule on real bundled-engine captures: a step loop that sleeps before every
step (``--inject scheduler_stall_ms``, a CPU-bound scheduler) is named with its evidence and owns
the queue time it causes; the same workload with a stall a tenth of a step is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.ground.capture import load_capture
from diag.bundled_engine.faults import parse_injections
from diag.ground.tables import build_tables
from rules import evidence, run_rules
from support.engine_testutil import capture_rounds


def _capture(out: Path, stall_ms: float) -> Path:
    rounds = [[(list(range(5 + r + i, 69 + r + i)), 8) for i in range(3)] for r in range(8)]  # 3 at once, 64 tokens
    return capture_rounds(out, rounds, faults=parse_injections([f"scheduler_stall_ms={stall_ms:g}"]))


@pytest.fixture(scope="module")
def caps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loop")
    return {"stall": _capture(root / "stall", 25), "slight": _capture(root / "slight", 0.5)}


def test_a_stalled_step_loop_is_engine_overhead_with_its_share(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["stall"])))
    v = d.verdict
    assert v.category == "engine_overhead", [(f.category, f.confidence) for f in d.findings]
    assert v.confidence >= 0.7
    rows = {e.key: e for e in v.evidence}
    idle = rows[evidence.LOOP_IDLE_SHARE]
    assert idle.crossed and idle.value > 0.5  # 25 ms before every step of a few ms
    assert rows[evidence.LOOP_IDLE_TTFT_SHARE].crossed
    assert rows[evidence.LOOP_GAP_P50].value == pytest.approx(0.025, rel=0.3)
    # the queue it causes is the loop's: demoted, never ranked above it
    for f in d.findings:
        if f.category in ("queue", "decode"):
            assert "engine_overhead" in f.demoted_by


def test_a_stall_well_under_a_step_is_not_named(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["slight"])))
    assert d.verdict.category != "engine_overhead"
    (p,) = [p for p in d.passed if p.rule_id == "engine_overhead"]
    assert "idle" in p.reason


def test_without_engine_steps_the_rule_says_what_it_needs() -> None:
    # real vLLM's spans: per request, no engine steps
    d = run_rules(build_tables(load_capture(Path(__file__).parents[2] / "samples/external/vllm/capture")))
    (sk,) = [s for s in d.skipped if s.rule_id == "engine_overhead"]
    assert "engine-step spans" in sk.reason
