"""The ``ttft demo`` scenario runner: calibrate, then phases whose bottleneck changes.

:data:`PHASES` names each phase and the catalog scenario (:mod:`diag.analysis.scenarios.catalog`)
whose plan and ground truth it uses; :func:`build_plans` sizes them from a calibration.
:class:`Director` runs them into one live capture (:class:`collectors.live.LiveCollection`):
per phase its own engine process (``ttft serve`` with the phase's arguments, exporting spans
to the collection's OTLP receiver), a /metrics scraper of that engine, and its own probe
process (:mod:`diag.analysis.scenarios.phase_probe`). meta.json's ``demo.phases`` records each phase
(name, start/end Unix s, serve arguments, expected category, and in headless runs the
verdict); :meth:`Director.phase_info` tells a live view which phase is on.

Threading: the director thread calibrates, then per phase starts the probe process and the
engine process and relays the probe's output into the capture; the scraper, the OTLP
receiver and the series pump have their own threads.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.feeds import PhaseInfo
from collectors.live import LiveCollection
from diag.analysis.scenarios.calibrate import Calibration, calibrate
from diag.analysis.scenarios.catalog import ProbeStep, get
from diag.analysis.scenarios.engine_process import EngineProcess
from diag.analysis.scenarios.phase_probe import probe_child
from diag.ground.slo import parse_slo

#: (phase name, catalog scenario whose plan and ground truth the phase uses)
PHASES: tuple[tuple[str, str], ...] = (
    ("healthy", "healthy"),
    ("long prompts", "prefill_compute"),
    ("KV pressure", "kv_cache"),
    ("slow tokenizer", "tokenize"),
)


@dataclass(frozen=True)
class PhasePlan:
    """One phase resolved against the calibration: its engine arguments, probe steps, SLOs."""

    name: str
    expected: str  # the category a correct verdict names (the catalog's ground truth)
    cause: str
    serve_args: tuple[str, ...]
    steps: tuple[ProbeStep, ...]
    slo_spec: str | None
    slo: dict[str, float] | None


def build_plans(cal: Calibration) -> list[PhasePlan]:
    """The demo's phases from the scenario catalog, sized for ``cal``."""
    plans = []
    for name, scenario in PHASES:
        sc = get(scenario)
        plan = sc.build(cal)
        phase = plan.phases[0]
        plans.append(PhasePlan(name, sc.category, sc.cause, tuple(phase.serve_args), tuple(phase.steps),
                               plan.slo, parse_slo(plan.slo) if plan.slo else None))
    return plans


class Director:
    """Calibrates, then runs the phases: engine process, scraper and probe per phase.

    Threading: :meth:`run` runs on the director thread; :meth:`phase_info`, :meth:`check`,
    :meth:`finished` and :meth:`stop` may be called from any thread (plain attribute reads
    and a lock around the phase records).
    """

    def __init__(self, live: LiveCollection, out: Path, device: str, phase_s: float, repeat: bool) -> None:
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

    def phase_info(self) -> PhaseInfo:
        """The header's phase label, the window (the current phase; between phases, the one
        that just ended) and the phase's SLOs, as a PhaseInfo."""
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
        child = ctx.Process(target=probe_child, args=(plan, self.phase_s, inbox, outbox, stop),
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
