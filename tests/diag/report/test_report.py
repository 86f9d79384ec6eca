"""``ttft report``: HTML/Markdown/JSON reports from captures written through the span helpers."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from diag.analysis import analyze_paths
from diag.cli import main
from diag.report import ReportError, build_report, md_esc, render_markdown, write_report
from workload import EVIL, Workload, sample_diagnosis, write_capture

# --- well-formedness ------------------------------------------------------------------------

VOID = {"meta", "br", "img", "hr", "input", "link", "source", "wbr", "area", "base", "col", "embed", "param", "track"}


class TagChecker(HTMLParser):
    """Checks that every element is closed in order; records tags and script/URL uses."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[str] = []
        self.attr_urls: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href", "xlink:href", "action") or (v and "url(" in v and "url(#" not in v):
                self.attr_urls.append(f"{k}={v}")
            if k.startswith("on"):
                self.errors.append(f"event handler attribute {k}")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> does not close <{self.stack[-1] if self.stack else '-'}>")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def check_html(text: str) -> TagChecker:
    p = TagChecker()
    p.feed(text)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed: {p.stack}"
    return p


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def cap(tmp_path: Path) -> Path:
    return write_capture(tmp_path / "cap")


@pytest.fixture
def evil_cap(tmp_path: Path) -> Path:
    w = Workload(
        n=12,
        service=f"svc{EVIL}",
        model=f'tiny"><script>alert(2)</script>',
        request_id=lambda i: f"{EVIL}-{i}" if i % 2 else f"<img src=x onerror=alert({i})>",
        segment=lambda i: f"seg|{EVIL}" if i < 6 else "c=8 | `x` [y](http://evil.example)",
        error=lambda i: f"<b>boom</b>{EVIL}" if i == 3 else None,
    )
    return write_capture(tmp_path / "evil", w)


def _analysis(path: Path, diagnosis: Any = "none") -> Any:
    a = analyze_paths([path], run_rules=False)
    if diagnosis != "none":
        a.diagnosis = diagnosis
    return a


# --- HTML -----------------------------------------------------------------------------------


def test_html_without_rules_is_decomposition_only(cap: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = write_report(_analysis(cap), out)
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
    res = write_report(_analysis(cap, sample_diagnosis()), out)
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
    assert "9.9 ms (41% of TTFT p95)" in body  # time explained, as diag.report.cells writes it
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
    write_report(_analysis(evil_cap, sample_diagnosis(EVIL)), out)
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


def test_report_empty_and_edge_captures(tmp_path: Path) -> None:
    # all requests failed
    failed = write_capture(tmp_path / "failed", Workload(n=5, error=lambda i: "http_503"))
    out = tmp_path / "f.html"
    res = write_report(_analysis(failed), out, slo={"ttft_p99": 1.0})
    html = out.read_text()
    check_html(html)
    assert not res.slo_ok and "no data" in res.slo[0].detail
    assert "http_503" in html
    # client-only capture, no stage spans
    client = write_capture(tmp_path / "client", Workload(n=8, side="client", stage_spans=False, steps=False))
    out = tmp_path / "c.html"
    write_report(_analysis(client), out)
    html = out.read_text()
    check_html(html)
    assert "No stage spans" in html
    # a single request
    one = write_capture(tmp_path / "one", Workload(n=1))
    for suffix in (".html", ".md", ".json"):
        write_report(_analysis(one), tmp_path / f"one{suffix}")
    check_html((tmp_path / "one.html").read_text())
    # an empty capture (meta only)
    empty = tmp_path / "empty"
    from diag.capture import CaptureWriter

    CaptureWriter(empty).close()
    for suffix in (".html", ".md", ".json"):
        write_report(_analysis(empty), tmp_path / f"empty{suffix}")
    check_html((tmp_path / "empty.html").read_text())
    json.loads((tmp_path / "empty.json").read_text())


def test_bad_suffix_is_a_one_line_error(cap: Path, tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"unknown report format '\.txt'"):
        write_report(_analysis(cap), tmp_path / "r.txt")


# --- Markdown and JSON ----------------------------------------------------------------------


def test_markdown_has_the_same_content(evil_cap: Path, cap: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    write_report(_analysis(cap, sample_diagnosis()), out, slo={"ttft_p99": 10.0, "itl_p50": 0.001})
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
    write_report(_analysis(evil_cap, sample_diagnosis(EVIL)), out2)
    md2 = out2.read_text()
    assert not re.search(r"(?<!\\)[<>]", md2)  # every angle bracket is backslash-escaped: no raw HTML
    assert "\\<script\\>alert(1)\\</script\\>" in md2
    assert "&lt;" not in md2 and "&amp;" not in md2  # no HTML entities in Markdown
    assert "seg\\|" in md2  # the pipe in the segment label is escaped
    for line in md2.splitlines():
        if line.startswith("| "):
            assert line.endswith(" |")
    assert md_esc("a|b\nc") == "a\\|b c"


def test_json_report(cap: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    write_report(_analysis(cap, sample_diagnosis()), out, slo={"ttft_p50": 1.0})
    doc = json.loads(out.read_text())
    assert doc["verdict"]["category"] == "queue"
    assert set(doc["percentiles"]) >= {"ttft_s", "itl_s", "tpot_s", "e2e_s"}
    assert doc["percentiles"]["itl_s"]["p50"] == pytest.approx(0.010, rel=1e-3)
    assert doc["slo"][0]["passed"] is True and doc["slo_passed"] is True
    assert "queue" in doc["stages"]
    assert doc["resources"]["device_busy_frac"] == pytest.approx(0.4, abs=0.02)
    # no rules: the decomposition alone
    out2 = tmp_path / "r2.json"
    write_report(_analysis(cap), out2)
    doc2 = json.loads(out2.read_text())
    assert "verdict" not in doc2 and doc2["requests"] == 40


# --- the command ----------------------------------------------------------------------------


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
    rules = pytest.importorskip("rules")
    if not hasattr(rules, "diagnose"):
        pytest.skip("rule engine not built yet")
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
