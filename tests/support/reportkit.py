"""Helpers of the report tests: an HTML well-formedness checker and an analysis with a chosen diagnosis."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from diag.analysis import Analysis, analyze_paths
from rules import Diagnosis

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


def analysis_of(path: Path, diagnosis: Diagnosis | None = None) -> Analysis:
    """The capture's analysis without running the rules, with ``diagnosis`` as its verdict."""
    a = analyze_paths([path], run_rules=False)
    a.diagnosis = diagnosis
    return a
