"""``ttft report`` and the front door diag.analysis.report.write_report: formats, edge captures, the SLO gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from diag.cli import main
from diag.analysis.report import ReportError, build_report, render_markdown, write_report
from support.reportkit import analysis_of, check_html
from support.report_workload import Workload, write_capture


def test_report_empty_and_edge_captures(tmp_path: Path) -> None:
    # all requests failed
    failed = write_capture(tmp_path / "failed", Workload(n=5, error=lambda i: "http_503"))
    out = tmp_path / "f.html"
    res = write_report(analysis_of(failed), out, slo={"ttft_p99": 1.0})
    html = out.read_text()
    check_html(html)
    assert not res.slo_ok and "no data" in res.slo[0].detail
    assert "http_503" in html
    # client-only capture, no stage spans
    client = write_capture(tmp_path / "client", Workload(n=8, side="client", stage_spans=False, steps=False))
    out = tmp_path / "c.html"
    write_report(analysis_of(client), out)
    html = out.read_text()
    check_html(html)
    assert "No stage spans" in html
    # a single request
    one = write_capture(tmp_path / "one", Workload(n=1))
    for suffix in (".html", ".md", ".json"):
        write_report(analysis_of(one), tmp_path / f"one{suffix}")
    check_html((tmp_path / "one.html").read_text())
    # an empty capture (meta only)
    empty = tmp_path / "empty"
    from diag.ground.capture import CaptureWriter

    CaptureWriter(empty).close()
    for suffix in (".html", ".md", ".json"):
        write_report(analysis_of(empty), tmp_path / f"empty{suffix}")
    check_html((tmp_path / "empty.html").read_text())
    json.loads((tmp_path / "empty.json").read_text())


def test_bad_suffix_is_a_one_line_error(cap: Path, tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"unknown report format '\.txt'"):
        write_report(analysis_of(cap), tmp_path / "r.txt")


def test_command_slo_gate_exit_codes(cap: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(cap), "-o", str(out), "--slo", "ttft_p99=10s,itl_p99=1s"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(f"report written to {out} (html); ") and ("verdict" in line)
    assert main(["report", str(cap), "-o", str(out), "--slo", "ttft_p99=1ms"]) == 1
    captured = capsys.readouterr()
    assert "SLO broken: ttft_p99" in captured.err
    assert "FAIL" in out.read_text()
    # usage errors: exit 2, one line
    assert main(["report", str(cap), "-o", str(tmp_path / "r.pdf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown report format" in err[0]
    assert main(["report", str(cap), "-o", str(out), "--slo", "ttft=2s"]) == 2
    assert main(["report", str(tmp_path / "nope"), "-o", str(out)]) == 2
    # no SLO: exit 0
    assert main(["report", str(cap), "-o", str(tmp_path / "r.md")]) == 0
    assert main(["report", str(cap), "-o", str(tmp_path / "r.json")]) == 0
    json.loads((tmp_path / "r.json").read_text())


def test_report_with_the_real_rule_engine(cap: Path, tmp_path: Path) -> None:
    a = analyze_paths([cap], slo={"ttft_p99": 10.0})
    assert a.diagnosis is not None
    out = tmp_path / "r.html"
    res = write_report(a, out, slo={"ttft_p99": 10.0})
    html = out.read_text()
    check_html(html)
    assert res.verdict_line.startswith("verdict: " + a.diagnosis.verdict.category)
    assert html.index(a.diagnosis.verdict.category) < html.index('id="latency"')
    md = render_markdown(build_report(a, {"ttft_p99": 10.0}))
    assert "## Verdict" in md
