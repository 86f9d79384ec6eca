"""Tracing overhead of the bundled engine: the same workload with tracing on and off, interleaved.

Budget (docs/design.md): < 1 % of throughput and of TTFT p50. Tracing "on" writes a real capture
(spans.otlp.jsonl) through collectors.spans; "off" is NULL_SINK. Rounds alternate off/on so that
drift (thermal, neighbours) hits both sides. Prints throughput and TTFT p50 ratios (on / off).
Between rounds (untimed) the sink is flushed, so no background span work spills into the next
round; the background cost (building SDK spans, OTLP encoding, writing the capture: on the
sink's threads) is also timed apart and printed per span.

Run: ``python benchmarks/engine_tracing_overhead.py [--rounds 12] [--device cpu]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.spans import NULL_SINK, setup_tracing  # noqa: E402
from diag.bundled_engine import SamplingParams, build_engine  # noqa: E402


def run_round(engine, n_requests: int, prompt: str, max_tokens: int, waves: int = 1) -> tuple[float, list[float]]:
    """``waves`` times: submit ``n_requests`` at once, wait for all; return (output tokens/s, TTFTs in s)."""
    lock = threading.Lock()
    state = {"left": n_requests, "tokens": 0}
    done = threading.Event()
    ttfts: list[float] = []
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    def make_cb(t0: int):
        first = [True]

        def cb(ev):
            now = time.time_ns()
            with lock:
                if first[0] and ev.token_id is not None:
                    first[0] = False
                    ttfts.append((now - t0) / 1e9)
                if ev.token_id is not None:
                    state["tokens"] += 1
                if ev.finished:
                    state["left"] -= 1
                    if state["left"] == 0:
                        done.set()
        return cb

    t_start = time.perf_counter()
    for _ in range(waves):
        done.clear()
        state["left"] = n_requests
        for _ in range(n_requests):
            t0 = time.time_ns()
            engine.submit(make_cb(t0), params, prompt=prompt, arrival_ns=t0)
        done.wait(300)
    wall = time.perf_counter() - t_start
    return state["tokens"] / wall, ttfts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=12, help="rounds per side (interleaved)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--aa", action="store_true", help="A/A control: tracing off on both sides (the noise floor)")
    ap.add_argument("--waves", type=int, default=1, help="back-to-back batches of --requests per round")
    ap.add_argument("--defer-build", action="store_true",
                    help="diagnostic: the span-build thread builds only at the untimed flush between rounds, so "
                    "a round pays the span calls on the engine's thread but not the build competing for the GIL")
    ns = ap.parse_args(argv)

    engine = build_engine(model=ns.model, device=ns.device, max_running=ns.requests)
    prompt = "the server queue and the cache blocks " * (ns.prompt_words // 7 + 1)
    with tempfile.TemporaryDirectory() as tmp:
        sink = (setup_tracing(service_name="ttft-engine", capture_dir=Path(tmp) / "cap", export_interval_s=3600,
                              build_batch=1 << 30) if ns.defer_build
                else setup_tracing(service_name="ttft-engine", capture_dir=Path(tmp) / "cap"))
        run_round(engine, ns.requests, prompt, ns.max_tokens)  # warm both paths
        engine.set_trace_sink(sink)
        run_round(engine, ns.requests, prompt, ns.max_tokens)
        res: dict[str, list[tuple[float, list[float]]]] = {"off": [], "on": []}
        cpu: dict[str, list[float]] = {"off": [], "on": []}  # process CPU s per round, flush included
        for i in range(2 * ns.rounds):
            side = "off" if i % 2 == 0 else "on"
            if (i // 2) % 2 == 1:  # ABBA order: off,on,on,off,...
                side = "on" if side == "off" else "off"
            engine.set_trace_sink(sink if side == "on" and not ns.aa else NULL_SINK)
            c0 = time.process_time()
            res[side].append(run_round(engine, ns.requests, prompt, ns.max_tokens, ns.waves))
            sink.force_flush()  # off the wall clock: no background span work spills into the next round
            cpu[side].append(time.process_time() - c0)
        engine.set_trace_sink(NULL_SINK)
        engine.shutdown(shutdown_sink=False)
        sink.shutdown()
        spans_bytes = (Path(tmp) / "cap" / "spans.otlp.jsonl").stat().st_size

    # pairwise ratios (adjacent off/on rounds) cancel slow drift from other load on the machine
    pairs = list(zip(res["off"], res["on"]))
    thr_pairs = [on[0] / off[0] for off, on in pairs]
    ttft_pairs = [statistics.median(on[1]) / statistics.median(off[1]) for off, on in pairs]
    thr_ratio = statistics.median(thr_pairs)
    ttft_ratio = statistics.median(ttft_pairs)

    def spread(xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=4)
        return f"pair IQR {q[0]:.3f}..{q[2]:.3f}"

    cpu_ratio = statistics.median(on / off for off, on in zip(cpu["off"], cpu["on"]))
    thr_off = statistics.median(r[0] for r in res["off"])
    thr_on = statistics.median(r[0] for r in res["on"])
    p50_off = statistics.median(t for r in res["off"] for t in r[1])
    p50_on = statistics.median(t for r in res["on"] for t in r[1])

    # a drift-free cross-check: the CPU cost of the span calls on the caller's (engine's) thread,
    # times how many a round makes; and, apart, the background cost (build SDK spans + encode
    # OTLP + write the capture), which runs on the sink's threads and competes only for the GIL
    n = 2000
    with tempfile.TemporaryDirectory() as tmp2:
        cost_sink = setup_tracing(service_name="bench", capture_dir=Path(tmp2) / "cap", export_interval_s=3600)
        p0 = time.process_time()
        t0 = time.thread_time()  # this thread's CPU only: background threads and neighbours excluded
        for i in range(n):
            rt = cost_sink.start_request(f"r{i}", model="m", attributes={"a": 1})
            for name in ("tokenize", "queue", "prefill", "sample", "detokenize", "decode"):
                rt.record_stage(name, 1, 2)
            for _ in range(ns.max_tokens):
                rt.add_token_time(3)
            rt.set_attributes({"b": 2})
            rt.end()
        per_request_s = (time.thread_time() - t0) / n
        caller_s = time.thread_time() - t0
        t0 = time.thread_time()
        for i in range(n):
            cost_sink.record_step(1, 2, {"x": 1, "y": 2, "z": 0.5})
        per_step_s = (time.thread_time() - t0) / n
        caller_s += time.thread_time() - t0
        cost_sink.force_flush()  # what the sink's threads have not done yet, done here
        # background = all of this process's CPU for the records and their export, less the caller's
        per_span_bg_s = (time.process_time() - p0 - caller_s) / (n * 8)
        cost_sink.shutdown()
    steps_per_round = ns.max_tokens + 2
    round_s = ns.requests * ns.max_tokens * ns.waves / thr_off
    est = ns.waves * (ns.requests * per_request_s + steps_per_round * per_step_s) / round_s
    bg = ns.waves * (ns.requests * 7 + steps_per_round) * per_span_bg_s / round_s

    print(f"engine tracing overhead{' A/A CONTROL (off vs off)' if ns.aa else ''}"
          f"{' BUILD DEFERRED to the flush between rounds' if ns.defer_build else ''} ({ns.model}, {ns.device}, {ns.rounds} rounds/side ABBA-interleaved, "
          f"{ns.waves} x {ns.requests} concurrent x {ns.max_tokens} tokens; capture {spans_bytes / 1e6:.1f} MB)")
    print(f"  throughput  off {thr_off:8.1f} tok/s   on {thr_on:8.1f} tok/s   median pair on/off = {thr_ratio:.4f}  "
          f"(overhead {100 * (1 - thr_ratio):+.2f} %, budget < 1 %; {spread(thr_pairs)})")
    print(f"  TTFT p50    off {1e3 * p50_off:8.2f} ms     on {1e3 * p50_on:8.2f} ms     median pair on/off = {ttft_ratio:.4f}  "
          f"(overhead {100 * (ttft_ratio - 1):+.2f} %, budget < 1 %; {spread(ttft_pairs)})")
    print(f"  process CPU per round (all threads, flush included) median pair on/off = {cpu_ratio:.4f}  "
          f"({100 * (cpu_ratio - 1):+.2f} % CPU, torch worker threads included)")
    print(f"  span-call CPU cost on the engine's threads: {1e6 * per_request_s:.1f} us per request trace, "
          f"{1e6 * per_step_s:.1f} us per step span -> estimated {100 * est:.2f} % of a round's wall time")
    print(f"  background (build + encode + write, sink threads): {1e6 * per_span_bg_s:.1f} us per span "
          f"-> {100 * bg:.1f} % of one core during a round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
