"""``ttft demo``: ``ttft watch`` on a series of bundled engines whose bottleneck changes.

Phases, in order (then again, until q, in the dashboard), each sized from a calibration of
this machine (``diag.analysis.scenarios.calibrate``) by the scenario catalog (``diag.analysis.scenarios.catalog``):

1. healthy: default engine, light load, held to the catalog's SLOs (so the rules can say so);
2. long prompts: a prompt-length sweep (prefill compute grows with the prompt);
3. KV pressure: ``--kv-blocks`` for about three sequences under a concurrency sweep;
4. slow tokenizer: ``--inject tokenize_ms_per_token=…`` under a prompt sweep.

The phases are run by :class:`diag.analysis.scenarios.director.Director` into one live capture
(:class:`collectors.live.LiveCollection`); this command wires it to the dashboard, or, headless,
prints the verdict of each phase. The dashboard's verdict window starts at the current phase's
start, so the verdict follows the phase.

Threading: the director runs on its own thread; the main thread runs the app or the headless
loop.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.analysis.scenarios.director import Director

#: seconds of load per phase in the dashboard (headless: --duration / phases)
DASHBOARD_PHASE_S = 15.0


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
    p.add_argument("-d", "--duration", type=float, metavar="S", default=None,
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


def _pick_device(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top of the module: ``ttft --help`` imports every command module
    from collectors.feeds import CallableMonitor
    from collectors.live import LiveCollection
    from diag.cli import UsageError
    from diag.analysis.scenarios.director import PHASES, Director
    from tui.sources import LiveSource

    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be > 0 seconds")
    if args.refresh <= 0 or (args.window is not None and args.window <= 0):
        raise UsageError("--refresh and --window must be > 0 seconds")
    headless = args.no_tui or not (sys.stdin.isatty() and sys.stdout.isatty())
    duration = args.duration if args.duration is not None else (60.0 if headless else None)
    phase_s = duration / len(PHASES) if duration is not None else DASHBOARD_PHASE_S
    out = Path(args.output or f"ttft-demo-{time.strftime('%Y%m%d-%H%M%S')}")
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
            code = _headless(source, director, phase_s, len(PHASES))
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


def _headless(source: Any, director: Director, phase_s: float, n: int) -> int:
    """Run each of the ``n`` phases once; after each, print its verdict (rules over the phase's
    time range with the phase's SLOs)."""
    from tui import adapters

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
