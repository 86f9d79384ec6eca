"""The dashboard over a whole capture shows the numbers ``ttft analyze`` prints for it.

Issue 16: "time with KV usage near capacity" read 60% in ``ttft view`` and 55% in ``ttft analyze``
for ``samples/external/vllm/capture``. The TUI gave the rules the capture cut to a window ending
one nanosecond past its last timestamp, which float64 seconds round back onto that timestamp, so
the last /metrics sample (and, for float ``start_ns`` columns, the last request) fell out; and it
did not take the SLO the capture records. The whole-capture view now hands the rules the tables
as they are, with the same SLO, and the panels the same rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from diag.ground.capture import CaptureError
from diag.analysis.report.cells import evidence_cells
from diag.ground.units import fmt_s
from tui import model
from tui.sources import open_capture_source

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


@pytest.mark.parametrize("capture", [
    "external/vllm/capture",  # the capture: /metrics series only (55% in both, not 60% here)
    "kv_cache",  # a directory of captures: client and server joined by trace id
    "decode/client",  # a capture that records its SLO: the rules hold it in both
    "external/vllm",  # float start_ns: the last request was left out of the panels (104 of 105)
])
def test_whole_capture_view_shows_what_analyze_prints(capture: str) -> None:
    path = SAMPLES / capture
    analysis = analyze_paths([path])
    vm = model.build_view_model_with_rules(open_capture_source(path).poll())
    want, got = analysis.diagnosis, vm.diagnosis
    assert want is not None and got is not None
    assert got.verdict.category == want.verdict.category
    assert got.verdict.confidence == pytest.approx(want.verdict.confidence)
    # every finding's evidence, as every renderer prints it (the TUI shows the verdict's first six)
    assert [[evidence_cells(e) for e in f.evidence] for f in got.findings] == \
        [[evidence_cells(e) for e in f.evidence] for f in want.findings]
    assert [(e.name, e.value, e.threshold, e.mark) for e in vm.verdict.evidence] == \
        [(c.name, c.value, c.threshold, c.mark) for c in map(evidence_cells, want.verdict.evidence[:6])]
    dec = analysis.decomposition
    assert vm.latency.requests == dec["requests"]
    shown = [fmt_s(x) for x in (vm.latency.ttft_p50_s, vm.latency.ttft_p95_s, vm.latency.ttft_p99_s)]
    assert shown == [fmt_s(dec["ttft_s"][k]) for k in ("p50", "p95", "p99")]
    shares = {s.stage: s.share for s in vm.stages.stages}
    for stage, row in dec["stages"].items():
        if row.get("share_of_ttft") is not None and stage in shares:
            assert shares[stage] == pytest.approx(row["share_of_ttft"], abs=1e-9), stage


def test_view_source_joins_a_directory_of_captures() -> None:
    src = open_capture_source(SAMPLES / "interference")
    assert [p.name for p in src.paths] == ["client", "server-0"]
    snap = src.poll()
    vm = model.build_view_model_with_rules(snap)
    # joined: client TTFT, and the network stage (client TTFT - server TTFT) exists only then
    assert vm.latency.side == "client" and "network" in {s.stage for s in vm.stages.stages}
    assert vm.verdict.category == "interference"


def test_view_source_names_what_is_not_a_capture(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CaptureError, match="not a capture"):
        open_capture_source([SAMPLES / "kv_cache" / "client", tmp_path / "empty"])
    with pytest.raises(CaptureError, match="no such capture"):
        open_capture_source(tmp_path / "missing")
