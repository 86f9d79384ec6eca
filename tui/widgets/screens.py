"""Pushed screens: the key help and one request's waterfall. UI thread only."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult, RenderResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from diag.ground.units import fmt_s
from tui.viewmodels import WaterfallVM

#: the key reference: at most 74 columns and 20 lines, so that the modal (border and padding
#: included) fits an 80x24 terminal whole, and every larger one
HELP_TEXT = """\
[b]ttft-diag[/b] — why is time-to-first-token high?
[b]keys[/b]     f  fleet: one verdict per replica (engine series by instance)
  q        quit                       p    pause / resume refreshing
  r        report of the window       ?    this help (Esc closes)
  tab      next panel                 0    back to the whole capture
  ← → [ ]  move the analysis window (ttft view); from the whole capture
           ← shows the last window and → the first
  - +      narrower / wider window
  enter    on a slowest request: its waterfall (medium and full layouts)
[b]panels[/b]
  verdict     the rules' top finding: confidence, the share of TTFT it
              explains, evidence with the threshold it crossed, what next
  latency     TTFT p50/p95/p99 (client side when a probe measured it), ITL
  stages      mean TTFT by stage: tokenize, queue, prefill, comm, sample,
              detokenize, network (client TTFT - server TTFT)
  throughput  tokens/s in and out, running/waiting sequences, KV usage
  GPU / busy  per GPU utilisation, HBM, bandwidth, NVLink, PCIe; without
              GPU counters, the engine's busy timeline from its step spans
[b]layout[/b]      --layout compact (80x24), medium (120x40), full (160x48);
              auto (the default) picks by terminal size, again on resize"""


class HelpScreen(ModalScreen[None]):
    """The key reference; Esc, ? or q closes it. Sized to its text (scrolls only on a terminal
    smaller than 80x24)."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss_help", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 80; max-width: 100%; height: auto; max-height: 100%;
                                  border: round $accent; background: $surface; padding: 0 1; }
    HelpScreen #help-text { width: auto; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP_TEXT, id="help-text")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)


class FleetScreen(ModalScreen[None]):
    """One verdict per replica of the window's engine series (:func:`diag.analysis.report.fleet.format_fleet_table`);
    Esc, f or q closes it."""

    BINDINGS = [Binding("escape,f,q", "dismiss_fleet", "close")]
    DEFAULT_CSS = """
    FleetScreen { align: center middle; }
    FleetScreen > VerticalScroll { width: auto; max-width: 100%; height: auto; max-height: 100%;
                                   border: round $accent; background: $surface; padding: 0 1; }
    FleetScreen #fleet-text { width: auto; }
    """

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text(self.text), id="fleet-text")

    def action_dismiss_fleet(self) -> None:
        self.dismiss(None)


class Waterfall(Widget):
    """Bars of one trace's spans on a shared time axis; the first-token line is marked."""

    DEFAULT_CSS = "Waterfall { height: auto; }"

    def __init__(self, vm: WaterfallVM) -> None:
        super().__init__()
        self.vm = vm

    def render(self) -> RenderResult:
        from tui.widgets.panels import STAGE_COLORS

        vm = self.vm
        t = Text()
        if vm.facts:
            t.append("  ".join(f"{k} {v}" for k, v in vm.facts), style="bold")
            t.append("\n\n")
        if not vm.rows:
            t.append("no spans for this request in the capture (evicted from the live window?)", style="italic")
            return t
        label_w = 28
        width = max(20, self.content_size.width - label_w - 22)
        total = max(vm.total_s, 1e-9)
        mark = None
        if vm.first_token_s is not None:
            mark = min(width - 1, max(0, int(vm.first_token_s / total * width)))
        for r in vm.rows:
            label = ("  " * r.depth + r.name)[:label_w].ljust(label_w)
            t.append(label)
            a = int(r.start_s / total * width)
            n = max(1, int(round(r.duration_s / total * width)))
            a = min(a, width - 1)
            n = min(n, width - a)
            color = STAGE_COLORS.get(r.name, "bright_black" if r.depth == 0 else "white")
            row = [" "] * width
            if mark is not None:
                row[mark] = "┊"
            t.append("".join(row[:a]), style="yellow")
            t.append("█" * n, style=color)
            t.append("".join(row[a + n:]), style="yellow")
            t.append(f" +{fmt_s(r.start_s):>8} {fmt_s(r.duration_s):>8}\n")
        if vm.first_token_s is not None:
            t.append(" " * label_w)
            t.append(" " * (mark or 0) + "┊", style="yellow")
            t.append(f" first token at +{fmt_s(vm.first_token_s)} (the TTFT boundary)\n", style="yellow")
        if vm.token_offsets_s:
            ticks = [" "] * width
            for x in vm.token_offsets_s:
                ticks[min(width - 1, max(0, int(x / total * width)))] = "|"
            t.append("tokens".ljust(label_w))
            t.append("".join(ticks), style="green")
            t.append(f" {len(vm.token_offsets_s)} tokens\n")
        t.append(f"\ntrace {vm.trace_id}", style="dim")
        return t


class WaterfallScreen(Screen[None]):
    """One request's waterfall; Esc goes back to the dashboard."""

    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "back")]
    DEFAULT_CSS = """
    WaterfallScreen > VerticalScroll { border: round $accent; padding: 0 1; }
    """

    def __init__(self, vm: WaterfallVM) -> None:
        super().__init__()
        self.vm = vm

    def compose(self) -> ComposeResult:
        with VerticalScroll() as v:
            v.border_title = f"{self.vm.title} — waterfall"
            yield Waterfall(self.vm)
        yield Footer()
