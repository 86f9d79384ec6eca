"""diag.analysis.report.markdown: the same content as the HTML, backslash-escaped, no HTML entities."""

from __future__ import annotations

import re
from pathlib import Path

from diag.analysis.report import md_esc, write_report
from support.reportkit import analysis_of
from support.report_workload import EVIL, sample_diagnosis


def test_markdown_has_the_same_content(evil_cap: Path, cap: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    write_report(analysis_of(cap, sample_diagnosis()), out, slo={"ttft_p99": 10.0, "itl_p50": 0.001})
    md = out.read_text()
    assert md.splitlines()[2].startswith("40 requests")
    order = ["## Verdict", "## SLOs", "## Other findings", "## Latency percentiles", "## Where TTFT goes",
             "## TTFT against prompt length", "## Device, KV cache and queue", "## The capture"]
    idx = [md.index(h) for h in order]
    assert idx == sorted(idx)
    assert "| evidence | value | threshold | crossed | what it means |" in md
    assert "| queue share of TTFT (median) | 60% | ≥ 30% | ✓ crossed | most of TTFT is waiting |" in md
    assert "1 of 2 broken" in md and "FAIL" in md
    assert any(ch in md for ch in "▁▂▃▄▅▆▇█")  # sparklines for the timelines
    # escaping: a trace string cannot break a table or inject markup
    out2 = tmp_path / "evil.md"
    write_report(analysis_of(evil_cap, sample_diagnosis(EVIL)), out2)
    md2 = out2.read_text()
    assert not re.search(r"(?<!\\)[<>]", md2)  # every angle bracket is backslash-escaped: no raw HTML
    assert "\\<script\\>alert(1)\\</script\\>" in md2
    assert "&lt;" not in md2 and "&amp;" not in md2  # no HTML entities in Markdown
    assert "seg\\|" in md2  # the pipe in the segment label is escaped
    for line in md2.splitlines():
        if line.startswith("| "):
            assert line.endswith(" |")
    assert md_esc("a|b\nc") == "a\\|b c"
