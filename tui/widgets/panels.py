"""The dashboard's panels: verdict, latency, stage bar, throughput/KV, GPU or engine-busy,
and the slowest-requests table.

Each panel keeps the view-model part it was last given (``show(vm)``) and renders it at its
current width; rendering is string formatting only. UI thread only.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import RenderResult
from textual.widget import Widget
from textual import events
from textual.binding import Binding
from textual.message import Message

from diag import stages
from diag.report.cells import fmt_confidence
from diag.units import Unit, fmt_rate, fmt_s, fmt_value, is_num
from tui.fmt import gauge, sparkline
from tui.viewmodels import (
    BusyVM,
    GpuVM,
    LatencyVM,
    SlowRowVM,
    StagesVM,
    ThroughputVM,
    VerdictVM,
    ViewModel,
)

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

CATEGORY_STYLE = {"healthy": "bold green", "no_data": "dim"}


def _conf_style(conf: float) -> str:
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

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = title
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
        t.append("  ")
        if self.paused:
            t.append(" PAUSED ", style="bold black on yellow")
        elif vm.live:
            t.append(" LIVE ", style="bold black on green")
        else:
            t.append(" CAPTURE ", style="bold black on blue")
        t.append(f"  frame {vm.timings_ms.get('total', 0):.0f} ms", style="dim")
        if vm.verdict.rules_ms is not None:
            t.append(f" · rules {vm.verdict.rules_ms:.0f} ms", style="dim")
        t.append("  " + time.strftime("%H:%M:%S"), style="dim")
        if self.message:
            t.append("\n" + self.message, style="italic cyan")
        for e in vm.errors:
            t.append("\n✖ " + e, style="bold white on red")
        for n in vm.notes[:4]:
            t.append("\n• " + n, style="yellow")
        return t


class VerdictPanel(Panel):
    """The top finding: title, confidence, time explained, evidence vs threshold, next checks."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("verdict", id=id)

    def show(self, vm: Any) -> None:
        title = "verdict"
        if getattr(vm, "as_of", ""):
            title += f" (as of {vm.as_of})"
        elif getattr(vm, "stale", False):
            title += " (updating…)"
        if self.border_title != title:
            self.border_title = title
        super().show(vm)

    def _shape(self, vm: Any) -> Any:
        if vm is None:
            return None
        return (vm.pending, vm.title, vm.explained, tuple((e.name, e.meaning) for e in vm.evidence),
                tuple(vm.next_checks), tuple(o.title for o in vm.others), vm.note, vm.scope)

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
            t.append(fmt_confidence(v.confidence), style=_conf_style(v.confidence))
            if v.explained:
                t.append("  " + v.explained, style="dim")
            t.append("\n")
        parts: list[Any] = [t]
        if v.evidence:
            t.append("evidence", style="bold")
            grid = Table.grid(padding=(0, 1), expand=True)
            grid.add_column(ratio=3, no_wrap=False)
            grid.add_column(justify="right", no_wrap=True)
            grid.add_column(no_wrap=True, style="dim")
            grid.add_column(no_wrap=True)
            grid.add_column(ratio=4, style="italic dim")
            for e in v.evidence:
                mark = Text(e.mark, style="red" if e.mark.startswith("✓") else "dim")
                grid.add_row("  " + e.name, Text(e.value, style="bold"), e.threshold, mark, e.meaning)
            parts.append(grid)
            t = Text()
            parts.append(t)
        if v.next_checks:
            t.append("check next\n", style="bold")
            for c in v.next_checks:
                t.append(f"  → {c}\n")
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


class LatencyPanel(Panel):
    """TTFT p50/p95/p99 and ITL with sparklines over the window."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("latency", id=id)

    def render(self) -> RenderResult:
        v: LatencyVM | None = self._vm
        if v is None:
            return Text("")
        w = max(8, self.inner_width - 8)
        t = Text()
        t.append(f"TTFT ({v.side or '-'})  n={v.requests}\n", style="bold")
        t.append(f"  p50 {fmt_s(v.ttft_p50_s):>8}  p95 {fmt_s(v.ttft_p95_s):>8}  p99 ")
        t.append(f"{fmt_s(v.ttft_p99_s):>8}\n", style="bold")
        t.append("  mean ", style="dim")
        t.append(sparkline(v.ttft_spark, w), style="bright_magenta")
        t.append("\n")
        t.append("ITL / TPOT\n", style="bold")
        t.append(f"  ITL p50 {fmt_s(v.itl_p50_s):>8}  ITL p99 {fmt_s(v.itl_p99_s):>8}\n")
        t.append(f"  TPOT p50 {fmt_s(v.tpot_p50_s):>7}\n")
        t.append("  p50  ", style="dim")
        t.append(sparkline(v.itl_spark, w), style="bright_cyan")
        return t


class StagePanel(Panel):
    """Where the mean TTFT goes, as one stacked bar over the stages plus a legend."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("TTFT by stage (mean per request)", id=id)

    def _shape(self, vm: Any) -> Any:
        return None if vm is None else tuple(s.stage for s in vm.stages)

    def render(self) -> RenderResult:
        v: StagesVM | None = self._vm
        if v is None:
            return Text("")
        if not v.stages:
            return Text(v.note or "no data", style="italic dim")
        width = self.inner_width
        total_share = max(sum(s.share for s in v.stages), 1.0)
        bar = Text()
        used = 0
        for i, s in enumerate(v.stages):
            n = int(round(s.share / total_share * width))
            if i == len(v.stages) - 1 and total_share <= 1.0001:
                n = min(n, width - used)
            n = max(0, min(n, width - used))
            label = s.stage[: n] if n >= len(s.stage) + 2 else ""
            seg = (" " + label).ljust(n) if label else " " * n
            bar.append(seg, style=f"black on {STAGE_COLORS.get(s.stage, 'white')}")
            used += n
        if used < width:
            bar.append("·" * (width - used), style="dim")
        t = Text()
        t.append(f"mean TTFT {fmt_s(v.ttft_mean_s)}", style="bold")
        if v.covered_share is not None and v.covered_share < 0.95:
            t.append(f"   (stages cover {fmt_value(v.covered_share, Unit.SHARE)}; the rest is untraced)", style="dim")
        t.append("\n")
        t.append_text(bar)
        t.append("\n")
        col = 0
        for s in v.stages:
            item = f"{s.stage} {fmt_s(s.mean_s)} {fmt_value(s.share, Unit.SHARE)}"
            if col and col + len(item) + 4 > width:
                t.append("\n")
                col = 0
            t.append("■ ", style=STAGE_COLORS.get(s.stage, "white"))
            t.append(item + "  ", style="bold" if s.share >= 0.3 else "")
            col += len(item) + 4
        return t


class ThroughputPanel(Panel):
    """Input/output token throughput, running/waiting sequences, and a KV-usage gauge."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("throughput · batch · KV cache", id=id)

    def _shape(self, vm: Any) -> Any:
        return None if vm is None else (bool(vm.preemptions), bool(vm.source))

    def render(self) -> RenderResult:
        v: ThroughputVM | None = self._vm
        if v is None:
            return Text("")
        t = Text()
        t.append("in ", style="dim")
        t.append(fmt_value(v.input_tok_per_s, Unit.TOKENS_PER_S), style="bold")
        t.append("  out ", style="dim")
        t.append(fmt_value(v.output_tok_per_s, Unit.TOKENS_PER_S), style="bold")
        t.append("  ", style="dim")
        t.append(fmt_rate(v.req_per_s, Unit.REQUESTS))
        t.append("\n")
        run = f"{v.running:.0f}" if is_num(v.running) else "-"
        wait = f"{v.waiting:.0f}" if is_num(v.waiting) else "-"
        t.append("running ", style="dim")
        t.append(run, style="bold")
        t.append("  waiting ", style="dim")
        t.append(wait, style="bold red" if is_num(v.waiting) and (v.waiting or 0) > 0 else "bold")
        if v.waiting_spark:
            t.append("  ")
            t.append(sparkline(v.waiting_spark, max(8, self.inner_width - 28)), style="red")
        t.append("\n")
        gw = max(10, self.inner_width - 26)
        kv = v.kv_usage_ratio
        style = "red" if is_num(kv) and (kv or 0) >= 0.9 else "yellow" if is_num(kv) and (kv or 0) >= 0.7 else "green"
        t.append("KV ", style="dim")
        t.append(gauge(kv, gw), style=style)
        t.append(f" {fmt_value(kv, Unit.SHARE)}", style="bold")
        if is_num(v.kv_max_ratio):
            t.append(f" max {fmt_value(v.kv_max_ratio, Unit.SHARE)}", style="dim")
        if is_num(v.preemptions) and v.preemptions:
            t.append(f"\npreemptions {v.preemptions:.0f}", style="bold red")
        if v.source:
            t.append(f"\nfrom {v.source}", style="dim italic")
        return t


class BusyOrGpuPanel(Panel):
    """Per GPU: utilisation, HBM, memory bandwidth, NVLink, PCIe — or, with no GPU counters,
    the engine's busy timeline from its step spans."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("GPU", id=id)
        self._gpus: list[GpuVM] = []
        self._busy: BusyVM | None = None
        self._note = ""

    def show_parts(self, gpus: list[GpuVM], busy: BusyVM, note: str) -> None:
        """Keep the parts and repaint, unless nothing changed (UI thread)."""
        if (gpus, busy, note) == (self._gpus, self._busy, self._note):
            return
        self._gpus, self._busy, self._note = gpus, busy, note
        title = "GPU" if gpus else "engine busy timeline (no GPU counters)"
        if self.border_title != title:
            self.border_title = title
        self.refresh()

    def render(self) -> RenderResult:
        w = self.inner_width
        if self._gpus:
            # plain padded text, not a rich Table: a Table measures every cell on every
            # repaint (~10 ms for 8 GPUs, a fifth of the frame budget); this is ~1 ms
            sw = max(6, w - 58)
            rows: list[tuple[str, ...]] = [("gpu", "util", "util over window", "HBM used", "mem bw", "NVLink", "PCIe")]
            for g in self._gpus:
                hbm = fmt_value(g.hbm_used_bytes, Unit.BYTES)
                if is_num(g.hbm_total_bytes):
                    hbm += f"/{fmt_value(g.hbm_total_bytes, Unit.BYTES)}"
                rows.append((g.entity, fmt_value(g.util_pct, Unit.PCT), sparkline(g.util_spark, sw, 0, 100), hbm,
                             f"{fmt_value(g.membw_pct, Unit.PCT)} {g.membw_label}" if is_num(g.membw_pct) else "-",
                             fmt_rate(g.nvlink_bytes_per_s, Unit.BYTES) if g.nvlink_bytes_per_s is not None else "-",
                             fmt_rate(g.pcie_bytes_per_s, Unit.BYTES) if g.pcie_bytes_per_s is not None else "-"))
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            t = Text(no_wrap=True, overflow="ellipsis")
            for k, r in enumerate(rows):
                if k:
                    t.append("\n")
                for i, (cell, cw) in enumerate(zip(r, widths)):
                    style = "bold dim" if k == 0 else ("green" if i == 2 else "")
                    t.append(cell.ljust(cw) + (" " if i < len(widths) - 1 else ""), style=style)
            return t
        b = self._busy
        t = Text()
        if b is None or not b.steps:
            t.append(self._note or "no GPU counters and no engine step spans in this window", style="italic dim")
            return t
        sw = max(8, w - 10)
        t.append("busy ", style="dim")
        t.append(fmt_value(b.busy_pct, Unit.PCT), style="bold")
        t.append(f"  {fmt_rate(b.steps_per_s, Unit.STEPS)}  mean step {fmt_s(b.mean_step_s)}")
        if is_num(b.prefill_step_pct):
            t.append(f"  steps with prefill {fmt_value(b.prefill_step_pct, Unit.PCT)}")
        t.append("\n")
        t.append("busy%   ", style="dim")
        t.append(sparkline(b.busy_spark, sw, 0, 100), style="green")
        t.append("\nprefill ", style="dim")
        t.append(sparkline(b.prefill_spark, sw, 0), style="blue")
        t.append("\n")
        t.append(self._note, style="italic dim")
        return t


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

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("slowest requests (Enter: waterfall)", id=id)
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

    def render(self) -> RenderResult:
        t = Text(no_wrap=True, overflow="ellipsis")
        fixed = sum(self.WIDTHS[:-1]) + len(self.WIDTHS)
        widths = self.WIDTHS[:-1] + (max(8, self.inner_width - fixed),)
        for h, w in zip(self.HEADERS, widths):
            t.append(h.ljust(w)[:w] + " ", style="bold dim")
        if not self._rows:
            t.append("\nno requests in this window", style="italic dim")
        for i, r in enumerate(self._rows):
            t.append("\n")
            cur = i == self.cursor_row and self.has_focus
            base = "reverse" if cur else ("underline" if i == self.cursor_row else "")
            ttft = fmt_s(r.ttft_s) if not r.error else f"err {r.error}"
            cells = (ttft, f"{r.top_stage} {fmt_s(r.top_stage_s)}" if r.top_stage else "-",
                     f"{r.input_tokens:.0f}" if is_num(r.input_tokens) else "-",
                     f"{r.output_tokens:.0f}" if is_num(r.output_tokens) else "-",
                     f"+{fmt_s(r.offset_s)}", r.request_id or r.trace_id)
            styles = ("bold" if not r.error else "red", STAGE_COLORS.get(r.top_stage, ""), "", "", "dim", "")
            for c, w, st in zip(cells, widths, styles):
                t.append(c.ljust(w)[:w] + " ", style=f"{st} {base}".strip())
        return t

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
