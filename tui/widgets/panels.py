"""The dashboard's building blocks: the :class:`Panel` base (holds the view-model part it was last
given, ``show(vm)``, and renders it at its current width), the status bar, and the stage and
category colours the panels share. The panels themselves: :mod:`tui.widgets.verdict`,
:mod:`tui.widgets.metrics`, :mod:`tui.widgets.slowest`. UI thread only.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import RenderResult
from textual.widget import Widget

from diag.ground import stages
from diag.ground.units import fmt_s
from tui.viewmodels import ViewModel


#: one colour per stage, used by the stacked bar, its legend and the waterfall
STAGE_COLORS: dict[str, str] = {
    stages.TOKENIZE: "magenta",
    stages.QUEUE: "red",
    stages.PREFILL: "blue",
    stages.COMM: "yellow",
    stages.SAMPLE: "cyan",
    stages.DETOKENIZE: "green",
    stages.LUMPED: "bright_black",
    stages.NETWORK: "white",
    stages.DECODE: "bright_blue",
}

CATEGORY_STYLE = {"healthy": "bold green", "no_data": "dim", "inconclusive": "bold yellow", "failures": "bold red"}


def conf_style(conf: float) -> str:
    """The rich style of a confidence 0..1 (red from 0.7, yellow from 0.4)."""
    return "bold red" if conf >= 0.7 else "bold yellow" if conf >= 0.4 else "bold"


class Panel(Widget, can_focus=True):
    """A bordered, focusable panel (tab moves between panels)."""

    DEFAULT_CSS = """
    Panel {
        border: round $primary 40%;
        padding: 0 1;
        height: 1fr;
    }
    Panel:focus {
        border: round $accent;
    }
    """

    def __init__(self, title: str, *, id: str | None = None, compact: bool = False) -> None:
        super().__init__(id=id)
        self.border_title = title
        #: the compact layout (:mod:`tui.layout`): fewer lines, no sparklines
        self.compact = compact
        self._vm: Any = None

    def show(self, vm: Any) -> None:
        """Keep ``vm`` and repaint (UI thread); skips an unchanged view model, and re-lays the
        screen out only when the panel's height may change (``_shape``)."""
        if vm == self._vm:
            return
        relayout = self._shape(vm) != self._shape(self._vm)
        self._vm = vm
        self.refresh(layout=relayout)

    def _shape(self, vm: Any) -> Any:
        """What decides this panel's height (its line count); panels of fixed height: None."""
        return None

    @property
    def inner_width(self) -> int:
        return max(10, self.content_size.width)


#: one unbreakable item of a :func:`flow` line: (text, style) segments
Item = list[tuple[str, str]]


def flow(groups: list[list[Item]], width: int, gap: int = 2) -> Text:
    """Lay out items left to right, ``gap`` spaces apart, starting a new line before an item
    that would cross ``width`` (cells) and at the start of each group; an item never breaks
    inside unless it alone is wider than ``width``. The numbers' lines of every panel."""
    t = Text()
    for g, items in enumerate(groups):
        if g:
            t.append("\n")
        col = 0
        for item in items:
            n = sum(len(text) for text, _ in item)
            if col and col + gap + n > width:
                t.append("\n")
                col = 0
            elif col:
                t.append(" " * gap)
                col += gap
            for text, style in item:
                t.append(text, style=style)
            col += n
    return t


class StatusBar(Widget):
    """The top line: source, phase, window, request count, live/paused state, frame time."""

    DEFAULT_CSS = """
    StatusBar { height: auto; background: $panel; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.vm: ViewModel | None = None
        self.paused = False
        self.loading = True
        self.message = ""

    def show(self, vm: ViewModel | None, paused: bool, message: str = "") -> None:
        def lines(v: ViewModel | None, msg: str) -> tuple[int, int, bool]:
            return (len(v.errors) if v else 0, min(4, len(v.notes)) if v else 0, bool(msg))

        relayout = lines(vm, message) != lines(self.vm, self.message)
        self.vm = vm
        self.paused = paused
        self.message = message
        self.loading = vm is None
        self.refresh(layout=relayout)

    def render(self) -> RenderResult:
        t = Text(no_wrap=False)
        vm = self.vm
        if vm is None:
            t.append("ttft-diag ", style="bold")
            t.append(self.message or "loading…", style="italic")
            return t
        t.append(vm.title, style="bold")
        if vm.phase:
            t.append("  phase: ", style="dim")
            t.append(vm.phase, style="bold magenta")
        lo, hi = vm.window_ns
        width_s = (hi - lo) / 1e9
        t.append("  window ", style="dim")
        if vm.window_label:
            t.append(f"{vm.window_label} ({fmt_s(width_s)})")
        elif vm.whole:
            t.append(f"whole capture ({fmt_s(width_s)})")
        elif vm.live:
            t.append(f"last {fmt_s(width_s)}")
        else:
            off = (lo - vm.extent_ns[0]) / 1e9
            total = (vm.extent_ns[1] - vm.extent_ns[0]) / 1e9
            t.append(f"+{fmt_s(max(off, 0))}…+{fmt_s(off + width_s)} of {fmt_s(total)}")
        t.append(f"  {vm.latency.requests} req", style="dim")
        if vm.latency.errors:
            t.append(f" ({vm.latency.errors} errors)", style="red")
        if vm.latency.over_context:
            t.append(f" ({vm.latency.over_context} past the context limit)", style="dim")
        t.append("  ")
        if self.paused:
            t.append(" PAUSED ", style="bold black on yellow")
        elif vm.live:
            t.append(" LIVE ", style="bold black on green")
        else:
            t.append(" CAPTURE ", style="bold black on blue")
        t.append(f"  frame {fmt_s(vm.timings_ms.get('total', 0) / 1e3)}", style="dim")
        if vm.verdict.rules_ms is not None:
            t.append(f" · rules {fmt_s(vm.verdict.rules_ms / 1e3)}", style="dim")
        t.append("  " + time.strftime("%H:%M:%S"), style="dim")
        if self.message:
            t.append("\n" + self.message, style="italic cyan")
        for e in vm.errors:
            t.append("\n✖ " + e, style="bold white on red")
        for n in vm.notes[:4]:
            t.append("\n• " + n, style="yellow")
        return t
