"""Sources and the view model: incremental tailing, windows, the model's numbers."""

from __future__ import annotations

from pathlib import Path

from support.tui_captures import HEALTHY, QUEUED, write_capture

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
    # the slowest table: highest TTFT first, each row naming its own request
    req = snap.tables.requests.set_index("trace_id")
    assert [r.ttft_s for r in vm.slowest] == sorted((r.ttft_s for r in vm.slowest), reverse=True)
    for r in vm.slowest:
        assert r.trace_id in req.index and abs(float(req.loc[r.trace_id, "ttft_s"]) - r.ttft_s) < 1e-9
    assert vm.busy.steps == 40 and vm.gpus == []
    assert vm.throughput.kv_usage_ratio is not None
    assert "queue" in (vm.verdict.category + vm.verdict.title).lower()


def test_live_source_window_follows_the_demo_phase(tmp_path: Path) -> None:
    """A PhaseInfo clips the window to the phase (frozen once the phase ended) and carries
    the phase's SLOs and window label to the snapshot."""
    from tui.sources import PhaseInfo

    cap = tmp_path / "live"
    cap.mkdir()
    now_s = 1_800_000_000.0
    info = {"v": PhaseInfo("1/4 healthy", now_s - 5, {"ttft_p99": 0.2}, None, "this phase")}
    src = LiveSource(cap, window_s=60, phase_fn=lambda: info["v"], clock_ns=lambda: int(now_s * 1e9))
    snap = src.poll()
    assert snap.window_ns == (int((now_s - 5) * 1e9), int(now_s * 1e9))
    assert snap.slo == {"ttft_p99": 0.2} and snap.window_label == "this phase" and snap.phase == "1/4 healthy"
    info["v"] = PhaseInfo("2/4 long prompts · starting", now_s - 20, None, now_s - 8, "last phase")
    snap = src.poll()
    assert snap.window_ns == (int((now_s - 20) * 1e9), int((now_s - 8) * 1e9))
    info["v"] = "a plain label"
    snap = src.poll()
    assert snap.window_ns[1] - snap.window_ns[0] == 60 * 10**9 and snap.slo is None


def test_bucket_means_with_and_without_missing_values() -> None:
    import numpy as np

    t = np.array([0, 1, 2, 3, 8, 9], dtype="float64")
    b = model.Buckets(t, (0, 10), n=2)  # [0, 5) and [5, 10)
    assert b.agg(np.array([1, 2, 3, 4, 10, 20.0])) == [2.5, 15.0]
    assert b.agg(np.array([1, 2, 3, 4, 10, 20.0]), how="sum") == [10.0, 30.0]
    # a missing value is skipped, and does not disturb the counts reused by the next array
    assert b.agg(np.array([1, np.nan, np.nan, np.nan, 10, 20.0])) == [1.0, 15.0]
    assert b.agg(np.array([2, 2, 2, 2, 4, 6.0])) == [2.0, 5.0]
    # a time that is missing puts its value nowhere
    tb = model.Buckets(np.array([0, np.nan, 9.0]), (0, 10), n=2)
    assert tb.agg(np.array([1.0, 100.0, 3.0])) == [1.0, 3.0]
    empty = tb.agg(np.array([np.nan, np.nan, np.nan]))
    assert all(np.isnan(x) for x in empty)
