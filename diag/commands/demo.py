"""``ttft demo``: ``ttft watch`` on a series of bundled engines whose bottleneck changes.

Phases, in order (then again, until q, in the dashboard), each sized from a calibration of
this machine (``diag.scenarios.calibrate``) by the scenario catalog (``diag.scenarios.catalog``):

1. healthy: default engine, light load, held to the catalog's SLOs (so the rules can say so);
2. long prompts: a prompt-length sweep (prefill compute grows with the prompt);
3. KV pressure: ``--kv-blocks`` for about three sequences under a concurrency sweep;
4. slow tokenizer: ``--inject tokenize_ms_per_token=…`` under a prompt sweep.

Each phase is its own engine process (``ttft serve`` with the phase's arguments and
``--otlp`` pointing at the OTLP receiver this process runs) and its own probe process, so
neither the engine's threads nor the dashboard share an interpreter with the probe's event
loop. The probe (client TTFT, joined to the engine's spans by ``traceparent``; its spans and
client-health series come back over a queue), the /metrics scraper of the phase's engine,
the OTLP receiver and NVML (when there is a GPU) all write into one live capture; meta.json's
``demo.phases`` records each phase (name, start/end Unix s, serve arguments, expected
category, and in headless runs the verdict). The dashboard's verdict window starts at the
current phase's start, so the verdict follows the phase.

Threading: the director thread calibrates, then per phase starts the probe process and the
engine process and relays the probe's output into the capture; the scraper, the OTLP
receiver and the series pump have their own threads; the main thread runs the app or the
headless loop.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: (phase name, catalog scenario whose plan and ground truth the phase uses)
PHASES: tuple[tuple[str, str], ...] = (
    ("healthy", "healthy"),
    ("long prompts", "prefill_compute"),
    ("KV pressure", "kv_cache"),
    ("slow tokenizer", "tokenize"),
)
#: seconds of load per phase in the dashboard (headless: --duration / phases)
DASHBOARD_PHASE_S = 15.0
#: a phase that has not finished one pass of its steps stops anyway after this x its length
MAX_OVERRUN = 3.0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo",
        help="watch the verdict change: bundled engines under a workload whose bottleneck changes",
        description="Calibrate this machine (a few seconds), then run four phases (healthy, long prompts, KV "
        "pressure, slow tokenizer), each on its own bundled-engine process exporting spans over OTLP, and show "
        "the live dashboard with the current phase and its expected bottleneck. Without a terminal (or with "
        "--no-tui) it runs each phase once and prints the verdict of each phase.",
    )
    p.add_argument("--no-tui", action="store_true", help="run headless and print the verdict per phase")
    p.add_argument("--duration", type=float, metavar="S", default=None,
                   help="seconds of load, split evenly over the phases (default: headless 60; dashboard: "
                   f"{DASHBOARD_PHASE_S:g} s per phase, repeating until q). Calibration (~5-10 s) and engine "
                   "starts (~2 s each) come on top")
    p.add_argument("-o", "--output", metavar="CAPTURE", default=None,
                   help="capture directory (default ./ttft-demo-YYYYmmdd-HHMMSS); a calibration.json already "
                   "there is reused")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the engines run (auto: cuda when available)")
    p.add_argument("--window", type=float, metavar="S", default=None,
                   help="longest analysis window in the dashboard (default: the whole current phase)")
    p.add_argument("--refresh", type=float, metavar="S", default=1.0, help="seconds between screen refreshes")
    return p


@dataclass(frozen=True)
class PhasePlan:
    """One phase resolved against the calibration: its engine arguments, probe steps, SLOs."""

    name: str
    expected: str  # the category a correct verdict names (the catalog's ground truth)
    cause: str
    serve_args: tuple[str, ...]
    steps: tuple[Any, ...]  # diag.scenarios.catalog.ProbeStep
    slo_spec: str | None
    slo: dict[str, float] | None


def build_plans(cal: Any) -> list[PhasePlan]:
    """The demo's phases from the scenario catalog, sized for ``cal`` (a Calibration)."""
    from diag.scenarios.catalog import get
    from diag.slo import parse_slo

    plans = []
    for name, scenario in PHASES:
        sc = get(scenario)
        plan = sc.build(cal)
        phase = plan.phases[0]
        plans.append(PhasePlan(name, sc.category, sc.cause, tuple(phase.serve_args), tuple(phase.steps),
                               plan.slo, parse_slo(plan.slo) if plan.slo else None))
    return plans


def step_chunks(step: Any, default_segment: str) -> list[tuple[Any, Any, str]]:
    """A catalog ProbeStep as probe chunks: (LoadSpec, input LengthSpec or None, segment).
    A sweep becomes one chunk per point, labelled as ``ttft probe --sweep`` labels them."""
    from collectors.probe.load import LoadSpec
    from collectors.probe.sweep import SweepSpec, label, point_load
    from collectors.probe.workload import LengthSpec

    base = LoadSpec(concurrency=step.concurrency, rate_rps=step.rate_rps, requests=step.requests,
                    duration_s=None if step.requests else 4.0)
    if not step.sweep:
        return [(base, None, step.segment or default_segment)]
    spec = SweepSpec(step.sweep, values=[float(v) for v in step.sweep_values] or None,
                     requests_per_point=step.requests_per_point)
    out = []
    for v in spec.point_values():
        load = point_load(spec, v, base, user_set_concurrency=False)
        inp = LengthSpec("fixed", int(v)) if step.sweep == "prompt" else None
        out.append((load, inp, label(step.sweep, v)))
    return out


class _QueueWriter:
    """The probe child's stand-in for the capture writer: everything it would write goes to
    the demo process as messages on ``queue`` (spans, series, meta), where the director
    writes it into the one live capture. Used on the child's event-loop thread only."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.path = Path(".")

    def append_span_lines(self, lines: Any) -> None:
        lines = list(lines)
        if lines:
            self.queue.put(("spans", lines))

    def write_series(self, source: str, frame: Any) -> Path:
        self.queue.put(("series", source, frame))
        return Path(f"{source}.parquet")

    def append_series(self, source: str, frame: Any) -> Path:
        return self.write_series(source, frame)  # the director appends: one file per phase

    def update_meta(self, **fields: Any) -> None:
        self.queue.put(("meta", fields))

    def close(self) -> None:
        return None


def _probe_child(plan: PhasePlan, phase_s: float, inbox: Any, outbox: Any, stop: Any) -> None:
    """Entry point of the probe process of one phase (spawned): waits for the engine's URL on
    ``inbox``, runs the phase's steps and reports on ``outbox``. Its own interpreter, so the
    dashboard, the OTLP receiver and the scraper never delay its event loop."""
    import os

    from collectors.probe import eventloop

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nothing may scribble over the dashboard
    os.dup2(devnull, 2)
    try:
        url = inbox.get()
        if url is None:
            return
        eventloop.run(_drive(url, plan, phase_s, outbox, stop))
    except BaseException as exc:  # reported to the demo, shown on screen
        outbox.put(("error", f"probe: {type(exc).__name__}: {exc}"))
    finally:
        outbox.put(("exit",))


async def _drive(url: str, plan: PhasePlan, phase_s: float, outbox: Any, stop: Any) -> None:
    """Run the phase's steps against ``url``, pass after pass, for ``phase_s`` seconds
    (finishing the first pass: a sweep's verdict needs all its points)."""
    import gc
    from dataclasses import replace

    from collectors.probe import LoadSpec, ProbeConfig, ProbeSession, WorkloadSpec
    from collectors.probe.workload import LengthSpec

    first = plan.steps[0]
    chunks = [(step, c) for step in plan.steps for c in step_chunks(step, plan.name)]
    pool = max(c[0].concurrency for _, c in chunks)
    cfg = ProbeConfig(url, load=LoadSpec(concurrency=pool, requests=1),
                      workload=WorkloadSpec(LengthSpec.parse(first.input_tokens), LengthSpec.parse(first.output_tokens)),
                      timeout_s=60.0, slo=plan.slo)
    async with ProbeSession(cfg, _QueueWriter(outbox), pool_size=pool) as session:  # type: ignore[arg-type]
        workloads: dict[int, Any] = {}
        for step in plan.steps:
            w = session.workload.with_input(LengthSpec.parse(step.input_tokens))
            w.spec = replace(w.spec, output_tokens=LengthSpec.parse(step.output_tokens))
            workloads[id(step)] = w
        # warm-up before the phase's clock starts: the engine's first requests, and the
        # probe's own first span flush (it imports the OTLP encoder: a ~100 ms loop stall
        # that the load-generator rule would otherwise see)
        for step in plan.steps:
            if step.warmup and not stop.is_set():
                load0, inp0, seg0 = step_chunks(step, plan.name)[0]
                warm_load = replace(load0, requests=step.warmup, duration_s=None, warmup_requests=0, rate_rps=None)
                w = workloads[id(step)]
                await session.phase(warm_load, w.with_input(inp0) if inp0 is not None else w, "warmup")
        gc.collect()
        gc.freeze()  # what exists now is never collected again: shorter GC pauses on the loop
        t0 = time.time()
        outbox.put(("started", t0))
        passes = 0
        while not stop.is_set():
            for step, (load, inp, segment) in chunks:
                elapsed = time.time() - t0
                if stop.is_set() or elapsed >= MAX_OVERRUN * phase_s or (passes and elapsed >= phase_s):
                    break
                w = workloads[id(step)]
                await session.phase(load, w.with_input(inp) if inp is not None else w, segment)
            else:
                passes += 1
                if time.time() - t0 < phase_s:
                    continue
            break
        outbox.put(("done", time.time(), passes, len(session.results)))


class Director:
    """Calibrates, then runs the phases: engine process, scraper and probe per phase.

    Threading: :meth:`run` runs on the director thread; :meth:`phase_info`, :meth:`check`,
    :meth:`finished` and :meth:`stop` may be called from any thread (plain attribute reads
    and a lock around the phase records).
    """

    def __init__(self, live: Any, out: Path, device: str, phase_s: float, repeat: bool) -> None:
        self.live = live
        self.out = out
        self.device = device
        self.phase_s = phase_s
        self.repeat = repeat
        self.status = "starting…"
        self.error = ""
        self.plans: list[PhasePlan] = []
        self.calibration: Any = None
        self.otlp_url = ""
        self.started_unix_s = time.time()
        self._records: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None  # the phase under load (start set)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._engine: Any = None
        self._engine_stopping = False
        self._child_stop: Any = None  # the probe process's stop event
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="ttft-demo-director", daemon=True)

    # --- any thread -------------------------------------------------------------------------

    def phase_info(self) -> Any:
        """The header's phase label, the window (the current phase; between phases, the one
        that just ended) and the phase's SLOs, as a PhaseInfo."""
        from collectors.feeds import PhaseInfo

        with self._lock:
            cur = dict(self._current) if self._current is not None else None
            last = next((dict(r) for r in reversed(self._records) if r.get("end_unix_s") is not None), None)
        if self.error:
            return PhaseInfo(f"stopped: {self.error}")
        n = len(PHASES)
        if cur is None or cur.get("start_unix_s") is None:
            label = self.status
            if cur is not None:
                label = f"{cur['index'] % n + 1}/{n} {cur['phase']} · expect {cur['expected']} · {self.status}"
            if last is None:
                return PhaseInfo(label)
            return PhaseInfo(label, last["start_unix_s"], last.get("slo"), last["end_unix_s"],
                             f"verdict of the last phase, {last['phase']}")
        head = f"{cur['index'] % n + 1}/{n} {cur['phase']} · expect {cur['expected']}"
        left = cur["start_unix_s"] + self.phase_s - time.time()
        tail = f"{left:.0f} s left" if left > 0 else "finishing its sweep"
        serve = " ".join(cur["serve_args"]) or "(defaults)"
        return PhaseInfo(f"{head} · ttft serve {serve} · {tail}", cur["start_unix_s"], cur.get("slo"),
                         cur.get("end_unix_s"), "this phase")

    def finished(self) -> list[dict[str, Any]]:
        """Records of the phases that ran to their end (copies)."""
        with self._lock:
            return [dict(r) for r in self._records if r.get("end_unix_s") is not None]

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._records]

    def check(self) -> str | None:
        """None while healthy; why not once the director failed or the engine died."""
        if self.error:
            return self.error
        eng = self._engine
        proc = getattr(eng, "proc", None)
        if proc is not None and not self._engine_stopping and proc.poll() is not None:
            return f"engine process exited with code {proc.returncode}"
        return None

    def set_verdict(self, index: int, verdict: dict[str, Any]) -> None:
        with self._lock:
            if index < len(self._records):
                self._records[index]["verdict"] = verdict
        self._write_meta()

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the probe process after its chunk in flight, then the engine (any thread)."""
        self._stop.set()
        if self._child_stop is not None:
            self._child_stop.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)

    # --- the director thread ----------------------------------------------------------------

    def _write_meta(self) -> None:
        doc = {"phases": [{k: v for k, v in r.items() if k not in ("slo", "index")} for r in self.records()],
               "phase_s": self.phase_s, "otlp": self.otlp_url, "device": self.device}
        if self.calibration is not None:
            doc["calibration"] = self.calibration.to_dict()
        self.live.writer.update_meta(kind="demo", demo=doc)

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # shown on screen / printed; the app keeps running
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def _run(self) -> None:
        from diag.scenarios.calibrate import calibrate

        port = self.live.start_otlp(0)
        if port is None:
            raise RuntimeError("the OTLP receiver did not start: " + "; ".join(self.live.notes[-1:]))
        self.otlp_url = f"http://127.0.0.1:{port}"
        cache = self.out / "calibration.json"
        self.status = ("reading this machine's calibration…" if cache.exists()
                       else "calibrating this machine (a few seconds: TTFT, prefill ms/token, decode step)…")
        self.calibration = calibrate(self.device, cache=cache)
        self.plans = build_plans(self.calibration)
        self._write_meta()
        k = 0
        while not self._stop.is_set():
            plan = self.plans[k % len(self.plans)]
            self._run_phase(k, plan)
            k += 1
            if not self.repeat and k >= len(self.plans):
                break
        self.status = "done: all phases ran (q quits; `ttft view` the capture to move back in time)"

    def _run_phase(self, k: int, plan: PhasePlan) -> None:
        """One phase: the probe process (spawned first: it imports while the engine starts),
        the engine process, its scraper; relay the probe's output into the capture."""
        import multiprocessing as mp

        from diag.scenarios.engine_process import EngineProcess

        args = [*plan.serve_args, "--device", self.device, "--otlp", self.otlp_url]
        record: dict[str, Any] = {"index": k, "phase": plan.name, "expected": plan.expected, "cause": plan.cause,
                                  "serve_args": list(plan.serve_args), "slo_spec": plan.slo_spec, "slo": plan.slo,
                                  "start_unix_s": None, "end_unix_s": None}
        with self._lock:
            self._records.append(record)
            self._current = record
        self.status = f"starting its engine: ttft serve {' '.join(plan.serve_args) or '(defaults)'}…"
        ctx = mp.get_context("spawn")
        inbox, outbox, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        child = ctx.Process(target=_probe_child, args=(plan, self.phase_s, inbox, outbox, stop),
                            name=f"ttft-demo-probe-{k}", daemon=True)
        child.start()
        self._child_stop = stop
        source = f"prometheus-{k}"
        eng = EngineProcess(args)
        self._engine_stopping = False
        self._engine = eng
        try:
            try:
                eng.start()
            except BaseException:
                inbox.put(None)
                raise
            self.live.start_prometheus(eng.url, interval_s=1.0, source=source)
            inbox.put(eng.url)
            self.status = "waiting for the probe"
            self._relay(k, record, child, outbox, stop)
        finally:
            stop.set()
            child.join(10)
            if child.is_alive():
                child.terminate()
                child.join(5)
            with self._lock:
                if record["start_unix_s"] is not None and record["end_unix_s"] is None:
                    record["end_unix_s"] = time.time()
            self._engine_stopping = True
            self.live.stop_collector(source)
            eng.stop()  # SIGINT: the engine flushes its last spans to the receiver
            with self._lock:
                self._current = None
            self._write_meta()

    def _relay(self, k: int, record: dict[str, Any], child: Any, outbox: Any, stop: Any) -> None:
        """Write what the probe process sends into the capture until it exits (director thread)."""
        import queue

        writer = self.live.writer
        while True:
            if self._stop.is_set():
                stop.set()
            try:
                msg = outbox.get(timeout=0.5)
            except queue.Empty:
                if not child.is_alive():
                    return
                continue
            kind = msg[0]
            if kind == "spans":
                writer.append_span_lines(msg[1])
            elif kind == "series":
                writer.append_series(f"client-{k}" if msg[1] == "client" else f"{msg[1]}-{k}", msg[2])
            elif kind == "meta":
                # the probe's health verdict is this phase's, not the capture's: kept per phase
                fields = {key: v for key, v in msg[1].items() if key not in ("kind", "client_health", "alongside")}
                if "client_health" in msg[1]:
                    with self._lock:
                        record["client_health"] = msg[1]["client_health"]
                if fields:
                    writer.update_meta(**fields)
            elif kind == "started":
                with self._lock:
                    record["start_unix_s"] = msg[1]
                self._write_meta()
            elif kind == "done":
                with self._lock:
                    record["end_unix_s"], record["passes"], record["requests"] = msg[1], msg[2], msg[3]
            elif kind == "error":
                self.error = str(msg[1])
            elif kind == "exit":
                return


def _pick_device(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def run(args: argparse.Namespace) -> int:
    from diag.cli import UsageError

    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be > 0 seconds")
    if args.refresh <= 0 or (args.window is not None and args.window <= 0):
        raise UsageError("--refresh and --window must be > 0 seconds")
    headless = args.no_tui or not (sys.stdin.isatty() and sys.stdout.isatty())
    duration = args.duration if args.duration is not None else (60.0 if headless else None)
    phase_s = duration / len(PHASES) if duration is not None else DASHBOARD_PHASE_S
    out = Path(args.output or f"ttft-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    from collectors.feeds import CallableMonitor
    from collectors.live import LiveCollection
    from tui.sources import LiveSource

    live = LiveCollection(out, meta={"kind": "demo"})
    device = _pick_device(args.device)
    director = Director(live, out, device, phase_s, repeat=duration is None)
    if not live.start_nvml():
        live.notes.append("no GPU counters: the GPU panel shows the engine's busy timeline")
    live.notes.append("py-spy: not sampled in the demo (attaching needs ptrace rights); see `ttft profile`")
    live.start_pump()
    window_s = args.window or max(60.0, 4 * phase_s)
    source = LiveSource(out, window_s=window_s, retention_s=max(300.0, 3 * phase_s * len(PHASES)),
                        monitors=[CallableMonitor("demo", director.check)], phase_fn=director.phase_info,
                        title="ttft demo")
    # the probe processes are spawned later, under the dashboard, which replaces sys.stderr:
    # multiprocessing's resource tracker (which hands its child stderr's fd) must start now
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    director.thread.start()
    try:
        if headless:
            code = _headless(source, director, phase_s)
            if args.output and code == 0:
                _write_report(source, out)
        else:
            from tui.app import run_app

            def add_late_monitors() -> None:
                while not director.done.is_set() and not director.otlp_url:
                    time.sleep(0.2)
                for m in live.monitors():
                    source.add_monitor(m)
                for n in live.notes:
                    source.add_note(n)

            threading.Thread(target=add_late_monitors, name="ttft-demo-monitors", daemon=True).start()
            code = run_app(source, refresh_s=args.refresh)
    finally:
        director.stop()
        live.stop()
    print(f"ttft demo: capture written to {out} (open it with: ttft view {out})", file=sys.stderr)
    return code


def _headless(source: Any, director: Director, phase_s: float) -> int:
    """Run each phase once; after each, print its verdict (rules over the phase's time range
    with the phase's SLOs)."""
    from tui import adapters

    n = len(PHASES)
    print(f"ttft demo: no terminal; calibrating, then {n} phases of {phase_s:.0f} s of load, each on its own "
          "engine process", file=sys.stderr)
    for note in director.live.notes:
        print(f"note: {note}", file=sys.stderr)
    printed = 0
    ok = 0
    while True:
        done = director.finished()
        while printed < len(done):
            time.sleep(1.0)  # the OTLP receiver writes the engine's last batch
            ph = done[printed]
            hit = _print_phase(source, adapters, ph, printed + 1, n, director)
            ok += hit
            printed += 1
        if director.done.is_set() and printed >= len(director.finished()):
            break
        time.sleep(0.3)
    if director.error:
        print(f"ttft demo: error: {director.error}", file=sys.stderr)
        return 2
    print(f"ttft demo: {ok}/{printed} phases got their expected verdict")
    sys.stdout.flush()
    return 0 if printed else 1


def _write_report(source: Any, out: Path) -> None:
    """The report over the whole capture (as ``ttft report`` would write it), path printed."""
    from tui import adapters

    snap = source.poll()
    run = adapters.run_rules(snap.tables, None)
    try:
        path = adapters.write_report(snap.tables, None, run.diagnosis, out, str(out))
    except OSError as exc:
        print(f"ttft demo: report not written: {exc}", file=sys.stderr)
        return
    print(f"report: {path}")
    sys.stdout.flush()


def _print_phase(source: Any, adapters: Any, ph: dict[str, Any], i: int, n: int, director: Director) -> bool:
    """One line per phase: phase, expected, verdict (confidence); True when they agree."""
    snap = source.poll()
    window = (int(ph["start_unix_s"] * 1e9), int(ph["end_unix_s"] * 1e9))
    run = adapters.run_rules(snap.tables, window, slo=ph.get("slo"))
    v = getattr(run.diagnosis, "verdict", None)
    cat = str(getattr(v, "category", "none")) if v is not None else "none"
    conf = float(getattr(v, "confidence", 0.0) or 0.0) if v is not None else 0.0
    hit = cat == ph["expected"]
    dur = ph["end_unix_s"] - ph["start_unix_s"]
    print(f"phase {i}/{n} {ph['phase']}: expected {ph['expected']}, verdict {cat} (confidence {conf:.2f}) "
          f"[{'ok' if hit else 'MISS'}] — {run.requests} requests in {dur:.0f} s; ttft serve "
          f"{' '.join(ph['serve_args']) or '(defaults)'}")
    if v is not None:
        print(f"    {getattr(v, 'title', '')}")
    sys.stdout.flush()
    director.set_verdict(ph["index"], {"category": cat, "confidence": round(conf, 3), "ok": hit,
                                       "title": str(getattr(v, "title", "")) if v is not None else ""})
    return hit
