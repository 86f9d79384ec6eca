"""The number panels: latency, the stage bar, throughput/KV and the GPU or engine-busy panel.
UI thread only; rendering is string formatting of the view model.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import RenderResult

from diag.ground.units import Unit, fmt_rate, fmt_s, fmt_value, is_num
from tui.fmt import gauge, sparkline
from tui.viewmodels import BusyVM, GpuVM, LatencyVM, StagesVM, ThroughputVM
from tui.widgets.panels import STAGE_COLORS, Item, Panel, flow


class LatencyPanel(Panel):
    """TTFT p50/p95/p99 and ITL with sparklines over the window (compact: the numbers only)."""

    def __init__(self, *, id: str | None = None, compact: bool = False) -> None:
        super().__init__("latency", id=id, compact=compact)

    def render(self) -> RenderResult:
        v: LatencyVM | None = self._vm
        if v is None:
            return Text("")
        w = self.inner_width
        ttft: list[Item] = [[("TTFT", "bold")], [("p50 ", "dim"), (fmt_s(v.ttft_p50_s), "")],
                            [("p95 ", "dim"), (fmt_s(v.ttft_p95_s), "")], [("p99 ", "dim"), (fmt_s(v.ttft_p99_s), "bold")],
                            [(f"{v.side or '-'} n={v.requests}", "dim")]]
        itl: list[Item] = [[("ITL", "bold")], [("p50 ", "dim"), (fmt_s(v.itl_p50_s), "")],
                           [("p99 ", "dim"), (fmt_s(v.itl_p99_s), "")], [("TPOT p50 ", "dim"), (fmt_s(v.tpot_p50_s), "")]]
        if self.compact:
            return flow([ttft, itl], w)
        t = flow([ttft], w)
        t.append("\nmean ", style="dim")
        t.append(sparkline(v.ttft_spark, max(8, w - 6)), style="bright_magenta")
        t.append("\n")
        t.append_text(flow([itl], w))
        t.append("\np50  ", style="dim")
        t.append(sparkline(v.itl_spark, max(8, w - 6)), style="bright_cyan")
        return t


class StagePanel(Panel):
    """Where the mean TTFT goes, as one stacked bar over the stages plus a legend."""

    def __init__(self, *, id: str | None = None, compact: bool = False) -> None:
        super().__init__("TTFT by stage (mean per request)", id=id, compact=compact)

    def _shape(self, vm: Any) -> Any:
        return None if vm is None else tuple(s.stage for s in vm.stages)

    def show(self, vm: StagesVM | None) -> None:
        if self.compact:  # the mean goes into the title: one line fewer
            title = "TTFT by stage" + (f" · mean {fmt_s(vm.ttft_mean_s)}" if vm is not None and vm.stages else "")
            if self.border_title != title:
                self.border_title = title
        super().show(vm)

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
        if not self.compact:
            t.append(f"mean TTFT {fmt_s(v.ttft_mean_s)}", style="bold")
        if v.covered_share is not None and v.covered_share < 0.95:
            t.append(f"{'' if self.compact else '   '}(stages cover {fmt_value(v.covered_share, Unit.SHARE)}; "
                     "the rest is untraced)", style="dim")
        if len(t):
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
    """Input/output token throughput, running/waiting sequences, and a KV-usage gauge
    (compact: one KV number, no sparkline)."""

    def __init__(self, *, id: str | None = None, compact: bool = False) -> None:
        super().__init__("throughput · batch · KV cache", id=id, compact=compact)

    def _shape(self, vm: Any) -> Any:
        return None if vm is None else (bool(vm.preemptions), bool(vm.source))

    def render(self) -> RenderResult:
        v: ThroughputVM | None = self._vm
        if v is None:
            return Text("")
        w = self.inner_width
        waiting = is_num(v.waiting) and (v.waiting or 0) > 0
        kv = v.kv_usage_ratio
        kv_style = "red" if is_num(kv) and (kv or 0) >= 0.9 else "yellow" if is_num(kv) and (kv or 0) >= 0.7 else "green"
        rates: list[Item] = [[("in ", "dim"), (fmt_value(v.input_tok_per_s, Unit.TOKENS_PER_S), "bold")],
                             [("out ", "dim"), (fmt_value(v.output_tok_per_s, Unit.TOKENS_PER_S), "bold")],
                             [(fmt_rate(v.req_per_s, Unit.REQUESTS), "")]]
        batch: list[Item] = [[("running ", "dim"), (fmt_value(v.running, Unit.COUNT), "bold")],
                             [("waiting ", "dim"), (fmt_value(v.waiting, Unit.COUNT), "bold red" if waiting else "bold")]]
        kv_item: Item = [("KV ", "dim"), (fmt_value(kv, Unit.SHARE), f"bold {kv_style}")]
        if is_num(v.kv_max_ratio):
            kv_item.append((f" max {fmt_value(v.kv_max_ratio, Unit.SHARE)}", "dim"))
        if self.compact:
            batch.append(kv_item)
            if is_num(v.preemptions) and v.preemptions:
                batch.append([(f"preemptions {fmt_value(v.preemptions, Unit.COUNT)}", "bold red")])
            return flow([rates, batch], w)
        t = flow([rates, batch], w)
        if v.waiting_spark and w >= 40:
            t.append("  ")
            t.append(sparkline(v.waiting_spark, max(8, w - 28)), style="red")
        t.append("\n")
        gw = max(10, w - 26)
        t.append("KV ", style="dim")
        t.append(gauge(kv, gw), style=kv_style)
        t.append(f" {fmt_value(kv, Unit.SHARE)}", style="bold")
        if is_num(v.kv_max_ratio):
            t.append(f" max {fmt_value(v.kv_max_ratio, Unit.SHARE)}", style="dim")
        if is_num(v.preemptions) and v.preemptions:
            t.append(f"\npreemptions {fmt_value(v.preemptions, Unit.COUNT)}", style="bold red")
        if v.source:
            t.append(f"\nfrom {v.source}", style="dim italic")
        return t


class BusyOrGpuPanel(Panel):
    """Per GPU: utilisation, HBM, memory bandwidth, NVLink, PCIe — or, with no GPU counters,
    the engine's busy timeline from its step spans."""

    def __init__(self, *, id: str | None = None, compact: bool = False) -> None:
        super().__init__("GPU", id=id, compact=compact)
        self._gpus: list[GpuVM] = []
        self._busy: BusyVM | None = None
        self._note = ""

    def show_parts(self, gpus: list[GpuVM], busy: BusyVM, note: str) -> None:
        """Keep the parts and repaint, unless nothing changed (UI thread)."""
        if (gpus, busy, note) == (self._gpus, self._busy, self._note):
            return
        self._gpus, self._busy, self._note = gpus, busy, note
        title = "GPU" if gpus else "engine busy (no GPU)" if self.compact \
            else "engine busy timeline (no GPU counters)"
        if self.border_title != title:
            self.border_title = title
        self.refresh()

    def _gpus_compact(self, width: int) -> Text:
        """At most four lines however many GPUs: one GPU's numbers, or several summed up
        (utilisation mean and range, HBM used of total, memory bandwidth mean)."""
        gs = self._gpus
        util = [g.util_pct for g in gs if is_num(g.util_pct)]
        used = [g.hbm_used_bytes for g in gs if is_num(g.hbm_used_bytes)]
        total = [g.hbm_total_bytes for g in gs if is_num(g.hbm_total_bytes)]
        bw = [g.membw_pct for g in gs if is_num(g.membw_pct)]

        def mean(v: list[Any]) -> float | None:
            return sum(v) / len(v) if v else None

        first: list[Item] = [[(gs[0].entity if len(gs) == 1 else f"{len(gs)} GPUs", "bold")],
                             [("util ", "dim"), (fmt_value(mean(util), Unit.PCT), "bold")]]
        if len(util) > 1:
            first.append([(f"({fmt_value(min(util), Unit.PCT)}-{fmt_value(max(util), Unit.PCT)})", "dim")])
        hbm = fmt_value(sum(used) if used else None, Unit.BYTES)
        if len(total) == len(gs):
            hbm += f"/{fmt_value(sum(total), Unit.BYTES)}"
        items: list[list[Item]] = [first, [[("HBM ", "dim"), (hbm, "")]]]
        if bw:
            items[1].append([("mem bw ", "dim"), (fmt_value(mean(bw), Unit.PCT), "")])
        return flow(items, width)

    def render(self) -> RenderResult:
        w = self.inner_width
        if self._gpus and self.compact:
            return self._gpus_compact(w)
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
            t = Text()
            for k, r in enumerate(rows):
                line = Text()
                for i, (cell, cw) in enumerate(zip(r, widths)):
                    style = "bold dim" if k == 0 else ("green" if i == 2 else "")
                    line.append(cell.ljust(cw) + (" " if i < len(widths) - 1 else ""), style=style)
                line.truncate(w, overflow="ellipsis")  # the panel's width, never a wrapped row
                if k:
                    t.append("\n")
                t.append_text(line)
            return t
        b = self._busy
        if b is None or not b.steps:
            return Text(self._note or "no GPU counters and no engine step spans in this window", style="italic dim")
        numbers: list[Item] = [[("busy ", "dim"), (fmt_value(b.busy_pct, Unit.PCT), "bold")],
                               [(fmt_rate(b.steps_per_s, Unit.STEPS), "")],
                               [("mean step ", "dim"), (fmt_s(b.mean_step_s), "")]]
        if is_num(b.prefill_step_pct):
            numbers.append([("steps with prefill ", "dim"), (fmt_value(b.prefill_step_pct, Unit.PCT), "")])
        t = flow([numbers], w)
        if self.compact:
            return t
        sw = max(8, w - 10)
        t.append("\nbusy%   ", style="dim")
        t.append(sparkline(b.busy_spark, sw, 0, 100), style="green")
        t.append("\nprefill ", style="dim")
        t.append(sparkline(b.prefill_spark, sw, 0), style="blue")
        t.append("\n")
        t.append(self._note, style="italic dim")
        return t
