"""diag.analysis.report.html: the verdict first, every number through diag.ground.units, every trace string escaped by jinja2."""

from __future__ import annotations

import re
from pathlib import Path

from diag.analysis.report import write_report
from support.reportkit import analysis_of, check_html
from support.report_workload import EVIL, sample_diagnosis


def test_html_without_rules_is_decomposition_only(cap: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = write_report(analysis_of(cap), out)
    assert res.format == "html" and res.slo_ok
    assert "no verdict" in res.verdict_line and "queue" in res.verdict_line
    html = out.read_text()
    p = check_html(html)
    assert html.index('id="verdict"') < html.index('id="latency"') < html.index('id="stages"') < html.index('id="timelines"')
    assert "No verdict: stage decomposition only" in html
    assert p.tags.count("svg") >= 6  # histogram, stage bars, slowest, prompt, in-flight, timelines
    assert "<script" not in html and "http:" not in html and "https:" not in html
    assert not p.attr_urls
    assert "Content-Security-Policy" in html


def test_html_with_verdict_first_and_evidence(cap: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = write_report(analysis_of(cap, sample_diagnosis()), out)
    assert res.verdict_line.startswith("verdict: queue")
    html = out.read_text()
    p = check_html(html)
    body = "".join(p.text)
    # the verdict is the first thing after the title
    first = html.index('id="verdict"')
    for later in ('id="findings"', 'id="latency"', 'id="stages"', 'id="load"', 'id="timelines"', 'id="capture"'):
        assert first < html.index(later), later
    assert body.index("Requests wait for the scheduler") < body.index("Latency percentiles")
    assert "82%" in body  # confidence
    assert "9.9 ms (41% of TTFT p95)" in body  # time explained, as diag.analysis.report.cells writes it
    assert "queue share of TTFT (median)" in body and "60%" in body and "≥ 30%" in body  # evidence with threshold
    assert "✓ crossed" in body  # the crossed mark of a judged row
    assert "< 0.5" in body
    assert "What to check next" in body and "CPU profile of the serving process" in body
    assert "prefill_compute" in body  # other finding
    assert "needs comm spans" in body  # skipped rule
    assert "rules' fit: 0.02 ms/token" in body  # the fitted line from the feature
    assert "knee (where TTFT starts to climb) at 2 requests in flight" in body


def test_html_escapes_trace_strings(evil_cap: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    write_report(analysis_of(evil_cap, sample_diagnosis(EVIL)), out)
    html = out.read_text()
    p = check_html(html)
    assert "script" not in p.tags and "img" not in p.tags
    assert "<script" not in html.lower()
    assert "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    body = "".join(p.text)
    assert EVIL in body  # shown as text, not markup
    assert "svc<script>" in body  # service name
    assert 'tiny"><script>alert(2)</script>' in body  # model
    assert "<b>boom</b>" in body  # error kind
    # the only http in the document is the escaped segment label text
    for m in re.finditer(r"https?:", html):
        assert "evil.example" in html[m.start(): m.start() + 30]
    assert not p.attr_urls


def test_templates_autoescape_every_string(cap: Path, tmp_path: Path) -> None:
    """A rule's or a trace's text (title, evidence meaning, next check, note, skipped reason) is
    text in the page, never markup; the jinja2 environment escapes by default."""
    from diag.analysis.report.html import _env

    assert _env().autoescape is True
    out = tmp_path / "r.html"
    write_report(analysis_of(cap, sample_diagnosis(EVIL)), out)
    html = out.read_text()
    p = check_html(html)
    assert "script" not in p.tags and "<script" not in html
    body = "".join(p.text)
    for text in (f"Requests wait for the scheduler{EVIL}", f"most of TTFT is waiting{EVIL}",
                 f"CPU profile of the serving process{EVIL}", f"confidence lowered: no NVML{EVIL}",
                 f"needs comm spans (TP > 1){EVIL}"):
        assert text in body, text
