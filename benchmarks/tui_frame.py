"""TUI frame budget: one frame with 100,000 requests in the analysis window.

A frame is what the app does every refresh: the rules (features + findings) over the window,
the view model (percentiles, sparklines, stage bar, throughput, KV, GPU, slowest requests),
and the widget update on the UI thread (panels repainted in a headless Textual app).
The tables are built once, from a synthetic span table with the real table builder.

The rules do not run every frame: they have their own worker (the frame shows the latest
verdict, marked "updating…" while a new one is computed), and they see at most
``tui.adapters.RULES_MAX_REQUESTS`` of the window's most recent requests. Their time is
printed apart, capped and uncapped.

Prints each part in ms and the frame as a ratio against a baseline measured in the same
run: pandas ``describe`` (with p50/p95/p99) over the same request columns. Budget
(docs/design.md): a frame under 50 ms; data work off the UI thread (only the widget update runs
on it).

Usage: python benchmarks/tui_frame.py [--requests N] [--repeat K]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diag.ground import stages  # noqa: E402
from diag.ground.capture import Capture  # noqa: E402
from diag.ground.tables import Tables, build_tables  # noqa: E402

NS = 1_000_000_000
STAGES = (stages.TOKENIZE, stages.QUEUE, stages.PREFILL, stages.SAMPLE, stages.DETOKENIZE)


def synthetic_tables(n: int, duration_s: float = 1000.0, gpus: int = 8, seed: int = 1) -> Tables:
    """``n`` server requests (5 stage spans each, 16 token times), one engine step per
    request and 1 Hz NVML-style series for ``gpus`` GPUs, spread over ``duration_s``."""
    rng = np.random.default_rng(seed)
    t0 = 1_700_000_000 * NS
    start = np.sort(t0 + (rng.random(n) * duration_s * NS).astype(np.int64))
    dur_ms = {
        stages.TOKENIZE: rng.gamma(2, 0.5, n), stages.QUEUE: rng.gamma(2, 20, n) * (start > start[n // 2]),
        stages.PREFILL: rng.gamma(4, 5, n), stages.SAMPLE: rng.gamma(2, 0.2, n), stages.DETOKENIZE: rng.gamma(2, 0.1, n),
    }
    trace = np.array([f"{i:032x}" for i in range(1, n + 1)], dtype=object)
    span_ids = np.array([f"{i:016x}" for i in range(1, n * 7 + 1)], dtype=object)
    names, tids, sids, pids, starts, ends = [], [], [], [], [], []
    cur = start.copy()
    for k, st in enumerate(STAGES):
        d = (dur_ms[st] * 1e6).astype(np.int64)
        names.append(np.full(n, st, dtype=object))
        tids.append(trace)
        sids.append(span_ids[(k + 1) * n:(k + 2) * n])
        pids.append(span_ids[:n])
        starts.append(cur.copy())
        ends.append(cur + d)
        cur = cur + d
    first = cur
    itl = rng.gamma(4, 2.5, (n, 15)) * 1e6
    token_times = np.concatenate([first[:, None], first[:, None] + np.cumsum(itl, axis=1).astype(np.int64)], axis=1)
    root_end = token_times[:, -1]
    step_start = first - (dur_ms[stages.PREFILL] * 1e6).astype(np.int64)
    names = [np.full(n, stages.SPAN_REQUEST, dtype=object)] + names + [np.full(n, stages.SPAN_ENGINE_STEP, dtype=object)]
    tids = [trace] + tids + [np.array([f"{i:032x}" for i in range(n + 1, 2 * n + 1)], dtype=object)]
    sids = [span_ids[:n]] + sids + [span_ids[6 * n:7 * n]]
    pids = [np.full(n, "", dtype=object)] + pids + [np.full(n, "", dtype=object)]
    starts = [start] + starts + [step_start]
    ends = [root_end] + ends + [first]
    m = 7 * n
    spans = pd.DataFrame({
        "trace_id": np.concatenate(tids), "span_id": np.concatenate(sids), "parent_span_id": np.concatenate(pids),
        "name": np.concatenate(names), "kind": np.zeros(m, dtype=np.int64), "service": "bench",
        "start_ns": np.concatenate(starts), "end_ns": np.concatenate(ends), "status_code": 0,
        "source_file": "synthetic",
    })
    empty = np.full(m, None, dtype=object)

    def attr(root: Any = None, step: Any = None) -> np.ndarray:
        col = empty.copy()
        if root is not None:
            col[:n] = root
        if step is not None:
            col[6 * n:] = step
        return col

    tokens_in = rng.integers(32, 4096, n)
    spans[stages.ATTR_REQUEST_ID] = attr(np.array([f"req-{i}" for i in range(n)], dtype=object))
    spans[stages.GEN_AI_USAGE_INPUT_TOKENS] = attr(tokens_in)
    spans[stages.GEN_AI_USAGE_OUTPUT_TOKENS] = attr(np.full(n, 16))
    spans[stages.ATTR_FIRST_TOKEN_NS] = attr(first)
    tt = np.empty(n, dtype=object)
    tt[:] = list(token_times)
    spans[stages.ATTR_TOKEN_TIMES_NS] = attr(tt)
    spans[stages.ATTR_STEP_PREFILL_TOKENS] = attr(step=tokens_in)
    spans[stages.ATTR_STEP_DECODE_SEQS] = attr(step=rng.integers(0, 64, n))
    spans[stages.ATTR_STEP_KV_USAGE] = attr(step=np.clip(np.linspace(0.2, 0.97, n) + rng.normal(0, 0.02, n), 0, 1))
    spans[stages.ATTR_STEP_WAITING] = attr(step=rng.integers(0, 20, n))
    spans[stages.ATTR_STEP_RUNNING] = attr(step=rng.integers(1, 64, n))
    for col in ("name", "service"):
        spans[col] = spans[col].astype("category")
    ts = np.arange(0, duration_s, 1.0) + t0 / NS
    rows = []
    for g in range(gpus):
        for name, val in ((stages.SERIES_GPU_UTIL_PCT, rng.uniform(40, 100, len(ts))),
                          (stages.SERIES_HBM_USED_BYTES, np.full(len(ts), 60e9)),
                          (stages.SERIES_HBM_TOTAL_BYTES, np.full(len(ts), 80e9)),
                          (stages.SERIES_MEM_UTIL_PCT, rng.uniform(10, 60, len(ts))),
                          (stages.SERIES_PCIE_TX_BYTES_PER_S, rng.uniform(1e8, 1e9, len(ts)))):
            rows.append(pd.DataFrame({"ts_s": ts, "source": "nvml", "series": name, "entity": f"gpu{g}", "value": val}))
    series = pd.concat(rows, ignore_index=True).sort_values("ts_s", kind="stable").reset_index(drop=True)
    return build_tables(Capture(Path("synthetic"), {}, spans, series))


class _FixedSource:
    """A source that always returns the same tables over the whole extent."""

    live = False

    def __init__(self, tables: Tables) -> None:
        from tui.sources import _extent

        self.tables = tables
        self.title = "benchmark"
        self.extent = _extent(tables)
        self.path = "synthetic"

    def poll(self) -> Any:
        from tui.sources import Snapshot

        return Snapshot(self.tables, self.extent, self.extent, 1, False, self.title, whole=True)

    def move(self, steps: int) -> bool:
        return False

    def zoom(self, factor: float) -> bool:
        return False

    def reset_window(self) -> None:
        return None

    def close(self) -> None:
        return None


def _perturbed(vm: Any, i: int) -> Any:
    """A copy of ``vm`` in which every panel's part differs, so that every panel repaints."""
    import copy

    v = copy.deepcopy(vm)
    eps = (i + 1) * 1e-6
    v.verdict.confidence = min(1.0, v.verdict.confidence + eps)
    v.latency.ttft_p50_s = (v.latency.ttft_p50_s or 0) + eps
    v.stages.ttft_mean_s = (v.stages.ttft_mean_s or 0) + eps
    v.throughput.req_per_s = (v.throughput.req_per_s or 0) + eps
    v.busy.busy_pct = (v.busy.busy_pct or 0) + eps
    for g in v.gpus:
        g.util_pct = (g.util_pct or 0) + eps
    v.slowest = list(reversed(v.slowest)) if i % 2 else v.slowest
    return v


async def _widget_update_ms(source: _FixedSource, vm: Any, repeat: int) -> tuple[list[float], list[float]]:
    """UI-thread cost: apply a view model in which every panel changed and let the app
    repaint; also the same wait with nothing to repaint (the harness's own overhead)."""
    from tui.app import TTFTApp

    app = TTFTApp(source, refresh_s=3600)
    busy, idle = [], []
    async with app.run_test(size=(160, 50)) as pilot:
        while app.last_vm is None or app.rules_run is None:
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        for i in range(repeat):
            v = _perturbed(vm, i)
            t = time.perf_counter()
            app._apply(v, "")
            await pilot.pause()
            busy.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            await pilot.pause()
            idle.append((time.perf_counter() - t) * 1e3)
    return busy, idle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from tui import adapters
    from tui.model import build_view_model

    t = time.perf_counter()
    tables = synthetic_tables(args.requests)
    print(f"setup: {len(tables.requests):,} requests, {len(tables.steps):,} steps, {len(tables.series):,} series rows, "
          f"{len(tables.spans):,} spans, built in {time.perf_counter() - t:.1f} s")
    print("rule engine: rules.run_rules")
    source = _FixedSource(tables)
    snap = source.poll()
    cols = ["ttft_s", "itl_p50_s", "itl_p99_s", "input_tokens", "output_tokens"] + [stages.stage_column(s) for s in STAGES]
    med = statistics.median
    # the rules: their own worker, throttled; capped to the window's most recent requests
    rules_capped = []
    run = None
    for _ in range(3):
        run = adapters.run_rules(tables, snap.window_ns)
        rules_capped.append(run.elapsed_s * 1e3)
    assert run is not None
    full = adapters.run_rules(tables, snap.window_ns, max_requests=10**12)
    base, view = [], []
    vm = None
    for _ in range(args.repeat):
        t = time.perf_counter()
        tables.requests[cols].describe(percentiles=[0.5, 0.95, 0.99])
        base.append((time.perf_counter() - t) * 1e3)
        vm = build_view_model(snap, run)
        view.append(vm.timings_ms["view"])
    assert vm is not None
    busy, idle = asyncio.run(_widget_update_ms(source, vm, args.repeat))
    ui = max(0.0, med(busy) - med(idle))
    frame = med(view) + ui
    print(f"verdict: {vm.verdict.title} ({vm.verdict.category}, {vm.verdict.confidence:.0%})")
    print(f"  {vm.verdict.scope or 'rules over the whole window'}")
    print(f"baseline (pandas describe, {len(cols)} request columns):  {med(base):7.1f} ms")
    print(f"view model (worker thread):                     {med(view):7.1f} ms")
    print(f"widget update + repaint (UI thread):            {ui:7.1f} ms  "
          f"(apply + repaint {med(busy):.1f} ms minus the harness's idle wait {med(idle):.1f} ms)")
    print(f"frame = view model + widget update:             {frame:7.1f} ms  = {frame / med(base):.2f}x baseline  "
          f"(budget 50 ms: {'OK' if frame < 50 else 'OVER'})")
    print(f"rules, capped at {adapters.RULES_MAX_REQUESTS:,} requests (own worker):  {med(rules_capped):7.1f} ms"
          f"  = {med(rules_capped) / med(base):.1f}x baseline")
    print(f"rules over all {full.requests:,} requests (not used by the app): {full.elapsed_s * 1e3:7.1f} ms"
          f"  = {full.elapsed_s * 1e3 / med(base):.1f}x baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
