"""The probe's client CPU per streamed chunk: what it takes from the cores an engine would use.

A separate process runs ``benchmarks/instant_server.py`` (chat API, ``--chunks`` content chunks
``--itl-ms`` apart, so that chunks arrive one by one as an engine's do). In this process, rounds
of a closed loop (``--concurrency`` in flight, ``--requests`` measured) alternate between

* ``probe``: ``collectors.probe.run_probe`` writing a real capture (client spans, client-health
  series, meta.json): everything a user's ``ttft probe -o DIR`` does;
* ``probe-nocapture``: the same without a capture (spans not encoded);
* ``floor``: a bare aiohttp loop that reads each stream to its end and parses nothing, on the
  same event loop: the transport's share, which no parsing change can remove.

Each round's CPU is ``resource.getrusage(RUSAGE_SELF)`` user + system (every thread of this
process: the event loop, the span builder, the capture writer) from the first to the last
finished request, divided by the content chunks of the requests in that window: the CPU taken
while the server streams (what competes with an engine's steps). The session's fixed costs
(endpoint check, metrics, writing the capture's spans after the phase) fall outside it. Prints per variant the median microseconds of client CPU per chunk
and per request with their spread (min-max over rounds), and ``probe - floor``: the probe's
own work per chunk. The load on the box (``os.getloadavg``) is printed before and after.

Run: ``python benchmarks/probe_cpu_per_chunk.py [--rounds 5] [--requests 200] [--concurrency 4]
[--chunks 32] [--itl-ms 2]``. Not run by CI.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from probe_overhead import start_server  # noqa: E402  (the instant server as a subprocess)


def cpu_s() -> float:
    """User + system CPU seconds of this whole process (all threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class SteadyWindow:
    """A progress callback: the process CPU between the first and the last finished request.

    The session's fixed costs (endpoint check, metrics, health summary) fall outside the
    window; the window covers ``requests - 1`` whole requests' worth of chunks (closed loop).
    """

    def __init__(self, requests: int) -> None:
        self.requests = requests
        self._first: float | None = None
        self.cpu_s = 0.0

    def __call__(self, done: int, total: int | None, _label: str) -> None:
        if done == 1:
            self._first = cpu_s()
        elif done == self.requests and self._first is not None:
            self.cpu_s = cpu_s() - self._first


def probe_round(base: str, concurrency: int, requests: int, chunks: int, capture: bool) -> tuple[float, int, int]:
    """(CPU s, content chunks, requests) of one run_probe round."""
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe

    out = tempfile.mkdtemp(prefix="ttft-cpu-chunk-") if capture else None
    window = SteadyWindow(requests)
    cfg = ProbeConfig(base, api="chat", model="instant",
                      load=LoadSpec(concurrency=concurrency, requests=requests, warmup_requests=0, seed=7),
                      workload=WorkloadSpec(LengthSpec.parse("128"), LengthSpec.parse(str(chunks)), exact_output=True),
                      timeout_s=60, output=out, compat_check=False, progress=window)
    res = run_probe(cfg)
    if res.metrics["requests"]["errors"]:
        raise SystemExit(f"probe errors: {res.metrics['errors']}")
    if any(len(r.token_times_ns) != chunks for r in res.results):
        raise SystemExit(f"a request did not stream exactly {chunks} content chunks")
    return window.cpu_s, (window.requests - 1) * chunks, window.requests - 1


def floor_round(base: str, concurrency: int, requests: int, chunks: int) -> tuple[float, int, int]:
    """(CPU s, content chunks, requests): aiohttp reading every stream to its end, nothing parsed."""
    import aiohttp

    from collectors.probe import eventloop

    body = (b'{"model":"instant","messages":[{"role":"user","content":"x"}],"max_tokens":%d,'
            b'"stream":true,"stream_options":{"include_usage":true}}' % chunks)

    async def main() -> int:
        conn = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
        async with aiohttp.ClientSession(connector=conn, read_bufsize=4 << 20) as session:
            left = [requests]
            done = [0]

            async def worker() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    async with session.post(base + "/v1/chat/completions", data=body,
                                            headers={"Content-Type": "application/json"}) as resp:
                        while await resp.content.readany():
                            pass
                    done[0] += 1
                    window(done[0], requests, "floor")

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return requests

    window = SteadyWindow(requests)
    eventloop.run(main())
    return window.cpu_s, (requests - 1) * chunks, requests - 1


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):7.1f} (min {min(values):.1f}, max {max(values):.1f}, n={len(values)})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds per variant, interleaved (default 5)")
    ap.add_argument("--requests", type=int, default=200, help="requests per round (default 200)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    ap.add_argument("--chunks", type=int, default=32, help="content chunks per answer (default 32)")
    ap.add_argument("--itl-ms", type=float, default=2.0, help="gap between chunks (default 2 ms)")
    args = ap.parse_args(argv)
    if min(args.rounds, args.requests, args.concurrency, args.chunks) < 1:
        ap.error("--rounds, --requests, --concurrency and --chunks must be >= 1")
    proc, base = start_server(args.chunks, args.itl_ms)
    variants = {
        "probe": lambda: probe_round(base, args.concurrency, args.requests, args.chunks, True),
        "probe-nocapture": lambda: probe_round(base, args.concurrency, args.requests, args.chunks, False),
        "floor": lambda: floor_round(base, args.concurrency, args.requests, args.chunks),
    }
    per_chunk: dict[str, list[float]] = {k: [] for k in variants}
    per_req: dict[str, list[float]] = {k: [] for k in variants}
    load0 = os.getloadavg()
    t0 = time.monotonic()
    try:
        probe_round(base, args.concurrency, args.concurrency * 4, args.chunks, False)  # warm-up: imports, connections
        names = list(variants)
        for i in range(args.rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:  # rotate the order per round
                used, n_chunks, n_req = variants[name]()
                per_chunk[name].append(used / max(n_chunks, 1) * 1e6)
                per_req[name].append(used / max(n_req, 1) * 1e6)
                print(f"round {i + 1} {name:<16} {used * 1e3:8.1f} ms CPU, {n_chunks} chunks: "
                      f"{per_chunk[name][-1]:6.1f} us/chunk", flush=True)
    finally:
        proc.kill()
        proc.wait()
    load1 = os.getloadavg()
    print(f"\nclosed loop {args.concurrency} in flight, {args.requests} requests x {args.chunks} chunks "
          f"{args.itl_ms:g} ms apart, {args.rounds} interleaved rounds, {time.monotonic() - t0:.0f} s; "
          f"load average {load0[0]:.2f} -> {load1[0]:.2f} on {os.cpu_count()} CPUs")
    for name in variants:
        print(f"{name:<16} client CPU per chunk (us): {spread(per_chunk[name])};  per request (us): "
              f"{statistics.median(per_req[name]):.0f}")
    own = [p - f for p, f in zip(per_chunk["probe"], per_chunk["floor"])]
    print(f"probe - floor (the probe's own work per chunk, us): {spread(own)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
