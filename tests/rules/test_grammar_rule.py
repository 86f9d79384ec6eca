"""rules.grammar: grammar_compile from the engine's grammar waits and from the probe's schema design
(a schema's first uses against its repeats), on the bundled sample and on hand-built features.
Features in, finding or pass reason out."""

from __future__ import annotations

from pathlib import Path

import pytest

import rules.runner  # noqa: F401  (registers the rules)
from rules import evidence
from rules.base import REGISTRY, RuleContext, checks_of
from support.rulectx import applying, capture_context, features_of, rule_context

grammar_compile = REGISTRY["grammar_compile"].evaluate

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "grammar_compile"

#: the probe's design seen from the client: first uses at 6x their repeats, all above the repeats' p90
CLIENT = {"requests_n": 36.0, "ttft_p95_s": 0.2, "schema_first_ttft_x": 6.0, "schema_wait_share_of_ttft": 0.6,
          "schema_first_above_repeat_frac": 1.0, "schema_first_n": 6.0, "schema_repeat_n": 30.0}


def _ctx(client_only: bool = True, **features: float | None) -> RuleContext:
    return rule_context("grammar_compile", features_of(features, source="client"), client_only)


def _sample_ctx(*dirs: str) -> RuleContext:
    return capture_context("grammar_compile", [SAMPLE / d for d in dirs])


def _applying(ctx: RuleContext) -> list[str]:
    return applying("grammar_compile", ctx)


def test_the_checks_are_tried_server_then_client() -> None:
    assert [c.id for c in checks_of("grammar_compile")] == ["grammar_compile.server", "grammar_compile.client"]
    assert REGISTRY["grammar_compile"].needs == (("grammar_wait_share_of_ttft",),
                                                 ("schema_first_ttft_x", "schema_wait_share_of_ttft"))
    assert REGISTRY["grammar_compile"].tier == 2 and REGISTRY["grammar_compile"].category == "grammar_compile"


def test_joined_captures_are_judged_by_the_engines_grammar_waits() -> None:
    ctx = _sample_ctx("client", "server-0")
    assert _applying(ctx) == ["grammar_compile.server", "grammar_compile.client"]
    out = grammar_compile(ctx)
    assert not isinstance(out, str) and not out.black_box
    rows = {e.key: e for e in out.evidence}
    share, tail = ctx.v("grammar_wait_share_of_ttft"), ctx.v("grammar_wait_share_of_ttft_tail")
    wait = rows[evidence.GRAMMAR_WAIT_SHARE]
    assert wait.crossed and wait.value == max(share, tail) and wait.threshold == ctx.th["ttft_share_min"]
    assert out.population_share == share
    assert evidence.SCHEMA_FIRST_X not in rows  # the client's design is not asked
    assert rows[evidence.SCHEMA_FIRST_TTFT_P50].value == ctx.v("schema_first_ttft_p50_s")


def test_the_client_alone_is_judged_by_first_uses_against_repeats() -> None:
    ctx = _sample_ctx("client")
    assert _applying(ctx) == ["grammar_compile.client"]
    out = grammar_compile(ctx)
    assert not isinstance(out, str) and out.black_box
    assert [e.key for e in out.evidence][:3] == [evidence.SCHEMA_FIRST_X, evidence.SCHEMA_FIRST_ABOVE_P90,
                                                 evidence.SCHEMA_FIRST_WAIT_SHARE]
    first = out.evidence[0]
    assert first.crossed and first.value == ctx.v("schema_first_ttft_x")
    assert first.threshold == ctx.th["first_ratio_min"]
    assert out.evidence[1].crossed
    assert out.population_share == ctx.v("schema_wait_share_of_ttft")
    assert evidence.GRAMMAR_WAIT_SHARE not in {e.key for e in out.evidence}


def test_the_client_path_names_it_from_hand_built_features() -> None:
    out = grammar_compile(_ctx(**CLIENT))
    assert not isinstance(out, str) and out.black_box
    assert out.explained_s == pytest.approx(0.6 * 0.2) and out.explained_pct == pytest.approx(60.0)


def test_a_grammar_wait_under_its_threshold_passes_without_asking_the_client() -> None:
    # the engine's account answers: its pass is final, though the client's design alone would fire
    low = {"grammar_wait_share_of_ttft": 0.05, "grammar_wait_share_of_ttft_tail": 0.10}
    ctx = _ctx(client_only=False, **CLIENT, **low)
    assert _applying(ctx) == ["grammar_compile.server", "grammar_compile.client"]
    assert isinstance(grammar_compile(ctx), str)
    assert not isinstance(grammar_compile(_ctx(**CLIENT)), str)


def test_the_slowest_requests_wait_share_fires_the_server_path() -> None:
    out = grammar_compile(_ctx(client_only=False, ttft_p95_s=1.0, requests_n=40.0,
                               grammar_wait_share_of_ttft=0.05, grammar_wait_share_of_ttft_tail=0.5))
    assert not isinstance(out, str) and not out.black_box
    assert out.evidence[0].key == evidence.GRAMMAR_WAIT_SHARE and out.evidence[0].value == 0.5
    assert out.explained_pct == pytest.approx(50.0) and out.population_share == 0.05


def test_first_uses_no_slower_than_repeats_pass() -> None:
    out = grammar_compile(_ctx(**{**CLIENT, "schema_first_ttft_x": 1.1}))
    assert isinstance(out, str) and out
