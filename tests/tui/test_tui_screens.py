"""``ttft view`` in a real terminal at 80×24, 120×40 and 160×48: tmux runs the command in a
detached session of that size (its own tmux server socket), ``capture-pane`` reads the screen.

What a user relies on at each size: which panels and numbers are on screen (the numbers are the
ones ``ttft analyze`` prints for the same captures), that no line runs past the screen or its
panel, and that the help modal fits whole. Slow: each session loads the capture and runs the
rules (~3-6 s on 2 shared cores).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from diag.analysis.report.cells import evidence_cells
from diag.ground.units import fmt_s

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run installs it)")]

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "samples" / "kv_cache"  # a directory of captures: client and server-0 joined
SPARK = "▁▂▃▄▅▆▇█"
CLOCK = re.compile(r"\d\d:\d\d:\d\d")


class Terminal:
    """One ``ttft view`` in a detached tmux session of a given size."""

    def __init__(self, columns: int, rows: int, args: list[str]) -> None:
        self.socket = f"ttft-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.columns, self.rows = columns, rows
        # COLUMNS/LINES from the test process would win over the pane's size (shutil.get_terminal_size)
        cmd = shlex.join(["env", "-u", "COLUMNS", "-u", "LINES", sys.executable, "-m", "diag", "view", *args])
        self.tmux("new-session", "-d", "-s", "view", "-x", str(columns), "-y", str(rows), cmd)

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                             text=True, timeout=20, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def screen(self) -> list[str]:
        """The visible lines, right-stripped."""
        return [ln.rstrip() for ln in self.tmux("capture-pane", "-p", "-t", "view").splitlines()]

    def wait_for(self, text: str, timeout_s: float = 40.0) -> list[str]:
        """The screen once ``text`` is on it and two captures 0.5 s apart agree (the clock aside)."""
        end = time.monotonic() + timeout_s
        last: list[str] | None = None
        while True:
            lines = self.screen()
            steady = [CLOCK.sub("", ln) for ln in lines]
            if any(text in ln for ln in lines) and steady == last:
                return lines
            last = steady
            if time.monotonic() > end:
                raise AssertionError(f"{text!r} never showed on a steady screen:\n" + "\n".join(lines))
            time.sleep(0.5)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "view", *keys)

    def resize(self, columns: int, rows: int) -> None:
        self.tmux("resize-window", "-t", "view", "-x", str(columns), "-y", str(rows))
        self.columns, self.rows = columns, rows

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)


@pytest.fixture
def terminal() -> Iterator[type[Terminal]]:
    opened: list[Terminal] = []

    class Opened(Terminal):
        def __init__(self, columns: int, rows: int, args: list[str]) -> None:
            super().__init__(columns, rows, args)
            opened.append(self)

    yield Opened
    for t in opened:
        t.close()


@pytest.fixture(scope="module")
def expected() -> dict[str, object]:
    """What ``ttft analyze`` says about the capture: the screen must say the same."""
    a = analyze_paths([CAPTURE])
    assert a.diagnosis is not None
    dec = a.decomposition
    return {"category": a.diagnosis.verdict.category,
            "evidence": [evidence_cells(e) for e in a.diagnosis.verdict.evidence],
            "ttft": [fmt_s(dec["ttft_s"][k]) for k in ("p50", "p95", "p99")]}


def assert_fits(lines: list[str], columns: int, rows: int) -> None:
    """Nothing runs past the screen or a panel: the footer is on the last line (the screen did
    not overflow into a scrollbar), every boxed panel line closes its box, no scrollbar thumb."""
    assert len(lines) <= rows and all(len(ln) <= columns for ln in lines)
    assert "q quit" in lines[-1], "the footer is not on the last line:\n" + "\n".join(lines)
    for ln in lines:
        assert not re.search(f"[{SPARK}]{{2}}$", ln), f"a scrollbar: the screen overflowed: {ln!r}"
        if ln[:1] in ("╭", "│", "╰"):  # a line of boxed panels: each box closes on it
            assert ln[-1] in "│╮╯" and ln.count("╭") == ln.count("╮") and ln.count("╰") == ln.count("╯"), \
                f"a panel cut at the screen's edge: {ln!r}"


def assert_numbers(lines: list[str], expected: dict[str, object], rows_shown: int) -> None:
    """The verdict, its first ``rows_shown`` evidence rows (name, value, threshold, mark on one
    line each) and TTFT p50/p95/p99, as ``ttft analyze`` prints them."""
    text = "\n".join(lines)
    assert str(expected["category"]) in text
    for cell in expected["evidence"][:rows_shown]:  # type: ignore[index]
        row = [ln for ln in lines if cell.name in ln]
        assert row, f"evidence {cell.name!r} not on one line:\n{text}"
        assert cell.value in row[0] and cell.threshold in row[0] and cell.mark.split(",")[0] in row[0], row[0]
    for label, value in zip(("p50", "p95", "p99"), expected["ttft"]):  # type: ignore[arg-type]
        assert f"{label} {value}" in text, (label, value)


def assert_help_whole(lines: list[str]) -> None:
    """The help modal's box with its first and last lines of text, nothing scrolled away."""
    text = "\n".join(lines)
    assert "why is time-to-first-token high?" in text and "picks by terminal size" in text, text
    top = [ln for ln in lines if "╭" in ln and "╮" in ln]
    bottom = [ln for ln in lines if "╰" in ln and "╯" in ln]
    assert top and bottom, text


def test_80x24_compact_shows_verdict_numbers_stages_and_busy(terminal: type[Terminal], expected: dict) -> None:
    t = terminal(80, 24, [str(CAPTURE)])
    lines = t.wait_for("confidence")
    assert_fits(lines, 80, 24)
    assert_numbers(lines, expected, rows_shown=4)
    text = "\n".join(lines)
    for label in ("─verdict", "─latency", "─throughput", "─TTFT by stage", "engine busy",  # panels
                  "ITL", "tokens/s", "requests/s", "running", "waiting", "KV", "busy", "steps/s",
                  "■ queue", "■ prefill", "check next"):
        assert label in text, f"{label!r} not on the 80x24 screen:\n{text}"
    assert "slowest requests" not in text  # the compact layout leaves the table to larger screens
    t.keys("?")
    assert_help_whole(t.wait_for("keys"))


def test_120x40_medium_shows_every_panel(terminal: type[Terminal], expected: dict) -> None:
    t = terminal(120, 40, [str(CAPTURE / "client"), str(CAPTURE / "server-0")])  # two captures, joined
    lines = t.wait_for("confidence")
    assert_fits(lines, 120, 40)
    assert_numbers(lines, expected, rows_shown=len(expected["evidence"]))
    text = "\n".join(lines)
    for title in ("verdict", "latency", "TTFT by stage", "throughput · batch · KV cache",
                  "slowest requests", "engine busy timeline"):
        assert f"─ {title}" in text, f"panel {title!r} not on the 120x40 screen:\n{text}"
    assert sum(1 for ln in lines if re.match(r"│ \d+(\.\d+)? (ms|s) ", ln)) >= 3  # rows of the slowest table


def test_160x48_full_then_resized_to_80x24(terminal: type[Terminal], expected: dict) -> None:
    t = terminal(160, 48, [str(CAPTURE), "--layout", "auto"])
    lines = t.wait_for("confidence")
    assert_fits(lines, 160, 48)
    assert_numbers(lines, expected, rows_shown=len(expected["evidence"]))
    text = "\n".join(lines)
    assert "new requests wait for free KV blocks" in text  # the evidence's meaning column, at this width
    assert sum(1 for ln in lines if re.match(r"│ \d+(\.\d+)? (ms|s) ", ln)) >= 10
    t.keys("?")
    lines = t.wait_for("keys")
    assert_help_whole(lines)
    t.keys("Escape")
    t.resize(80, 24)  # auto: the compact layout, with the last frame, at once
    lines = t.wait_for("─verdict")
    assert_fits(lines, 80, 24)
    assert_numbers(lines, expected, rows_shown=4)
