"""Prefill efficiency: achieved FLOP/s of a 1024-token prefill over torch's matmul FLOP/s (same dtype).

Model FLOPs per prefill: 2 x tokens x (attention + MLP weights) per layer, plus causal attention
scores/values (2 x 2 x T^2/2 x heads x head_dim per layer), plus the LM head for the one sampled
row. The baseline is ``torch.matmul`` at the model's largest GEMM shape
(T x hidden @ hidden x 2*intermediate), measured on this machine in the same run.

Run: ``python benchmarks/engine_prefill_efficiency.py [--model tiny|small] [--tokens 1024]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from diag.bundled_engine.kv_cache import BlockManager  # noqa: E402
from diag.bundled_engine.model import ModelSpec, SeqInput  # noqa: E402
from diag.bundled_engine.tp import CacheSpec, make_runner  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prefill_flops(cfg, t: int) -> float:
    """Useful FLOPs of one causal prefill of ``t`` tokens (multiply-add = 2 FLOPs)."""
    h, d = cfg.hidden_size, cfg.head_dim
    per_layer_w = h * d * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * h * cfg.intermediate_size
    linear = 2 * t * per_layer_w * cfg.num_layers
    attn = 2 * 2 * (t * (t + 1) / 2) * cfg.num_heads * d * cfg.num_layers
    head = 2 * h * cfg.vocab_size
    return linear + attn + head


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=7)
    ns = ap.parse_args(argv)
    dtype = ns.dtype or ("bfloat16" if ns.device.startswith("cuda") else "float32")
    spec = ModelSpec(ns.model, device=ns.device, dtype=dtype)
    cfg = spec.resolve_config()
    bs = 16
    nblocks = ns.tokens // bs + 1
    runner = make_runner(spec, CacheSpec(nblocks, bs))
    bm = BlockManager(nblocks, bs)
    table = list(bm.allocate("x", ns.tokens))
    ids = [(i * 7919) % cfg.vocab_size for i in range(ns.tokens)]

    times = []
    for i in range(ns.reps + 2):
        _sync(ns.device)
        t0 = time.perf_counter()
        runner.execute([SeqInput(ids, 0, table)])
        _sync(ns.device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    prefill_s = statistics.median(times)
    achieved = prefill_flops(cfg, ns.tokens) / prefill_s

    tdt = cfg.torch_dtype
    a = torch.randn(ns.tokens, cfg.hidden_size, device=ns.device).to(tdt)
    b = torch.randn(cfg.hidden_size, 2 * cfg.intermediate_size, device=ns.device).to(tdt)
    mm = []
    for i in range(ns.reps * 3 + 3):
        _sync(ns.device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        _sync(ns.device)
        if i >= 3:
            mm.append(time.perf_counter() - t0)
    mm_flops = 2 * ns.tokens * cfg.hidden_size * 2 * cfg.intermediate_size / statistics.median(mm)
    print(f"prefill efficiency ({ns.model}, {ns.device}, {dtype}, {ns.tokens}-token prompt, threads={torch.get_num_threads()})")
    print(f"  prefill {1e3 * prefill_s:.1f} ms = {achieved / 1e9:.2f} GFLOP/s; torch.matmul "
          f"[{ns.tokens}x{cfg.hidden_size}]@[{cfg.hidden_size}x{2 * cfg.intermediate_size}] = {mm_flops / 1e9:.2f} GFLOP/s")
    print(f"  achieved / matmul = {achieved / mm_flops:.3f}")
    runner.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
