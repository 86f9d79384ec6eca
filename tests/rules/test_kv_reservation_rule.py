"""rules.admission: kv_reservation's checks on hand-built features: the engine's steps while requests
waited answer first; without the engine's KV usage while waiting the rule passes. Features in, finding
or pass reason out; the end-to-end verdicts on bundled-engine captures are in test_admission_rules.py."""

from __future__ import annotations

import rules.runner  # noqa: F401  (registers the rules)
from rules import evidence
from rules.base import REGISTRY, RuleContext, checks_of, missing_reason
from rules.features import Features
from support.rulectx import applying, features_of, rule_context

kv_reservation = REGISTRY["kv_reservation"].evaluate

#: requests wait through most steps while KV stays low and half the batch cap is free
RESERVED = {"requests_n": 40.0, "ttft_p95_s": 2.0, "queue_share_tail": 0.6, "kvr_waiting_steps_frac": 0.7,
            "kvr_kv_usage_while_waiting_p95": 0.2, "kvr_prefill_steps_while_waiting_frac": 0.1,
            "kvr_running_while_waiting_p50": 2.0, "running_cap": 8.0}
CLIENT = {"ttft_concurrency_ratio": 3.0, "decode_speed_hold_ratio": 0.95}


def _ctx(**features: float | None) -> tuple[RuleContext, Features]:
    feats = features_of(features, source="engine")
    return rule_context("kv_reservation", feats, client_only=False), feats


def _applying(ctx: RuleContext) -> list[str]:
    return applying("kv_reservation", ctx)


def test_the_checks_are_tried_server_then_client() -> None:
    assert [c.id for c in checks_of("kv_reservation")] == ["kv_reservation.server", "kv_reservation.client"]
    assert REGISTRY["kv_reservation"].needs == (("kvr_kv_usage_while_waiting_p95", "queue_share_tail"),
                                                ("ttft_concurrency_ratio", "decode_speed_hold_ratio"))


def test_the_engines_steps_name_a_reservation() -> None:
    ctx, _ = _ctx(**RESERVED, **CLIENT)
    assert _applying(ctx) == ["kv_reservation.server"]  # the client's check only without the engine's KV usage
    out = kv_reservation(ctx)
    assert not isinstance(out, str)
    rows = {e.key: e for e in out.evidence}
    assert list(rows) == [evidence.QUEUE_SHARE_TAIL, evidence.STEPS_WITH_WAITING, evidence.KV_USAGE_WAITING_P95,
                          evidence.PREFILL_STEPS_WAITING, evidence.RUNNING_OVER_CAP]
    assert rows[evidence.KV_USAGE_WAITING_P95].value == 0.2 and rows[evidence.RUNNING_OVER_CAP].value == 0.25
    assert out.explained_pct == 60.0


def test_without_the_engines_kv_usage_while_waiting_it_passes() -> None:
    ctx, feats = _ctx(**CLIENT)
    assert _applying(ctx) == ["kv_reservation.client"] and missing_reason(REGISTRY["kv_reservation"], feats) is None
    assert isinstance(kv_reservation(ctx), str) and kv_reservation(ctx)
    few, _ = _ctx(**CLIENT, kvr_waiting_steps_frac=0.05)
    assert isinstance(kv_reservation(few), str) and kv_reservation(few) != kv_reservation(ctx)


def test_the_engines_kv_usage_without_a_queue_share_asks_no_check() -> None:
    ctx, _ = _ctx(**CLIENT, kvr_kv_usage_while_waiting_p95=0.2)
    assert _applying(ctx) == [] and kv_reservation(ctx) == ""
