"""Prefix caching: TTFT of prompts that repeat a 1,024-token prefix, cache on vs off (budget >= 5x on CPU).

Two engines of the same model in one process, one with ``prefix_caching``; requests alternate
between them (off, on, off, on, ...) so that drift of the machine hits both alike. Every
prompt is the same ``--prefix`` tokens followed by a distinct ``--suffix`` of tokens, and asks
for one greedy token, so TTFT is submit -> first token on the engine (no HTTP). The cache-on
engine's first request fills the cache (a miss: reported apart); the figure is
median TTFT off / median TTFT on over the repeats. Greedy tokens must agree between the two.

Run: ``python benchmarks/prefix_cache.py [--model tiny|small] [--prefix 1024] [--repeats 15]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diag.bundled_engine import SamplingParams, SyncEventStream, build_engine  # noqa: E402

BUDGET_RATIO = 5.0


def _ttft_s(engine, prompt_ids: list[int]) -> tuple[float, int]:
    """(seconds from submit to the first token, that token's id) for one greedy request."""
    stream = SyncEventStream()
    t0 = time.perf_counter()
    engine.submit(stream.push, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True), prompt_ids=prompt_ids)
    first = stream.get(600)  # max_tokens=1: the one token comes with the end event
    t1 = time.perf_counter()
    if first.error:
        raise RuntimeError(f"request failed: {first.error}")
    if not first.finished:
        for _ in stream:
            pass
    return t1 - t0, int(first.token_id if first.token_id is not None else -1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prefix", type=int, default=1024, metavar="TOKENS", help="shared prefix length (tokens)")
    ap.add_argument("--suffix", type=int, default=16, metavar="TOKENS", help="distinct suffix per request (tokens)")
    ap.add_argument("--repeats", type=int, default=15, help="requests per engine after the first")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the engine's)")
    ns = ap.parse_args(argv)
    if ns.prefix < 16 or ns.suffix < 1 or ns.repeats < 1:
        ap.error("--prefix must be >= 16, --suffix and --repeats >= 1")
    common = dict(model=ns.model, max_context=ns.prefix + ns.suffix + 8, max_batched_tokens=ns.prefix + ns.suffix + 8,
                  num_threads=ns.threads)
    off = build_engine(**common)
    on = build_engine(prefix_caching=True, **common)
    try:
        vocab = on.model_config.vocab_size
        prefix = [(i * 7919 + 13) % (vocab - 1) + 1 for i in range(ns.prefix)]

        def prompt(k: int) -> list[int]:
            return prefix + [(k * 104729 + j * 31 + 7) % (vocab - 1) + 1 for j in range(ns.suffix)]

        cold_off, _ = _ttft_s(off, prompt(0))
        cold_on, _ = _ttft_s(on, prompt(0))  # fills the cache: a miss
        t_off, t_on, mismatches = [], [], 0
        for k in range(1, ns.repeats + 1):
            a, tok_a = _ttft_s(off, prompt(k))
            b, tok_b = _ttft_s(on, prompt(k))
            t_off.append(a)
            t_on.append(b)
            mismatches += tok_a != tok_b
        pc = on.blocks.prefix_cache
        assert pc is not None
        hit_ratio = pc.hits_tokens / max(1, pc.queries_tokens)
    finally:
        on.shutdown()
        off.shutdown()
    med_off, med_on = statistics.median(t_off), statistics.median(t_on)
    ratio = med_off / med_on
    print(f"model {ns.model}, prefix {ns.prefix} tokens + suffix {ns.suffix}, {ns.repeats} repeats per engine (interleaved)")
    print(f"first request (cache empty): off {cold_off * 1e3:.1f} ms, on {cold_on * 1e3:.1f} ms")
    print(f"TTFT p50 cache off: {med_off * 1e3:.1f} ms  (min {min(t_off) * 1e3:.1f}, max {max(t_off) * 1e3:.1f})")
    print(f"TTFT p50 cache on:  {med_on * 1e3:.1f} ms  (min {min(t_on) * 1e3:.1f}, max {max(t_on) * 1e3:.1f})")
    print(f"prefix-cache hit ratio (tokens): {hit_ratio:.3f}; greedy first tokens that differ: {mismatches}")
    verdict = "within budget" if ratio >= BUDGET_RATIO and mismatches == 0 else "OVER BUDGET"
    print(f"TTFT ratio off/on: {ratio:.1f}x (budget >= {BUDGET_RATIO:.0f}x): {verdict}")
    return 0 if verdict == "within budget" else 1


if __name__ == "__main__":
    sys.exit(main())
