"""The verdict panel: the rules' verdict, its evidence rows (as every renderer shows them), next checks
and the other findings. UI thread only.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import RenderResult

from diag.analysis.report.cells import fmt_confidence
from tui.viewmodels import VerdictVM
from tui.widgets.panels import CATEGORY_STYLE, Panel, conf_style


class VerdictPanel(Panel):
    """The top finding: title, confidence, time explained, evidence vs threshold, next checks."""

    def __init__(self, *, id: str | None = None, compact: bool = False) -> None:
        super().__init__("verdict", id=id, compact=compact)

    def show(self, vm: VerdictVM | None) -> None:
        title = "verdict"
        if vm is not None and vm.as_of:
            title += f" (as of {vm.as_of})"
        elif vm is not None and vm.stale:
            title += " (updating…)"
        if self.border_title != title:
            self.border_title = title
        super().show(vm)

    def _shape(self, vm: Any) -> Any:
        if vm is None:
            return None
        return (vm.pending, vm.title, vm.explained, tuple((e.name, e.meaning) for e in vm.evidence),
                tuple(vm.next_checks), tuple(o.title for o in vm.others), vm.note, vm.scope, vm.leading)

    def render(self) -> RenderResult:
        v: VerdictVM | None = self._vm
        if v is None:
            return Text("waiting for the first frame…", style="italic")
        t = Text()
        if v.pending:
            t.append(v.title, style="italic")
            return t
        cat_style = CATEGORY_STYLE.get(v.category, "bold")
        t.append(v.title or "no verdict", style=cat_style + " underline" if v.title else "dim")
        t.append("\n")
        if v.category:
            t.append(f"{v.category}", style="bold cyan")
            t.append("  confidence ", style="dim")
            t.append(fmt_confidence(v.confidence), style=conf_style(v.confidence))
            if v.explained:
                t.append("  " + v.explained, style="dim")
            t.append("\n")
        if v.leading:
            t.append(v.leading + "\n", style="italic yellow")
        parts: list[Any] = [t]
        if v.evidence:
            if not self.compact:
                t.append("evidence", style="bold")
            else:
                t.rstrip()
            # the meaning column only where the name still gets a sane width beside it: a
            # narrow panel wrapped both to two words a line
            meaning = self.inner_width >= MEANING_MIN_WIDTH
            grid = Table.grid(padding=(0, 1), expand=True)
            grid.add_column(width=1)  # the indent, kept on a name's wrapped lines
            grid.add_column(ratio=3, no_wrap=False)
            grid.add_column(justify="right", no_wrap=True)
            grid.add_column(no_wrap=True, style="dim")
            grid.add_column(no_wrap=True)
            if meaning:
                grid.add_column(ratio=4, style="italic dim")
            for e in v.evidence[:COMPACT_EVIDENCE if self.compact else None]:
                cells = ["", e.name, Text(e.value, style="bold"), e.threshold, _mark(e.mark)]
                grid.add_row(*cells, *([e.meaning] if meaning else []))
            parts.append(grid)
            t = Text()
            parts.append(t)
        if v.next_checks:
            t.append("check next" + (": " if self.compact else "\n"), style="bold")
            for i, c in enumerate(v.next_checks[:COMPACT_CHECKS if self.compact else None]):
                t.append(f"{'' if self.compact and not i else '  '}→ {c}\n")
        if v.others:
            t.append("also: ", style="bold dim")
            t.append("; ".join(f"{o.title} ({fmt_confidence(o.confidence)})" for o in v.others), style="dim")
            t.append("\n")
        if v.note:
            t.append(v.note + "\n", style="italic yellow" if v.failed else "italic dim")
        if v.scope:
            t.append(v.scope, style="italic cyan")
        t.rstrip()
        return Group(*parts)


#: the verdict panel's width (cells) from which evidence rows show their meaning column
MEANING_MIN_WIDTH = 100
#: evidence rows and next checks the compact layout shows (the rest: a wider terminal, or the report)
COMPACT_EVIDENCE = 4
COMPACT_CHECKS = 2

#: the mark cell of an evidence row with no threshold (the other renderers leave it blank)
CONTEXT_MARK = "· context"


def _mark(mark: str) -> Text:
    """An evidence row's mark: crossed in red, not crossed in green, a context row named as such."""
    if mark.startswith("✓"):
        return Text(mark, style="bold red")
    if mark.startswith("✗"):
        return Text(mark, style="green")
    return Text(mark or CONTEXT_MARK, style="dim")
