"""Sources and the view model: incremental tailing, windows, the model's numbers."""

from __future__ import annotations

from pathlib import Path

from conftest import HEALTHY, QUEUED, write_capture

from tui import model
from tui.sources import CaptureSource, LiveSource, SpanTail


def test_span_tail_parses_only_new_complete_lines(tmp_path: Path) -> None:
    src = write_capture(tmp_path / "a", [HEALTHY], per_phase=10)
    lines = (src / "spans.otlp.jsonl").read_bytes().splitlines(keepends=True)
    target = tmp_path / "spans.otlp.jsonl"
    target.write_bytes(lines[0])
    tail = SpanTail(target)
    first = tail.read_new()
    assert first is not None and len(first) > 0
    offset = tail.offset
    assert tail.read_new() is None  # nothing new
    rest = b"".join(lines[1:])
    with open(target, "ab") as fh:
        fh.write(rest[: len(rest) // 2])  # half a line at the end stays unread
    got = tail.read_new()
    assert tail.offset > offset or got is None
    with open(target, "ab") as fh:
        fh.write(rest[len(rest) // 2:])
    tail.read_new()
    assert tail.offset == target.stat().st_size
    assert tail.bad_lines == 0


def test_live_source_follows_a_growing_capture(tmp_path: Path) -> None:
    cap = tmp_path / "live"
    cap.mkdir()
    src = LiveSource(cap, window_s=3600)
    snap = src.poll()
    assert not snap.errors and len(snap.tables.requests) == 0
    write_capture(cap, [HEALTHY], per_phase=10)
    snap = src.poll()
    assert len(snap.tables.requests) == 10 and snap.generation >= 2
    gen = snap.generation
    assert src.poll().generation == gen  # nothing new: the tables are not rebuilt
    # a source that dies says so
    import shutil

    shutil.rmtree(cap)
    assert any("gone" in e for e in src.poll().errors)


def test_view_model_numbers(tmp_path: Path) -> None:
    cap = write_capture(tmp_path / "c", [HEALTHY, QUEUED], per_phase=20)
    snap = CaptureSource(cap).poll()
    vm = model.build_view_model_with_rules(snap)
    assert vm.latency.requests == 40
    shares = {s.stage: s.share for s in vm.stages.stages}
    assert abs(sum(shares.values()) - 1.0) < 0.01
    assert max(shares, key=shares.get) == "queue"
    assert vm.slowest[0].top_stage == "queue"
    assert vm.busy.steps == 40 and vm.gpus == []
    assert vm.throughput.kv_usage_ratio is not None
    assert "queue" in (vm.verdict.category + vm.verdict.title).lower()
