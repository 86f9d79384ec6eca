"""``--inject-long TOKENS:EVERY``: a long prompt every EVERY-th request among short ones."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from collectors.probe.workload import LengthSpec, TokenCounter, Workload, WorkloadError, WorkloadSpec
from diag.cli.commands import probe as probe_cmd

TOKENIZER = Path(__file__).resolve().parents[3] / "diag" / "bundled_engine" / "data" / "tokenizer.json"


def test_every_nth_prompt_is_the_long_one_and_the_rest_keep_their_length():
    tok = TokenCounter(TOKENIZER)
    w = Workload(WorkloadSpec(LengthSpec.parse("24"), inject_long_tokens=400, inject_long_every=4), tok)
    items = [w.next_item() for _ in range(12)]
    assert [i.input_tokens_target for i in items] == [24, 24, 24, 400] * 3
    for i in items:
        assert abs(tok.count(i.prompt) - i.input_tokens_target) <= 3
    assert w.spec.describe()["inject_long"] == "400:4"
    assert w.with_input(LengthSpec.parse("32")).spec.inject_long_every == 4  # a sweep keeps the design


def _cfg(*argv: str):
    parser = argparse.ArgumentParser()
    probe_cmd.add_parser(parser.add_subparsers())
    return probe_cmd.build_config(parser.parse_args(["probe", "http://127.0.0.1:1", *argv]))


def test_the_flag_builds_the_workload_and_bad_values_are_one_line_errors():
    cfg, _ = _cfg("--inject-long", "512:6")
    assert (cfg.workload.inject_long_tokens, cfg.workload.inject_long_every) == (512, 6)
    for bad in ("512", "x:3", "512:1", "0:4"):
        with pytest.raises(Exception, match="--inject-long"):
            _cfg("--inject-long", bad)
    with pytest.raises(WorkloadError, match="EVERY >= 2"):
        Workload(WorkloadSpec(inject_long_tokens=10, inject_long_every=1))


def test_the_design_runs_a_control_without_long_prompts_then_the_mix():
    """Alone, --inject-long is a two-point sweep at the same load: no long prompt (the control), then
    every EVERY-th prompt long; with another sweep the long prompts ride along every point, as before."""
    cfg, sweep = _cfg("--inject-long", "512:6", "-c", "3", "-n", "24")
    assert sweep is not None and sweep.kind == "long_every" and sweep.point_values() == [0.0, 6.0]
    from collectors.probe.sweep import point_load

    assert point_load(sweep, 0.0, cfg.load, True) == point_load(sweep, 6.0, cfg.load, True)  # the same load
    _, other = _cfg("--inject-long", "512:6", "--sweep", "concurrency")
    assert other is not None and other.kind == "concurrency"
    tok = TokenCounter(TOKENIZER)
    w = Workload(WorkloadSpec(LengthSpec.parse("24"), inject_long_tokens=400, inject_long_every=4), tok)
    control = w.with_long_every(0)
    assert {control.next_item().input_tokens_target for _ in range(8)} == {24}
    mixed = w.with_long_every(3)
    assert [mixed.next_item().input_tokens_target for _ in range(6)] == [24, 24, 400] * 2


def test_omit_max_tokens_sends_none():
    w = Workload(WorkloadSpec(LengthSpec.parse("24"), omit_max_tokens=True))
    assert w.next_item().max_tokens is None and w.spec.describe()["omit_max_tokens"] is True
    assert Workload(WorkloadSpec(LengthSpec.parse("24"))).next_item().max_tokens == 64
