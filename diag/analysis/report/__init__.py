"""``ttft report``: one self-contained file a person takes in within a minute.

Front door: :func:`write_report` picks the format from the output suffix (``.html``, ``.md``,
``.json``). Behind it: :mod:`~diag.analysis.report.gather` collects what a report shows from an analysis
and its :class:`rules.Diagnosis` (:func:`build_report` -> :class:`ReportData`); the writers
only lay it out: :mod:`~diag.analysis.report.html` (jinja2 templates with autoescape),
:mod:`~diag.analysis.report.markdown`, :mod:`~diag.analysis.report.jsondoc`; :mod:`~diag.analysis.report.text` is
``ttft analyze``'s text. Charts come from :mod:`~diag.analysis.report.svg`, the numbers behind them from
:mod:`~diag.analysis.report.summary`, and ``ttft diff`` lives in :mod:`~diag.analysis.report.diff`. Every number
is formatted by :mod:`diag.ground.units`; an evidence row reads the same in every writer
(:mod:`~diag.analysis.report.cells`).

Order of the HTML (and Markdown): the verdict with its evidence, confidence, time explained
and what to check next; the SLO table when SLOs were given; the other findings and the
skipped rules; latency percentiles; the stage waterfall; TTFT against prompt length and
against in-flight requests; the device-busy / KV-usage / queue timelines; what the capture holds.

Security: every string that came from a trace or a capture is escaped by the writer (jinja2
autoescape for HTML, the SVG builder for chart text, :func:`md_esc` for Markdown). The HTML
carries a Content-Security-Policy that forbids scripts and any network load, and has no
external references: it opens offline.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from diag.analysis import Analysis
from diag.ground.capture import CaptureError
from diag.analysis.report.gather import ReportData, build_report
from diag.analysis.report.html import STAGE_COLORS, render_html
from diag.analysis.report.jsondoc import render_json
from diag.analysis.report.markdown import md_esc, render_markdown
from diag.analysis.report.summary import SLOResult


FORMATS: dict[str, str] = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown", ".json": "json"}


class ReportError(CaptureError):
    """A report that cannot be written (bad suffix, unwritable path): one line, exit code 2."""


@dataclass
class ReportResult:
    """Where the report went, in which format, the one-line verdict and the SLO results."""

    path: Path
    format: str
    verdict_line: str
    slo: list[SLOResult] = field(default_factory=list)

    @property
    def slo_ok(self) -> bool:
        """True when every SLO passed (or none was given)."""
        return all(r.passed for r in self.slo)


def report_format(path: str | os.PathLike[str]) -> str:
    """The format for an output path, from its suffix; ReportError for anything else."""
    suffix = Path(path).suffix.lower()
    fmt = FORMATS.get(suffix)
    if fmt is None:
        raise ReportError(f"{path}: unknown report format {suffix or '(no suffix)'!r}; use .html, .md or .json")
    return fmt


_WRITERS = {"html": render_html, "markdown": render_markdown, "json": render_json}


def write_report(analysis: Analysis, path: str | os.PathLike[str], slo: Mapping[str, float] | None = None,
                 title: str | None = None) -> ReportResult:
    """Write the report for ``analysis`` to ``path`` (.html, .md or .json) and return what happened.

    The file is written to a temporary name and moved into place, so a reader never sees half a
    report. Raises :class:`ReportError` for a bad suffix or an unwritable path.
    """
    fmt = report_format(path)
    data = build_report(analysis, slo, title)
    text = _WRITERS[fmt](data)
    out = Path(path)
    try:
        if out.parent and not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        raise ReportError(f"{out}: cannot write report: {exc.strerror or exc}") from exc
    return ReportResult(out, fmt, data.verdict_line, data.slo)


__all__ = ["ReportError", "ReportResult", "ReportData", "build_report", "write_report", "render_html",
           "render_markdown", "render_json", "report_format", "md_esc", "STAGE_COLORS"]
