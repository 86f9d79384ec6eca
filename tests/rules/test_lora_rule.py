"""rules.lora: the lora_adapters rule's three checks, tried in their declared order."""

from __future__ import annotations

import pytest

import rules.runner  # noqa: F401  (registers the rules)
from rules import evidence
from rules.base import REGISTRY, checks_of
from rules.features import Feature, Features
from rules.model import Finding
from support.rulectx import rule_context

UNITS = {"lora_slot_wait_share": "share", "lora_slot_wait_share_tail": "share", "lora_mix_ttft_x": "x",
         "lora_other_ttft_x": "x", "lora_wait_share_of_ttft": "share", "requests_n": "requests",
         "ttft_p95_s": "s"}


def _judge(**values: float) -> Finding | str:
    feats = Features()
    for name, value in {"requests_n": 60.0, "ttft_p95_s": 0.4, **values}.items():
        feats.add(Feature(name, value, UNITS[name], True))
    return REGISTRY["lora_adapters"].evaluate(rule_context("lora_adapters", feats, client_only=False))


def test_the_checks_are_tried_server_then_control_then_design() -> None:
    assert [c.id for c in checks_of("lora_adapters")] == [
        "lora_adapters.server", "lora_adapters.control", "lora_adapters.design"]
    assert REGISTRY["lora_adapters"].needs == (("lora_slot_wait_share",), ("lora_mix_ttft_x",),
                                               ("lora_other_ttft_x", "lora_wait_share_of_ttft"))


def test_the_engines_slot_waits_answer_before_the_clients_design() -> None:
    out = _judge(lora_slot_wait_share=0.4, lora_other_ttft_x=1.0, lora_wait_share_of_ttft=0.0)
    assert isinstance(out, Finding)
    assert out.evidence[0].key == evidence.LORA_SLOT_WAIT_SHARE and out.population_share == pytest.approx(0.4)
    # the server's account passes: the design the client also has is not asked
    assert _judge(lora_slot_wait_share=0.05, lora_other_ttft_x=3.0, lora_wait_share_of_ttft=0.5) == \
        "requests waited for an adapter slot 5% of TTFT (< 15%): the adapters fit their slots"


def test_the_lora_sweeps_control_answers_before_the_design() -> None:
    out = _judge(lora_mix_ttft_x=2.0, lora_other_ttft_x=1.0, lora_wait_share_of_ttft=0.0)
    assert isinstance(out, Finding) and out.evidence[0].key == evidence.LORA_MIX_X


def test_the_design_alone_fires_or_says_why_not() -> None:
    out = _judge(lora_other_ttft_x=3.0, lora_wait_share_of_ttft=0.5)
    assert isinstance(out, Finding)
    assert [e.key for e in out.evidence][:2] == [evidence.LORA_OTHER_X, evidence.LORA_WAIT_SHARE]
    assert _judge(lora_other_ttft_x=1.2, lora_wait_share_of_ttft=0.5) == (
        "requests for an adapter not in flight take 1.20x those joining theirs (< 1.50x): the adapters fit their slots")
