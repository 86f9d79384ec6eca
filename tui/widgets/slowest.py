"""The slowest-requests table; selecting a row opens that request's waterfall. UI thread only.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import RenderResult
from textual.binding import Binding
from textual.message import Message

from diag.ground.units import Unit, fmt_s, fmt_value
from tui.viewmodels import SlowRowVM
from tui.widgets.panels import STAGE_COLORS, Panel


class SlowestTable(Panel):
    """The slowest requests of the window as a keyboard-driven table: ↑/↓ move the cursor,
    Enter posts :class:`SlowestTable.RowSelected` (the app opens the waterfall).

    A light table rendered as one Rich Text: it repaints in a fraction of the time Textual's
    DataTable needs for the same 15 rows, which matters because it changes every frame."""

    BINDINGS = [
        Binding("up,k", "cursor(-1)", "up", show=False),
        Binding("down,j", "cursor(1)", "down", show=False),
        Binding("home", "cursor(-1000)", show=False),
        Binding("end", "cursor(1000)", show=False),
        Binding("enter", "select", "waterfall"),
    ]

    HEADERS = ("TTFT", "top stage", "in tok", "out tok", "at", "request")
    WIDTHS = (9, 18, 7, 7, 9, 24)

    class RowSelected(Message):
        """Enter on a row: ``trace_id`` of that request."""

        def __init__(self, table: SlowestTable, trace_id: str) -> None:
            super().__init__()
            self.table = table
            self.trace_id = trace_id

    def __init__(self, *, id: str | None = None, compact: bool = False) -> None:
        super().__init__("slowest requests (Enter: waterfall)", id=id, compact=compact)
        self._rows: list[SlowRowVM] = []
        self.cursor_row = 0

    @property
    def row_count(self) -> int:
        return len(self._rows)

    def show(self, rows: list[SlowRowVM]) -> None:  # type: ignore[override]
        """Show these rows; the cursor stays on the same request when it is still listed."""
        seen: set[str] = set()
        uniq = [r for r in rows if not (r.trace_id in seen or seen.add(r.trace_id))]  # type: ignore[func-returns-value]
        if [r.trace_id for r in uniq] == [r.trace_id for r in self._rows]:
            return
        current = self.selected_trace()
        self._rows = uniq
        keys = [r.trace_id for r in uniq]
        self.cursor_row = keys.index(current) if current in keys else min(self.cursor_row, max(0, len(keys) - 1))
        self.refresh()

    def selected_trace(self) -> str | None:
        if not self._rows or not (0 <= self.cursor_row < len(self._rows)):
            return None
        return self._rows[self.cursor_row].trace_id

    def action_cursor(self, delta: int) -> None:
        if self._rows:
            self.cursor_row = min(max(self.cursor_row + int(delta), 0), len(self._rows) - 1)
            self.refresh()

    def action_select(self) -> None:
        trace = self.selected_trace()
        if trace:
            self.post_message(self.RowSelected(self, trace))

    def on_click(self, event: events.Click) -> None:
        row = event.y - 2  # border + header line
        if 0 <= row < len(self._rows):
            self.cursor_row = row
            self.refresh()
            if event.chain >= 2:
                self.action_select()

    def columns(self) -> list[tuple[int, int]]:
        """(column index, width) of the columns that fit the panel: from the left, the request
        id taking what is left (at least 8 cells), so no row ever wraps."""
        avail = self.inner_width
        out: list[tuple[int, int]] = []
        used = 0
        for i, w in enumerate(self.WIDTHS[:-1]):
            if used + w + 1 > avail:
                return out
            out.append((i, w))
            used += w + 1
        if avail - used >= 8:
            out.append((len(self.WIDTHS) - 1, avail - used))
        return out

    def render(self) -> RenderResult:
        t = Text()
        cols = self.columns()
        for i, w in cols:
            t.append(self.HEADERS[i].ljust(w)[:w] + " ", style="bold dim")
        if not self._rows:
            t.append("\nno requests in this window", style="italic dim")
        for k, r in enumerate(self._rows):
            t.append("\n")
            cur = k == self.cursor_row and self.has_focus
            base = "reverse" if cur else ("underline" if k == self.cursor_row else "")
            ttft = fmt_s(r.ttft_s) if not r.error else f"err {r.error}"
            cells = (ttft, f"{r.top_stage} {fmt_s(r.top_stage_s)}" if r.top_stage else "-",
                     fmt_value(r.input_tokens, Unit.COUNT),
                     fmt_value(r.output_tokens, Unit.COUNT),
                     f"+{fmt_s(r.offset_s)}", r.request_id or r.trace_id)
            styles = ("bold" if not r.error else "red", STAGE_COLORS.get(r.top_stage, ""), "", "", "dim", "")
            for i, w in cols:
                t.append(cells[i].ljust(w)[:w] + " ", style=f"{styles[i]} {base}".strip())
        return t

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
