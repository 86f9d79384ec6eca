"""The pd_transfer rule on real bundled-engine captures under disaggregated prefill/decode
(``pd=True``): a slow link (``kv_transfer_latency_ms``) and a small decode pool are each named with
their evidence; the same rounds on a fast link and a roomy pool are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.ground.capture import load_capture
from diag.bundled_engine.faults import parse_injections
from diag.ground.tables import build_tables
from rules import evidence, run_rules
from support.engine_testutil import capture_rounds

pytestmark = pytest.mark.slow


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


def test_a_slow_link_is_named_as_the_transfer_with_both_sides_ttft(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["link"])))
    v = d.verdict
    assert v.category == "pd_transfer" and "KV transfer" in v.title, [(f.category, f.confidence) for f in d.findings]
    rows = {e.key: e for e in v.evidence}
    assert rows[evidence.PD_TRANSFER_SHARE].crossed and rows[evidence.PD_TRANSFER_SHARE].value > 0.4
    # each instance's own TTFT: the prefill side's stays low, the decode side's holds the 40 ms
    assert rows[evidence.PD_PREFILL_TTFT_P50].value < rows[evidence.PD_DECODE_TTFT_P50].value
    # at least the injected 40 ms; one transfer at a time on the link, so the second of a pair waits too
    assert 0.038 <= rows[evidence.PD_TRANSFER_P50].value <= 0.2


def test_a_small_decode_pool_is_named_as_its_admission_and_owns_the_queue(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["pool"])))
    v = d.verdict
    assert v.category == "pd_transfer" and "admits" in v.title, [(f.category, f.confidence) for f in d.findings]
    assert {e.key: e for e in v.evidence}[evidence.PD_ADMISSION_SHARE].crossed
    for f in d.findings:
        if f.category == "queue":
            assert "pd_transfer" in f.demoted_by


def test_a_fast_link_and_a_roomy_pool_are_not_named(caps: dict[str, Path]) -> None:
    d = run_rules(build_tables(load_capture(caps["fine"])))
    assert d.verdict.category != "pd_transfer", [(f.category, f.confidence) for f in d.findings]
    passed = [p for p in d.passed if p.rule_id == "pd_transfer"]
    if passed:
        # a real transfer of a few ms is a material share of this tiny model's TTFT, but well under its prefill
        assert "its prefill" in passed[0].reason or "of TTFT" in passed[0].reason
    else:
        # a 1-2 ms transfer against a 3-5 ms prefill sits near the 0.5x bar on a busy 2-core machine: at
        # most a candidate under the verdict floor, never named
        (f,) = [f for f in d.findings if f.category == "pd_transfer"]
        assert f.confidence < d.thresholds["general"]["verdict_floor"], f


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
