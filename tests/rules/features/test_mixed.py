"""ttft diagnose's mixed follow-up (segments ``mixed=N``: a long prompt among short streams), as
the features and rules read it: kept apart from the steady population, its long prompts' TTFT
windows are the prefills the running streams' token gaps are judged against, and an ITL target
is judged on its gaps. On a simulated prefill-first engine (a long prompt's prefill is one whole
step, ahead of decode), client only."""

from __future__ import annotations

from pathlib import Path

from support.simcap import Engine, Phase, simulate, tables_of

from rules import evidence, run_rules
from rules.features.itl import MIXED_SOURCE

ENGINE = Engine(prefill_s_per_token=0.15e-3, decode_base_s=4e-3)


def _tables(tmp_path: Path):  # noqa: ANN202
    phases = [Phase("concurrency=1", 8, 64, 32), Phase("prompt=512", 4, 512, 32),
              Phase("concurrency=4", 16, 64, 32, conc=4),
              # outputs of mixed lengths (as diagnose sends): the streams end apart, a long prompt meets them mid-way
              Phase("mixed=1000", 32, [64, 64, 64, 1000, 64, 64, 64], [20, 44, 32, 16, 40, 24, 36], conc=4)]
    return tables_of(simulate(tmp_path, ENGINE, phases, server=False), sides=("client",))


def test_long_prompts_among_streams_are_read_apart_and_stall_them(tmp_path: Path) -> None:
    d = run_rules(_tables(tmp_path))
    f = d.features
    assert f.get("itl_interference_ratio").source == MIXED_SOURCE
    assert f.value("itl_interference_ratio") >= 3.0 and f.value("mixed_by_diagnose") == 1.0
    assert f.value("requests_n") == 28  # the 32 mixed requests are not steady ones
    # no ITL target: what a long prompt would do, ranked after what was measured
    inter = next(x for x in d.findings if x.category == "interference")
    assert inter.conditional and "own test" in (inter.note or "") and inter.tier >= 3


def test_an_itl_target_the_long_prompts_break_names_interference(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    d = run_rules(tables, slo={"itl_p99": 0.05})
    check = d.features.value("itl_mixed_slo")["itl_p99"]
    assert check["met"] is False and check["value_s"] > 0.1  # a 1000-token prefill, 150 ms, in one step
    assert d.verdict.category == "interference" and not d.verdict.conditional
    assert any(e.key == evidence.slo_mixed("itl_p99") and e.crossed for e in d.verdict.evidence)
    note = next(n for n in d.notes if n.startswith("an SLO is broken"))  # names what broke, not an empty list
    assert f"itl_p99 with long prompts among the streams = {round(check['value_s'] * 1e3, 1)} ms" in note
    # a target the stalls stay under: judged met
    assert run_rules(tables, slo={"itl_p99": 1.0}).features.value("itl_mixed_slo")["itl_p99"]["met"] is True
