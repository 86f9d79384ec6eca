"""The Textual app behind ``ttft view``, ``ttft watch`` and ``ttft demo``.

Threading contract: the UI thread only renders view models and handles keys. Every frame's
data work (``Source.poll`` + rules + :func:`tui.model.build_view_model`) runs in a thread
worker; at most one frame is in flight, and a request that arrives meanwhile is coalesced
into one more frame after it. Report writing and the waterfall's span lookup are thread
workers too. Results come back with ``call_from_thread``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from diag.analysis import Analysis
from diag.ground.tables import stage_decomposition
from tui import adapters
from tui.layout import LAYOUTS, choose_layout
from tui.model import ViewModel, build_view_model, request_waterfall
from tui.sources import Snapshot, Source
from tui.widgets import (
    BusyOrGpuPanel,
    FleetScreen,
    HelpScreen,
    LatencyPanel,
    SlowestTable,
    StagePanel,
    StatusBar,
    ThroughputPanel,
    VerdictPanel,
    WaterfallScreen,
)

#: actions that only make sense on the dashboard (not under help or a waterfall)
_DASHBOARD_ACTIONS = frozenset({"move", "zoom", "whole", "report", "toggle_pause", "fleet"})


class TTFTApp(App[int]):
    """Dashboard over one :class:`tui.sources.Source`.

    ``refresh_s``: seconds between frames (live sources re-read their files each frame).
    ``slo``/``rules_file`` go to the rule engine. ``report_dir``: where ``r`` writes.
    """

    TITLE = "ttft-diag"
    CSS = """
    Screen { layout: vertical; }
    #row-top { height: auto; max-height: 24; }
    #row-top > Panel { height: auto; min-height: 12; }
    #row-mid { height: auto; }
    #row-mid > Panel { height: auto; min-height: 7; }
    #row-bottom { height: 1fr; min-height: 8; }
    #row-bottom > Panel { height: 1fr; }
    #verdict { width: 2fr; }
    #latency { width: 1fr; }
    #stages { width: 2fr; }
    #throughput { width: 1fr; }
    #slowest { width: 1fr; }
    #gpu { width: 1fr; }
    .-medium #row-top { max-height: 18; }
    /* compact (80x24): a top rule with the title instead of a box, one line per panel */
    .-compact Panel { border: none; border-top: solid $primary 40%; }
    .-compact Panel:focus { border: none; border-top: solid $accent; }
    .-compact #verdict { width: 1fr; height: 1fr; min-height: 5; }
    .-compact #row-mid { height: auto; }
    .-compact #row-mid > Panel { height: auto; min-height: 3; }
    .-compact #row-bottom { height: auto; min-height: 3; }
    .-compact #row-bottom > Panel { height: auto; min-height: 3; }
    .-compact #stages { width: 2fr; }
    .-compact #gpu { width: 1fr; }
    """

    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("p", "toggle_pause", "pause"),
        Binding("r", "report", "report"),
        Binding("question_mark", "help", "help"),
        Binding("f", "fleet", "fleet"),
        Binding("left,left_square_bracket", "move(-1)", "earlier", priority=True),
        Binding("right,right_square_bracket", "move(1)", "later", priority=True),
        Binding("minus", "zoom(0.5)", "narrower", show=False),
        Binding("plus,equals_sign", "zoom(2.0)", "wider", show=False),
        Binding("0", "whole", "whole", show=False),
    ]

    def __init__(self, source: Source, refresh_s: float = 1.0, slo: dict[str, float] | None = None,
                 rules_file: str | None = None, report_dir: str | Path = ".", layout: str = "auto") -> None:
        super().__init__()
        choose_layout(layout, 80, 24)  # ValueError on an unknown name, before the screen starts
        #: the layout asked for (``auto``: by terminal size) and the one drawn now (:mod:`tui.layout`)
        self.layout_request = layout
        self.layout_mode = ""
        self.source = source
        self.refresh_s = max(0.05, float(refresh_s))
        self.slo = slo
        self.rules_file = rules_file
        self.report_dir = Path(report_dir)
        self.paused = False
        self.last_vm: ViewModel | None = None
        self.last_snapshot: Snapshot | None = None
        self.frames = 0
        self.last_error = ""
        self.last_report: Path | None = None
        self._message = ""
        self._lock = threading.Lock()
        self._in_flight = False
        self._dirty = False
        self._last_key: tuple[int, tuple[int, int]] | None = None
        # the rules run in their own worker: latest result, the key it was for, bookkeeping
        self.rules_run: adapters.RulesRun | None = None
        self.rules_key: tuple[int, tuple[int, int]] | None = None
        self.rules_runs = 0
        self._rules_running = False
        self._rules_done_at = 0.0

    # --- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        mode = choose_layout(self.layout_request, self.size.width, self.size.height)
        self.layout_mode = mode
        for m in LAYOUTS[1:]:
            self.screen.set_class(m == mode, f"-{m}")
        compact = mode == "compact"
        yield StatusBar(id="status")
        if compact:
            # 80x24: the verdict full width, then the numbers; no slowest-requests table
            yield VerdictPanel(id="verdict", compact=True)
            with Horizontal(id="row-mid"):
                yield LatencyPanel(id="latency", compact=True)
                yield ThroughputPanel(id="throughput", compact=True)
            with Horizontal(id="row-bottom"):
                yield StagePanel(id="stages", compact=True)
                yield BusyOrGpuPanel(id="gpu", compact=True)
            yield Footer()
            return
        with Horizontal(id="row-top"):
            yield VerdictPanel(id="verdict")
            yield LatencyPanel(id="latency")
        with Horizontal(id="row-mid"):
            yield StagePanel(id="stages")
            yield ThroughputPanel(id="throughput")
        with Horizontal(id="row-bottom"):
            yield SlowestTable(id="slowest")
            with Vertical(id="gpu-col"):
                yield BusyOrGpuPanel(id="gpu")
        yield Footer()

    async def on_resize(self, event: events.Resize) -> None:
        await self._relayout(event.size.width, event.size.height)

    async def _relayout(self, columns: int, rows: int) -> None:
        """``auto``: draw the layout this size calls for, with the last frame (UI thread). Under
        the help or a waterfall it waits for the dashboard to be on top again (``_tick``)."""
        mode = choose_layout(self.layout_request, columns, rows)
        if mode == self.layout_mode or not self.layout_mode or len(self.screen_stack) > 1:
            return
        await self.recompose()
        self.query_one(VerdictPanel).focus()
        self._paint(self.last_vm)

    def on_mount(self) -> None:
        self.query_one(StatusBar).show(None, self.paused, f"loading {self.source.title}…")
        self.query_one(VerdictPanel).focus()
        self.set_interval(self.refresh_s, self._tick)
        self.request_frame()

    def on_unmount(self) -> None:
        try:
            self.source.close()
        except Exception:  # closing is best-effort on the way out
            pass

    # --- frames ------------------------------------------------------------------------------

    def _tick(self) -> None:
        if self.layout_mode and choose_layout(self.layout_request, *self.size) != self.layout_mode:
            self.call_later(self._relayout, *self.size)  # a resize while the help was open
        if not self.paused:
            self.request_frame()

    def request_frame(self, force: bool = False) -> None:
        """Start a frame, or mark one as due when a frame is already running (UI thread)."""
        with self._lock:
            if force:
                self._last_key = None
            if self._in_flight:
                self._dirty = True
                return
            self._in_flight = True
        self._frame_worker()

    @work(thread=True, group="frame", exit_on_error=False)
    def _frame_worker(self) -> None:
        vm: ViewModel | None = None
        snap: Snapshot | None = None
        error = ""
        try:
            snap = self.source.poll()
            key = (snap.generation, snap.window_ns)
            if snap.live or key != self._last_key or self.last_vm is None:
                vm = build_view_model(snap, self.rules_run, stale=self.rules_key != key)
                self._last_key = key
                self.last_snapshot = snap
        except Exception as exc:  # shown on screen; the app keeps running
            error = f"{type(exc).__name__}: {exc}" if not _is_user_error(exc) else str(exc)
        try:
            self.call_from_thread(self._apply, vm, error, snap)
        except RuntimeError:  # the app is shutting down
            pass

    def _maybe_run_rules(self, snap: Snapshot) -> None:
        """Start the rules for this snapshot unless they are current or already running
        (UI thread). Live sources re-run them at most every max(refresh, 2 x last run time),
        so the rules never take more than about a third of a core from the engine."""
        key = (snap.generation, snap.window_ns)
        if self._rules_running or key == self.rules_key:
            return
        if snap.live and self.rules_run is not None:
            gap = max(self.refresh_s, 2.0 * self.rules_run.elapsed_s)
            if time.monotonic() - self._rules_done_at < gap:
                return
        self._rules_running = True
        self._rules_worker(snap, key)

    @work(thread=True, group="rules", exit_on_error=False)
    def _rules_worker(self, snap: Snapshot, key: tuple[int, tuple[int, int]]) -> None:
        try:
            slo = snap.slo if snap.slo is not None else self.slo  # the demo's phase holds its own SLOs
            # the whole capture goes to the rules uncut (window None), as `ttft analyze` gives it
            window = None if snap.whole else snap.window_ns
            run = adapters.run_rules(snap.tables, window, slo=slo, rules_file=self.rules_file)
        except Exception as exc:  # e.g. a bad rules file: say so, keep the dashboard
            run = adapters.RulesRun(None, snap.window_ns, 0, 0, 0.0,
                                    error=f"rules failed: {type(exc).__name__}: {str(exc)[:160]}")
        try:
            self.call_from_thread(self._rules_done, run, key)
        except RuntimeError:
            pass

    def _rules_done(self, run: adapters.RulesRun, key: tuple[int, tuple[int, int]]) -> None:
        self.rules_run, self.rules_key = run, key
        self.rules_runs += 1
        self._rules_running = False
        self._rules_done_at = time.monotonic()
        self.request_frame(force=True)

    def _apply(self, vm: ViewModel | None, error: str, snap: Snapshot | None = None) -> None:
        """Paint a finished frame (UI thread) and start a coalesced one if it is due."""
        with self._lock:
            self._in_flight = False
            again = self._dirty
            self._dirty = False
        if snap is not None:
            self._maybe_run_rules(snap)
        if error:
            self.last_error = error
            status = self.query_one(StatusBar)
            if self.last_vm is None:
                status.show(None, self.paused, f"✖ {error}")
            else:
                feeds = list(snap.errors) if snap is not None else []  # keep saying which feed is down
                self.last_vm.errors = [*feeds, f"frame failed: {error}"]
                status.show(self.last_vm, self.paused, self._message)
        if vm is not None:
            self.frames += 1
            self.last_vm = vm
            self.last_error = ""
            self._paint(vm)
        if again:
            self.request_frame()

    def _paint(self, vm: ViewModel | None) -> None:
        """Hand each panel of the current layout its part of ``vm`` (UI thread)."""
        if vm is None:
            return
        self.query_one(StatusBar).show(vm, self.paused, self._message)
        self.query_one(VerdictPanel).show(vm.verdict)
        self.query_one(LatencyPanel).show(vm.latency)
        self.query_one(StagePanel).show(vm.stages)
        self.query_one(ThroughputPanel).show(vm.throughput)
        self.query_one(BusyOrGpuPanel).show_parts(vm.gpus, vm.busy, vm.gpu_note)
        for table in self.query(SlowestTable):  # not in the compact layout
            table.show(vm.slowest)

    def _say(self, message: str) -> None:
        self._message = message
        self.query_one(StatusBar).show(self.last_vm, self.paused, message)

    # --- keys ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _DASHBOARD_ACTIONS and len(self.screen_stack) > 1:
            return False
        return True

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self._say("paused: p resumes" if self.paused else "")
        if not self.paused:
            self.request_frame()

    def action_move(self, steps: int) -> None:
        if self.source.move(int(steps)):
            self.request_frame(force=True)
        else:
            self._say("the live window follows now; open the capture with `ttft view` to move back in time")

    def action_zoom(self, factor: float) -> None:
        if self.source.zoom(float(factor)):
            self.request_frame(force=True)

    def action_whole(self) -> None:
        self.source.reset_window()
        self.request_frame(force=True)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_fleet(self) -> None:
        if self.last_snapshot is None:
            self._say("no data yet: no fleet")
            return
        if not isinstance(self.screen, FleetScreen):
            self._fleet_worker(self.last_snapshot)

    @work(thread=True, group="fleet", exclusive=True, exit_on_error=False)
    def _fleet_worker(self, snap: Snapshot) -> None:
        """Judge each replica of the window's engine series (worker thread), then show the table."""
        from diag.analysis.fleet import split_by_replica
        from diag.analysis.report.fleet import format_fleet_table

        try:
            window = None if snap.whole else snap.window_ns
            windowed = snap.tables.window(window)
            fleet = Analysis([snap.title], windowed, stage_decomposition(windowed.requests),
                             adapters.run_rules(snap.tables, window, slo=snap.slo or self.slo,
                                                rules_file=self.rules_file).diagnosis)
            result = split_by_replica(fleet, "instance", self.rules_file, snap.slo or self.slo)
            if len(result.replicas) < 2:
                self.call_from_thread(self._say, f"no fleet: the engine series name {len(result.replicas)} replica(s)"
                                                 " (ttft scrape --from-prometheus reads every replica)")
                return
            self.call_from_thread(self.push_screen, FleetScreen(format_fleet_table(result)))
        except RuntimeError:
            pass
        except Exception as exc:
            try:
                self.call_from_thread(self._say, f"fleet failed: {type(exc).__name__}: {exc}")
            except RuntimeError:
                pass

    def action_report(self) -> None:
        if self.last_vm is None or self.last_snapshot is None:
            self._say("no data yet: nothing to report")
            return
        self._say("writing report…")
        self._report_worker(self.last_snapshot, self.last_vm)

    @work(thread=True, group="report", exit_on_error=False)
    def _report_worker(self, snap: Snapshot, vm: ViewModel) -> None:
        try:
            path = adapters.write_report(snap.tables, None if vm.whole else vm.window_ns, vm.diagnosis,
                                         self.report_dir, str(getattr(self.source, "path", snap.title)),
                                         slo=snap.slo if snap.slo is not None else self.slo)
            self.last_report = path
            msg = f"report written: {path}"
        except Exception as exc:
            msg = f"report failed: {type(exc).__name__}: {exc}"
        try:
            self.call_from_thread(self._say, msg)
        except RuntimeError:
            pass

    @on(SlowestTable.RowSelected)
    def _open_request(self, event: SlowestTable.RowSelected) -> None:
        if self.last_snapshot is not None:
            self._waterfall_worker(self.last_snapshot, event.trace_id)

    @work(thread=True, group="waterfall", exclusive=True, exit_on_error=False)
    def _waterfall_worker(self, snap: Snapshot, trace_id: str) -> None:
        try:
            vm = request_waterfall(snap.tables, trace_id)
        except Exception as exc:
            msg = f"waterfall failed: {type(exc).__name__}: {exc}"
            try:
                self.call_from_thread(self._say, msg)
            except RuntimeError:
                pass
            return
        try:
            self.call_from_thread(self.push_screen, WaterfallScreen(vm))
        except RuntimeError:
            pass


def _is_user_error(exc: BaseException) -> bool:
    from diag.ground.capture import CaptureError

    return isinstance(exc, CaptureError)


def run_app(source: Source, refresh_s: float = 1.0, slo: dict[str, float] | None = None,
            rules_file: str | None = None, report_dir: str | Path = ".", layout: str = "auto") -> int:
    """Run the app in this terminal until the user quits; returns the exit code. ``layout``:
    auto, compact, medium or full (:mod:`tui.layout`)."""
    app = TTFTApp(source, refresh_s=refresh_s, slo=slo, rules_file=rules_file, report_dir=report_dir,
                  layout=layout)
    result = app.run()
    return int(result or 0)

