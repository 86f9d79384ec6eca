"""Continuous batching vs one request at a time, same engine and model, in output tokens/s.

"Batched": a closed loop of 16 concurrent clients (each submits its next request as soon as the
previous one finishes). "One at a time": the same requests, strictly sequential.

Run: ``python benchmarks/engine_batching.py [--concurrency 16] [--requests 48]``
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diag.bundled_engine import SamplingParams, SyncEventStream, build_engine  # noqa: E402


def run(engine, prompts: list[str], params: SamplingParams, concurrency: int) -> tuple[float, int]:
    """Serve all prompts with ``concurrency`` closed-loop clients; (wall s, output tokens)."""
    it = iter(prompts)
    lock = threading.Lock()
    tokens = [0]

    def client() -> None:
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                return
            s = SyncEventStream()
            engine.submit(s.push, params, prompt=p)
            n = sum(1 for ev in s if ev.token_id is not None)
            with lock:
                tokens[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, tokens[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--policy", default="chunked")
    ns = ap.parse_args(argv)
    engine = build_engine(model=ns.model, device=ns.device, max_running=ns.concurrency, policy=ns.policy)
    params = SamplingParams(max_tokens=ns.max_tokens, temperature=0.0, ignore_eos=True)
    prompts = [("request %d asks why the first token is late. " % i) * 8 for i in range(ns.requests)]
    run(engine, prompts[:4], params, 4)  # warm-up
    seq_s, seq_tok = run(engine, prompts, params, 1)
    bat_s, bat_tok = run(engine, prompts, params, ns.concurrency)
    engine.shutdown()
    seq_tps, bat_tps = seq_tok / seq_s, bat_tok / bat_s
    print(f"continuous batching ({ns.model}, {ns.device}, policy={ns.policy}, {ns.requests} requests x {ns.max_tokens} tokens)")
    print(f"  one at a time      {seq_tps:9.1f} output tok/s ({seq_s:.2f} s)")
    print(f"  concurrency {ns.concurrency:<4d}   {bat_tps:9.1f} output tok/s ({bat_s:.2f} s)")
    print(f"  batched / one-at-a-time = {bat_tps / seq_tps:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
