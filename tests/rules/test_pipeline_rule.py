"""The pipeline_bubble rule on real bundled-engine captures: PP 2 with one request at a time
(one micro-batch per step, so each of the two stages idles while the other runs) is named with
its evidence; the same workload on one rank never is (the rule is skipped, not passed silently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.ground.capture import load_capture
from diag.ground.tables import build_tables
from rules import evidence, run_rules
from support.engine_testutil import capture_rounds


def _capture(out: Path, **config) -> Path:
    # one at a time, 256-token prompts: prefill is most of TTFT
    return capture_rounds(out, [[(list(range(10 + i, 266 + i)), 4)] for i in range(6)], **config)


@pytest.fixture(scope="module")
def caps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pp")
    return {"pp2": _capture(root / "pp2", pp=2), "pp1": _capture(root / "pp1", warmup=False),
            "tp2": _capture(root / "tp2", tp=2)}


@pytest.mark.slow
def test_pp2_alone_is_a_pipeline_bubble_with_its_share(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["pp2"])))
    v = d.verdict
    assert v.category == "pipeline_bubble", [(f.category, f.confidence) for f in d.findings]
    rows = {e.key: e for e in v.evidence}
    share = rows[evidence.PP_IDLE_PREFILL]
    assert share.crossed and 0.25 <= share.value <= 0.75  # two stages, one micro-batch: about half
    assert rows[evidence.PP_MICROBATCHES].value == 1
    assert v.explained_pct is not None and v.explained_pct >= 10
    assert any("micro-batches" in c for c in v.next_checks) and any("--pipeline-parallel-size" in c for c in v.next_checks)
    # the prefill it stretches is not blamed on compute alone
    assert all(f.category != "prefill_compute" or f.demoted_by for f in d.findings)


@pytest.mark.slow
def test_one_rank_never_names_a_bubble(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["pp1"])))
    assert d.verdict.category != "pipeline_bubble"
    (skip,) = [s for s in d.skipped if s.rule_id == "pipeline_bubble"]
    assert "pp_bubble_share_of_prefill" in skip.reason


@pytest.mark.slow
def test_pp_against_one_rank_in_one_capture_is_compared(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables([load_capture(caps["pp2"]), load_capture(caps["pp1"])]))
    by = d.features.value("ttft_by_parallelism")
    assert set(by) == {"pp=2", "1 rank"} and all(v > 0 for v in by.values())
    assert d.features.value("pp_vs_tp_ttft_ratio") > 0
    pp = [f for f in d.findings if f.category == "pipeline_bubble"]
    assert pp and any(e.key == evidence.PP_SLOPE_X for e in pp[0].evidence)


@pytest.mark.slow
def test_pp_against_tp_at_the_same_rank_count_is_compared_and_tp_alone_is_not_a_bubble(caps: dict[str, Path]) -> None:
    tp = run_rules(build_tables(load_capture(caps["tp2"])))
    assert tp.verdict.category != "pipeline_bubble"
    assert any(s.rule_id == "pipeline_bubble" for s in tp.skipped)  # collectives are comm's evidence, not a bubble
    d = run_rules(build_tables([load_capture(caps["pp2"]), load_capture(caps["tp2"])]))
    assert set(d.features.value("ttft_by_parallelism")) == {"pp=2", "tp=2"}
    assert d.features.get("pp_vs_tp_ttft_ratio").source.startswith("PP against TP")
    assert d.features.value("pp_vs_tp_ttft_ratio") > 0
