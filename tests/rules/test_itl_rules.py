"""rules.itl's decode rule on simulated runs, client only: streams slowing as the batch grows is
what batching costs, so it names decode only against the users' ITL/TPOT target (or ITL against
TTFT), never from the slowdown alone."""

from __future__ import annotations

from pathlib import Path

from support.simcap import Engine, Phase, simulate, tables_of

from rules import evidence, run_rules

# decode steps that grow with the batch (3 ms + 1 ms per running sequence); a 40 ms prefill, so that
# TTFT stays above a token gap
ENGINE = Engine(decode_base_s=3e-3, decode_s_per_seq=1e-3, prefill_base_s=40e-3)


def _tables(tmp_path: Path):  # noqa: ANN202
    phases = [Phase(f"concurrency={c}", 4 * c, 64, 48, conc=c) for c in (1, 2, 4, 8, 16)]
    return tables_of(simulate(tmp_path, ENGINE, phases, server=False), sides=("client",))


def test_streams_slowing_under_load_alone_is_not_named_decode(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    d = run_rules(tables)
    assert d.features.value("decode_speed_hold_ratio") <= 0.5  # 19 ms a step at 16 in flight, 4 ms alone
    assert not any(f.category == "decode" for f in d.findings)
    reason = next(p.reason for p in d.passed if p.rule_id == "decode")
    assert "what a growing batch costs" in reason and "--slo" in reason
    # the users' per-token target, broken: that is a decode problem
    d = run_rules(tables, slo={"tpot_p99": 0.008})
    dec = next(f for f in d.findings if f.category == "decode")
    assert any(e.key == evidence.slo("tpot_p99") and e.crossed for e in dec.evidence)
