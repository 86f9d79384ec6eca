"""diag.analysis.report.text: ``ttft analyze``'s text, and the same evidence row in text, Markdown, HTML and TUI."""

from __future__ import annotations

from pathlib import Path

from diag.analysis.report import write_report
from diag.analysis.report.cells import evidence_cells
from diag.analysis.report.text import format_diagnosis
from support.reportkit import analysis_of, check_html
from rules import Evidence, Skipped
from rules.features import Feature
from tui.model import verdict_vm
from support.report_workload import diagnosis_of, finding, sample_diagnosis


def test_format_diagnosis_lays_out_verdict_others_notes_and_skipped() -> None:
    v = finding("queue", "Requests wait", 0.82, [Evidence("queue share", 0.6, 0.3, "share", "waiting", ">=", True),
                                                Evidence("busy", 0.96, None, "share", "context")],
                ["check the scheduler"], explained_s=0.0099, explained_pct=41.0, note="a note")
    other = finding("decode", "Slow tokens", 0.4, explained_s=None, explained_pct=None)
    d = diagnosis_of(v, [other], [Skipped("comm", "skipped: needs comm spans")],
                     {"ttft_p95_s": Feature("ttft_p95_s", 0.024, "s", True)})
    d.notes.append("cold start reported apart")
    lines = format_diagnosis(d).splitlines()
    assert lines[0] == "verdict: queue (confidence 82%) - Requests wait"
    assert lines[1] == "  explains 9.9 ms (41% of TTFT p95 24.0 ms)"
    assert "  note: a note" in lines and "  evidence:" in lines and "    - check the scheduler" in lines
    row = next(ln for ln in lines if "queue share" in ln)
    assert row.split() == ["queue", "share", "60%", "(threshold", "≥", "30%,", "✓", "crossed)", "waiting"]
    ctx = next(ln for ln in lines if ln.strip().startswith("busy"))
    assert "threshold" not in ctx and "crossed" not in ctx and "96%" in ctx
    assert "  2. decode (confidence 40%) - Slow tokens" in lines
    assert "note: cold start reported apart" in lines
    # people get one line naming the rules that could not run; -v gives engineers what each needed
    assert "1 rule could not run on this capture (comm): -v lists what each needs" in lines
    assert not any("needs comm spans" in ln for ln in lines)
    verbose = format_diagnosis(d, verbose=True).splitlines()
    assert "skipped rules:" in verbose
    assert any(ln.startswith("  comm") and "needs comm spans" in ln for ln in verbose)


def test_a_metrics_only_capture_gets_a_footer_that_fits_it(tmp_path: Path) -> None:
    import pandas as pd

    from diag.ground import stages as S
    from diag.analysis import analyze_paths
    from diag.ground.capture import CaptureWriter
    from diag.analysis.report.text import format_analysis

    rows = [(1000.0 + 5 * k, "prometheus", name, ent, v) for k in range(1, 7) for ent in ("a:1", "b:1")
            for name, v in ((S.SERIES_REQUESTS_PER_S, 2.0), (S.SERIES_TTFT_S, 0.4), ("ttft_s_p95", 0.9),
                            (S.SERIES_QUEUE_TIME_S, 0.3), (S.SERIES_PREFILL_TIME_S, 0.05))]
    with CaptureWriter(tmp_path / "m", meta={"command": "test"}) as w:
        w.write_series("prometheus", pd.DataFrame(rows, columns=list(S.SERIES_COLUMNS)))
    text = format_analysis(analyze_paths([tmp_path / "m"]))
    assert "TTFT over 0 requests" not in text and "no stage spans" not in text
    assert "engine metrics only (prometheus): 6 scrapes over 25.0 s from 2 replicas" in text
    assert "p95 900.0 ms" in text


def test_no_data_verdict_text_starts_with_the_category() -> None:
    d = diagnosis_of(finding("no_data", "No completed requests", 0.0, [], [], None, None))
    assert format_diagnosis(d).startswith("verdict: no_data (confidence 0.0%)")


def test_the_same_evidence_row_reads_the_same_everywhere(cap: Path, tmp_path: Path) -> None:
    d = sample_diagnosis()
    a = analysis_of(cap, d)
    write_report(a, tmp_path / "r.md")
    write_report(a, tmp_path / "r.html")
    md = (tmp_path / "r.md").read_text()
    body = "".join(check_html((tmp_path / "r.html").read_text()).text)
    text = format_diagnosis(d)
    tui = {e.name: e for e in verdict_vm(d).evidence}
    for e in d.verdict.evidence:
        c = evidence_cells(e)
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(c.name))
        assert c.value in line and (not c.threshold or c.threshold in line) and c.mark in line
        assert f"| {c.value} | {(c.threshold or '-').replace('<', chr(92) + '<')} | {c.mark} |" in md
        assert f"{c.name}{c.value}{c.threshold or '-'}{c.mark}" in body
        t = tui[c.name]
        assert (t.value, t.threshold, t.mark) == (c.value, c.threshold, c.mark)
