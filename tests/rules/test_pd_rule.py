"""The pd_transfer rule on real bundled-engine captures under disaggregated prefill/decode
(``pd=True``): a slow link (``kv_transfer_latency_ms``) and a small decode pool are each named with
their evidence; the same rounds on a fast link and a roomy pool are not. On hand-built features: a
transfer slow only where it waited (its fastest ones quick) is not the link."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.ground.capture import load_capture
from diag.bundled_engine.faults import parse_injections
from diag.ground.tables import build_tables
import rules.runner  # noqa: F401  (registers the rules)
from rules import evidence, run_rules
from rules.base import REGISTRY, RuleContext
from support.engine_testutil import capture_rounds
from support.rulectx import features_of, rule_context

pd_transfer = REGISTRY["pd_transfer"].evaluate

#: spans of a disaggregated engine whose transfers are a third of TTFT and, at the median, 0.8x the prefill
SPANS = {"ttft_p95_s": 0.02, "pd_requests_n": 12.0, "pd_transfer_share": 0.35, "pd_transfer_share_tail": 0.6,
         "pd_decode_queue_share": 0.1, "pd_decode_queue_share_tail": 0.1, "pd_transfer_vs_prefill_x": 0.8}


def _ctx(**features: float | None) -> RuleContext:
    return rule_context("pd_transfer", features_of({**SPANS, **features}, source="spans"), client_only=False)


def test_a_transfer_slow_only_where_it_waited_is_not_the_link() -> None:
    """The fastest transfers at 0.15x their prefill: the slower ones waited (behind another transfer,
    or for a busy side); the link itself is quick, and the reason says how to see it alone."""
    out = pd_transfer(_ctx(pd_transfer_floor_vs_prefill_x=0.15))
    assert isinstance(out, str) and "fastest transfers take 0.15x" in out and "one at a time" in out


def test_a_link_slow_for_every_transfer_is_named_with_its_fastest_ones() -> None:
    out = pd_transfer(_ctx(pd_transfer_floor_vs_prefill_x=0.6))
    assert not isinstance(out, str) and "KV transfer" in out.title
    rows = {e.key: e for e in out.evidence}
    floor = rows[evidence.PD_TRANSFER_FLOOR_X]
    assert floor.crossed and floor.value == 0.6 and floor.threshold == 0.5
    assert rows[evidence.PD_TRANSFER_X].crossed


def test_without_the_fastest_transfers_the_link_is_not_named() -> None:
    assert isinstance(pd_transfer(_ctx(pd_transfer_floor_vs_prefill_x=None)), str)


def _rounds(n: int = 6, out: int = 16) -> list[list[tuple[list[int], int]]]:
    return [[(list(range(5 + r + i, 37 + r + i)), out) for i in range(2)] for r in range(n)]  # 2 at once, 32 tokens


@pytest.fixture(scope="module")
def caps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pd")
    return {
        "link": capture_rounds(root / "link", _rounds(), pd=True,
                               faults=parse_injections(["kv_transfer_latency_ms=40"])),
        "pool": capture_rounds(root / "pool", _rounds(out=40), pd=True, pd_decode_kv_blocks=5),
        "fine": capture_rounds(root / "fine", _rounds(), pd=True),
    }


@pytest.mark.slow
def test_a_slow_link_is_named_as_the_transfer_with_both_sides_ttft(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["link"])))
    v = d.verdict
    assert v.category == "pd_transfer" and "KV transfer" in v.title, [(f.category, f.confidence) for f in d.findings]
    rows = {e.key: e for e in v.evidence}
    assert rows[evidence.PD_TRANSFER_SHARE].crossed and rows[evidence.PD_TRANSFER_SHARE].value > 0.4
    assert rows[evidence.PD_TRANSFER_FLOOR_X].crossed  # every transfer holds the 40 ms, the fastest too
    # each instance's own TTFT: the prefill side's stays low, the decode side's holds the 40 ms
    assert rows[evidence.PD_PREFILL_TTFT_P50].value < rows[evidence.PD_DECODE_TTFT_P50].value
    # at least the injected 40 ms; one transfer at a time on the link, so the second of a pair waits too
    assert 0.038 <= rows[evidence.PD_TRANSFER_P50].value <= 0.2


@pytest.mark.slow
def test_a_small_decode_pool_is_named_as_its_admission_and_owns_the_queue(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["pool"])))
    v = d.verdict
    assert v.category == "pd_transfer" and "admits" in v.title, [(f.category, f.confidence) for f in d.findings]
    assert {e.key: e for e in v.evidence}[evidence.PD_ADMISSION_SHARE].crossed
    for f in d.findings:
        if f.category == "queue":
            assert "pd_transfer" in f.demoted_by


@pytest.mark.slow
def test_a_fast_link_and_a_roomy_pool_are_not_named(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["fine"])))
    assert d.verdict.category != "pd_transfer", [(f.category, f.confidence) for f in d.findings]
    # a real transfer of a few ms is a material share of this tiny model's TTFT; the second of each pair
    # waits behind the first and for the decode worker busy with it (2 cores), up to its prefill's time,
    # but the fastest transfers, which waited for nothing, stay well under their prefill
    (passed,) = [p for p in d.passed if p.rule_id == "pd_transfer"]
    assert any(why in passed.reason for why in ("of TTFT", "its prefill", "fastest transfers")), passed.reason


@pytest.mark.slow
def test_a_slow_link_is_named_from_the_engines_metrics_alone(tmp_path: Path) -> None:
    """A user with only /metrics: each instance's own TTFT (role=prefill, role=decode) and the transfer
    histogram, scraped by the probe from a real ``ttft serve --pd`` process."""
    import sys

    from diag.analysis import analyze_paths
    from diag.cli import main
    from support.engine_testutil import free_port, process

    port = free_port()
    with process([sys.executable, "-m", "diag", "serve", "--port", str(port), "--pd", "--inject",
                  "kv_transfer_latency_ms=30"], "listening on"):
        url = f"http://127.0.0.1:{port}"
        assert main(["probe", url, "-c", "2", "-n", "30", "--input-tokens", "64", "--output-tokens", "16",
                     "--metrics", url + "/metrics", "-o", str(tmp_path / "cap"), "--no-progress"]) == 0
    d = analyze_paths([str(tmp_path / "cap")]).diagnosis
    v = d.verdict
    assert v.category == "pd_transfer" and v.confidence >= 0.7, [(f.category, f.confidence) for f in d.findings]
    rows = {e.key: e for e in v.evidence}
    assert rows[evidence.PD_TRANSFER_SHARE_METRICS].crossed
    assert rows[evidence.PD_TRANSFER_X_METRICS].value > 1.0
