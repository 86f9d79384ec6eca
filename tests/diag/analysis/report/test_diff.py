"""``ttft diff A B``: what changed between two captures and which finding explains it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from diag.cli import main
from diag.analysis.report.diff import diff_analyses
from rules import Diagnosis, Evidence, Skipped
from support.report_workload import Workload, diagnosis_of, finding, write_capture


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_capture(tmp_path / "a", Workload())


def _a(path: Path):
    return analyze_paths([path], run_rules=False)


def _diag(category: str, title: str, conf: float = 0.8) -> Diagnosis:
    f = finding(category, title, conf, [Evidence("x", 1.0, 0.5, "share", "m", ">=", True)], ["check"])
    return diagnosis_of(f, skipped=[Skipped("comm", "needs TP")])


def test_diff_names_the_grown_queue_stage(base: Path, tmp_path: Path) -> None:
    b = write_capture(tmp_path / "b", Workload(queue_ms=40))
    r = diff_analyses(_a(base), _a(b))
    assert r.direction == "grew" and r.moved == "queue"
    assert r.owner_categories[0] == "queue"
    assert r.moved_delta_s == pytest.approx(0.070, rel=0.05)  # mean queue 10ms -> 80ms
    text = r.format_text()
    assert "queue grew most" in text
    assert "rule engine did not run" in text
    m = r.metric("TTFT p50")
    assert m is not None and m.b > m.a
    qs = next(s for s in r.stages if s.stage == "queue")
    assert qs.share_b > qs.share_a


def test_diff_names_prefill_and_matches_the_finding(base: Path, tmp_path: Path) -> None:
    b = write_capture(tmp_path / "b", Workload(prefill_ms_per_token=0.2))
    aa, bb = _a(base), _a(b)
    aa.diagnosis = _diag("queue", "Requests wait for the scheduler")
    bb.diagnosis = _diag("prefill_compute", "Prefill compute dominates")
    r = diff_analyses(aa, bb)
    assert r.moved == "prefill"
    assert r.explaining is not None and r.explaining.category == "prefill_compute"
    assert r.explaining_side == "b" and r.explaining_new is True
    assert r.verdict_changed
    text = r.format_text()
    assert "prefill grew most" in text
    assert "Explained by B's finding [prefill_compute] Prefill compute dominates" in text
    assert "Verdict changed: queue -> prefill_compute" in text
    d = r.to_dict()
    assert d["moved"] == "prefill" and d["explained_by"]["category"] == "prefill_compute"
    json.dumps(d, allow_nan=False)


def test_diff_improvement_points_at_as_finding(base: Path, tmp_path: Path) -> None:
    worse = write_capture(tmp_path / "w", Workload(queue_ms=40))
    aa, bb = _a(worse), _a(base)
    aa.diagnosis = _diag("queue", "Requests wait for the scheduler")
    bb.diagnosis = _diag("healthy", "Within SLO")
    r = diff_analyses(aa, bb)
    assert r.direction == "shrank" and r.moved == "queue"
    assert r.explaining is not None and r.explaining_side == "a" and r.explaining.category == "queue"
    assert "gone in B" in r.format_text()


def test_diff_itl_only_change_is_decode(base: Path, tmp_path: Path) -> None:
    b = write_capture(tmp_path / "b", Workload(itl_ms=30))
    r = diff_analyses(_a(base), _a(b))
    assert r.moved == "itl" and r.owner_categories[0] == "decode"
    assert "ITL grew" in r.format_text()


def test_diff_unchanged(base: Path, tmp_path: Path) -> None:
    b = write_capture(tmp_path / "b", Workload())
    r = diff_analyses(_a(base), _a(b))
    assert r.direction == "unchanged" and r.moved is None
    assert "No material change" in r.format_text()


def test_diff_command_text_and_json(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = write_capture(tmp_path / "b", Workload(queue_ms=40))
    assert main(["diff", str(base), str(b)]) == 0
    out = capsys.readouterr().out
    assert "queue grew most" in out and "TTFT p50" in out
    assert main(["diff", str(base), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["moved"] == "queue" and doc["ttft"] == "grew"
    assert doc["metrics"]["TTFT p50"]["delta"] > 0
    assert "queue" in doc["stages"]
    assert main(["diff", str(base), str(tmp_path / "missing")]) == 2


def test_diff_with_the_real_rule_engine(base: Path, tmp_path: Path) -> None:
    b = write_capture(tmp_path / "b", Workload(queue_ms=40))
    r = diff_analyses(analyze_paths([base]), analyze_paths([b]))
    assert r.verdict_a is not None and r.verdict_b is not None
    assert r.moved == "queue"
    d = r.to_dict()
    assert d["verdict_b"]["category"] == r.verdict_b.category
    text = r.format_text()
    assert "rule engine did not run" not in text
    assert ("Explained by" in text) or ("No queue/kv_cache finding" in text)


def test_diff_sides_join_client_and_server_captures(capsys: pytest.CaptureFixture[str]) -> None:
    """Each side may be client,server captures joined by trace id: the server's stages show,
    which the client captures alone cannot."""
    root = Path(__file__).resolve().parents[4] / "samples"
    a = f"{root / 'interference' / 'client'},{root / 'interference' / 'server-0'}"
    b = f"{root / 'interference_chunked' / 'client'},{root / 'interference_chunked' / 'server-0'}"
    assert main(["diff", a, b, "--json"]) == 0
    joined = json.loads(capsys.readouterr().out)
    assert {"prefill", "queue"} <= set(joined["stages"])
    assert joined["verdict_a"]["category"] == "interference" and joined["verdict_b"]["category"] == "healthy"
    assert main(["diff", str(root / "interference" / "client"), str(root / "interference_chunked" / "client"), "--json"]) == 0
    client_only = json.loads(capsys.readouterr().out)
    assert not client_only["stages"]
    assert main(["diff", f"{a},{root / 'missing'}", b]) == 2
