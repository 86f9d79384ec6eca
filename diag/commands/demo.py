"""``ttft demo``: the bundled engine under a scripted workload whose bottleneck changes, watched
live (or, with no terminal or ``--no-tui``, run headless and print the verdict per phase).

Phases, in order (then again, until q, in the dashboard):

1. healthy: 2 clients, short prompts;
2. long prompts: 2 clients, 300-700-token prompts (prefill compute grows with prompt length);
3. KV pressure: 8 clients, ~400-token prompts against a KV cache that holds about four;
4. slow tokenizer: 2 clients, ~200-token prompts with ``tokenize_ms_per_token=2`` injected.

Sized for two CPU cores: each phase completes tens of requests in 15-20 s.

The engine runs in this process (``diag.engine``) on a free port; the probe drives it over
HTTP (client TTFT, joined to the engine's spans by ``traceparent``); /metrics is scraped; NVML
is sampled when a GPU is there. Fault injections are switched per phase on the running engine
and written to the capture's meta.json (``demo.phases``). Everything goes into one capture.

Threading: the engine (step loop, HTTP server), the probe, the scraper and the series pump
each run on their own threads; this module's main thread runs the app or the headless loop.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DemoPhase:
    """One scripted phase: closed-loop clients, prompt lengths (tokens, uniform between the
    two; a spread lets the rules fit TTFT against prompt length), injected faults."""

    name: str
    what: str
    concurrency: int
    input_tokens: tuple[int, int]
    faults: dict[str, float] = field(default_factory=dict)


PHASES: tuple[DemoPhase, ...] = (
    DemoPhase("healthy", "2 clients, 32-64-token prompts", 2, (32, 64)),
    DemoPhase("long prompts", "2 clients, 300-700-token prompts: prefill grows with prompt length", 2, (300, 700)),
    DemoPhase("KV pressure", "8 clients, 350-450-token prompts: the KV cache holds about four", 8, (350, 450)),
    DemoPhase("slow tokenizer", "2 clients, 150-250-token prompts, tokenize_ms_per_token=2 injected", 2,
              (150, 250), {"tokenize_ms_per_token": 2.0}),
)
#: KV-cache blocks of 16 tokens (2,048 tokens): two long prompts fit (<= 90 blocks), eight
#: 400-token ones (about 210 blocks) do not
KV_BLOCKS = 128
OUTPUT_TOKENS = 16
CHUNK_S = 4.0  # the probe writes its spans after each chunk of load


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo",
        help="watch the verdict change: the bundled engine under a workload whose bottleneck changes",
        description="Start the bundled engine in this process, drive it through four phases (healthy, long "
        "prompts, KV pressure, slow tokenizer) and show the live dashboard with the current phase. Without a "
        "terminal (or with --no-tui) it runs for --duration seconds and prints the verdict of each phase.",
    )
    p.add_argument("--no-tui", action="store_true", help="run headless and print the verdict per phase")
    p.add_argument("--duration", type=float, metavar="S", default=None,
                   help="total seconds, split evenly over the phases (default: headless 60; dashboard: "
                   "20 s per phase, repeating until q)")
    p.add_argument("-o", "--output", metavar="CAPTURE", default=None,
                   help="capture directory (default ./ttft-demo-YYYYmmdd-HHMMSS)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the engine runs (auto: cuda when available)")
    p.add_argument("--window", type=float, metavar="S", default=None,
                   help="analysis window in the dashboard (default: one phase)")
    p.add_argument("--refresh", type=float, metavar="S", default=1.0, help="seconds between screen refreshes")
    return p


class Script:
    """Which phase is on, by wall-clock time; switches the engine's faults at phase changes.

    ``plan`` runs on the probe thread; ``phase_label`` on the frame worker; both only read
    and assign plain attributes (the engine reads ``Engine.faults`` at use time).
    """

    def __init__(self, engine: Any, writer: Any, phase_s: float, repeat: bool) -> None:
        self.engine = engine
        self.writer = writer
        self.phase_s = phase_s
        self.repeat = repeat
        self.t0 = time.time()
        self.current = -1
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def index_at(self, t: float) -> int | None:
        k = int((t - self.t0) // self.phase_s)
        if k >= len(PHASES) and not self.repeat:
            return None
        return k

    def _enter(self, k: int) -> None:
        from diag.engine import FaultConfig

        ph = PHASES[k % len(PHASES)]
        self.engine.faults = FaultConfig(**ph.faults)
        start = self.t0 + k * self.phase_s
        with self._lock:
            if self.log:
                self.log[-1]["end_unix_s"] = start
            self.log.append({"phase": ph.name, "what": ph.what, "start_unix_s": start,
                             "end_unix_s": start + self.phase_s, "concurrency": ph.concurrency,
                             "input_tokens": ph.input_tokens, "faults": dict(ph.faults)})
            self.current = k
            phases = [dict(p) for p in self.log]
        self.writer.update_meta(demo={"phases": phases, "phase_s": self.phase_s},
                                faults_injected={p.name: dict(p.faults) for p in PHASES if p.faults})

    def plan(self, session: Any) -> tuple[Any, Any, str | None] | None:
        from collectors.probe import LengthSpec, LoadSpec

        now = time.time()
        k = self.index_at(now)
        if k is None and self.current >= len(PHASES) - 1:
            return None
        if k is None or k > self.current + 1:
            # a chunk overran into a later phase: never skip one, shift the schedule instead
            k = self.current + 1
            self.t0 = now - k * self.phase_s
        if k != self.current:
            self._enter(k)
        ph = PHASES[k % len(PHASES)]
        left = self.t0 + (k + 1) * self.phase_s - now
        load = LoadSpec(concurrency=ph.concurrency, duration_s=max(0.5, min(CHUNK_S, left)))
        lo, hi = ph.input_tokens
        return load, session.workload.with_input(LengthSpec("uniform", lo, hi)), ph.name

    def phase_label(self) -> str:
        k = self.index_at(time.time())
        if k is None or (not self.repeat and self.current >= len(PHASES) - 1 and k >= len(PHASES)):
            return "done: all phases ran (q quits; ←/→ in `ttft view` on the capture)"
        if self.current < 0:
            return "starting the probe…"
        ph = PHASES[k % len(PHASES)]
        left = self.t0 + (k + 1) * self.phase_s - time.time()
        return f"{k % len(PHASES) + 1}/{len(PHASES)} {ph.name} — {ph.what} ({max(0, left):.0f} s left)"

    def phases(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(p) for p in self.log]


def _engine_config(device: str) -> Any:
    from diag.engine import EngineConfig

    return EngineConfig(model="tiny", device=device, kv_blocks=KV_BLOCKS, max_running=32, max_context=2048)


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
    headless = args.no_tui or not (sys.stdin.isatty() and sys.stdout.isatty())
    duration = args.duration if args.duration is not None else (60.0 if headless else None)
    phase_s = duration / len(PHASES) if duration is not None else 20.0
    out = args.output or f"ttft-demo-{time.strftime('%Y%m%d-%H%M%S')}"
    from tui.collect import LiveCollection
    from tui.sources import CallableMonitor, LiveSource

    live = LiveCollection(out, meta={"kind": "demo"})
    state: dict[str, Any] = {"script": None, "srv": None, "error": "", "status": "starting the engine…"}

    def start_all() -> None:
        """Engine, scraper, NVML, probe (a background thread, so the dashboard is up at once)."""
        try:
            from collectors.spans import setup_tracing
            from diag.engine import ServerThread, build_engine

            device = _pick_device(args.device)
            sink = setup_tracing("ttft-engine", writer=live.writer)
            try:
                engine = build_engine(_engine_config(device), trace_sink=sink)
            except Exception as exc:
                if device == "cpu":
                    raise
                live.notes.append(f"engine on {device} failed ({exc}); using the CPU")
                engine = build_engine(_engine_config("cpu"), trace_sink=sink)
            srv = ServerThread(engine, "127.0.0.1", 0, own_engine=True).start()
            state["srv"] = srv
            live.start_prometheus(srv.url, interval_s=1.0)
            if not live.start_nvml():
                live.notes.append("no GPU counters: the GPU panel shows the engine's busy timeline")
            live.notes.append("py-spy: not sampled in the demo (attaching needs ptrace rights); see `ttft profile`")
            live.start_pump()
            script = Script(engine, live.writer, phase_s, repeat=duration is None)
            state["script"] = script
            live.start_probe(srv.url, script.plan, input_tokens=PHASES[0].input_tokens[0],
                             output_tokens=OUTPUT_TOKENS, concurrency=16)
            state["status"] = ""
        except Exception as exc:
            state["error"] = f"the engine did not start: {type(exc).__name__}: {exc}"

    def phase() -> str | None:
        script = state["script"]
        return script.phase_label() if script is not None else state["status"] or None

    def engine_alive() -> str | None:
        if state["error"]:
            return state["error"]
        srv = state["srv"]
        eng = getattr(srv, "engine", None)
        err = getattr(eng, "loop_error", None)
        return f"engine step loop died: {type(err).__name__}: {err}" if err is not None else None

    starter = threading.Thread(target=start_all, name="ttft-demo-start", daemon=True)
    starter.start()
    window_s = args.window or max(10.0, phase_s)
    source = LiveSource(out, window_s=window_s, retention_s=max(300.0, 3 * phase_s * len(PHASES)),
                        monitors=[CallableMonitor("engine", engine_alive)], phase_fn=phase, title="ttft demo")
    try:
        if headless:
            code = _headless(source, state, starter, live, phase_s, len(PHASES))
        else:
            from tui.app import run_app

            def add_late_monitors() -> None:
                starter.join()
                for m in live.monitors():
                    source.add_monitor(m)
                for n in live.notes:
                    source.add_note(n)

            threading.Thread(target=add_late_monitors, daemon=True).start()
            code = run_app(source, refresh_s=args.refresh)
    finally:
        _shutdown(state, live)
    print(f"ttft demo: capture written to {out} (open it with: ttft view {out})", file=sys.stderr)
    return code


def _shutdown(state: dict[str, Any], live: Any) -> None:
    if live.probe is not None:
        live.probe.stop()
    srv = state.get("srv")
    if srv is not None:
        try:
            srv.stop()
        except Exception:
            pass
    script = state.get("script")
    if script is not None:
        live.writer.update_meta(demo={"phases": script.phases(), "phase_s": script.phase_s})
    live.stop()


def _headless(source: Any, state: dict[str, Any], starter: threading.Thread, live: Any, phase_s: float,
              n_phases: int) -> int:
    """Run the phases, then print each phase's verdict (rules over the phase's time range)."""
    from tui import adapters

    print(f"ttft demo: no terminal; running {n_phases} phases of {phase_s:.0f} s headless", file=sys.stderr)
    starter.join()
    if state["error"]:
        print(f"ttft demo: error: {state['error']}", file=sys.stderr)
        return 2
    for n in live.notes:
        print(f"note: {n}", file=sys.stderr)
    script = state["script"]
    printed = 0
    while True:
        now = time.time()
        end = script.t0 + n_phases * phase_s
        done = [p for p in script.phases() if p["end_unix_s"] + 2.0 <= now]
        while printed < len(done):
            _print_phase(source, adapters, done[printed], printed + 1, n_phases)
            printed += 1
        if printed >= n_phases or now > end + 30:
            break
        if state["srv"] is not None and getattr(state["srv"].engine, "loop_error", None) is not None:
            print(f"ttft demo: error: engine step loop died: {state['srv'].engine.loop_error}", file=sys.stderr)
            return 2
        time.sleep(0.5)
    return 0 if printed else 1


def _print_phase(source: Any, adapters: Any, ph: dict[str, Any], i: int, n: int) -> None:
    snap = source.poll()
    window = (int(ph["start_unix_s"] * 1e9), int(ph["end_unix_s"] * 1e9))
    run = adapters.run_rules(snap.tables, window)
    v = getattr(run.diagnosis, "verdict", None)
    req = snap.tables.requests
    if len(req):
        st = req["start_ns"]
        n_req = int(((st >= window[0]) & (st < window[1])).sum())
    else:
        n_req = 0
    print(f"phase {i}/{n} {ph['phase']}: {ph['what']} — {n_req} requests")
    if v is None:
        print("  verdict: none")
        return
    conf = getattr(v, "confidence", 0.0) or 0.0
    print(f"  verdict: {getattr(v, 'category', '')} (confidence {conf:.2f}) - {getattr(v, 'title', '')}")
    for e in list(getattr(v, "evidence", []) or [])[:3]:
        from tui.fmt import fmt_value

        thr = getattr(e, "threshold", None)
        print(f"    {e.name}: {fmt_value(e.value, e.unit)}" + (f" (threshold {thr})" if thr not in (None, "") else ""))
    sys.stdout.flush()
