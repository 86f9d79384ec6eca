"""rules.evidence: every evidence row has a stable key declared once, and its name comes from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from rules import evidence

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def test_each_key_and_each_name_is_declared_once() -> None:
    assert len(set(evidence.NAMES.values())) == len(evidence.NAMES)
    with pytest.raises(ValueError):
        evidence._row(evidence.DECODE_HOLD, "another wording")
    with pytest.raises(ValueError):
        evidence._row("another_key", evidence.name_of(evidence.DECODE_HOLD))


def test_a_family_row_is_named_by_its_template() -> None:
    assert evidence.name_of(evidence.slo("ttft_p99")) == "SLO ttft_p99"
    assert evidence.name_of(evidence.slo_mixed("itl_p99")) == "SLO itl_p99 with long prompts among the streams"
    assert evidence.QUEUE_SHARE_TAIL == evidence.stage_share_tail("queue") == "share_tail.queue"
    assert evidence.name_of(evidence.QUEUE_SHARE_TAIL) == "queue share of TTFT (slowest 5%)"
    with pytest.raises(KeyError):
        evidence.name_of("no_such_row")
    with pytest.raises(KeyError):
        evidence.family("no_such_family", "queue")


def test_a_row_built_from_a_key_carries_it() -> None:
    row = evidence.row(evidence.DECODE_HOLD, 0.4, 0.5, "x", "streams slow down", op="<=", crossed=True)
    assert (row.key, row.name) == ("decode_hold", "per-stream decode speed, highest / lowest concurrency")
    assert row.to_dict()["key"] == "decode_hold"


@pytest.mark.parametrize("sample", ["queue", "kv_cache", "lora_adapters", "pd_transfer", "healthy"])
def test_every_row_a_diagnosis_shows_has_a_declared_key(sample: str) -> None:
    d = analyze_paths(sorted(m.parent for m in (SAMPLES / sample).rglob("meta.json"))).diagnosis
    assert d is not None
    rows = [e for f in d.findings + [d.verdict] for e in f.evidence]
    assert rows
    for e in rows:
        assert e.key is not None and evidence.name_of(e.key) == e.name, e
