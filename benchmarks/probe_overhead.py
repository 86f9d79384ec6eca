"""How much delay does the probe client itself add to measured TTFT? (budget: < 1 ms at p99)

Method
------
A separate process runs ``benchmarks/instant_server.py``: it answers instantly and records,
per request id, ``recv_ns`` (its handler got the request) and ``first_sent_ns`` (just before it
wrote the first content chunk). The server's own part of TTFT is ``first_sent_ns - recv_ns``;
nothing a client does can make TTFT shorter than that. So for each request

    added_s = measured TTFT - (first_sent_ns - recv_ns)
            = (recv_ns - client start)           # send side: client work, loopback, HTTP parse
            + (client first content - first_sent_ns)  # receive side: loopback, client loop + parse

is the delay outside the server's handler: the client's own work plus two loopback hops (a
few tens of microseconds). Both clients are measured the same way, in the same run, against
the same server, in alternating rounds, under the *same offered load*: Poisson arrivals at
``rate = concurrency / stream duration`` (so about ``--concurrency`` = 256 streams are open at
any time, each ``--chunks`` chunks ``--itl-ms`` apart, and every TTFT is taken while ~255 other
streams deliver chunks). An open loop, not a closed one: a faster client in a closed loop
would load the server harder and be judged on a busier server. Both clocks are
``CLOCK_REALTIME`` on one host. A warm-up of ``--concurrency`` requests opens the connections.

* probe: ``collectors.probe`` (aiohttp, a span per request, the full timing path) on its
  default loop (uvloop when installed), and the same on the stdlib asyncio loop
  (``probe-asyncio``, ``TTFT_EVENT_LOOP=asyncio``) to show what the loop is worth;
* baseline: the ``openai`` package's ``AsyncOpenAI`` streaming client (httpx), with its
  connection limits raised to the concurrency; TTFT ends when its stream yields the first
  chunk with non-empty text.

Run: ``python benchmarks/probe_overhead.py [--concurrency 256] [--requests 1024] [--rounds 2] [--workers N]``
(``--workers``: the probe in N client processes, as ``ttft probe --workers``; the baseline stays one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def start_server(chunks: int, itl_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port_file = Path(tempfile.mkdtemp(prefix="ttft-bench-")) / "port"
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "instant_server.py"), "--chunks", str(chunks),
                             "--itl-ms", str(itl_ms), "--port-file", str(port_file)], stdout=subprocess.DEVNULL)
    for _ in range(200):
        if port_file.exists() and port_file.read_text():
            return proc, f"http://127.0.0.1:{port_file.read_text()}"
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("instant server did not start")


def fetch_records(base: str) -> dict[str, list[int]]:
    with urllib.request.urlopen(base + "/records", timeout=30) as r:
        return json.loads(r.read())


def run_probe_round(base: str, concurrency: int, requests: int, chunks: int, tag: str, rate: float,
                    workers: int = 1) -> dict[str, tuple[int, int]]:
    """Our client (in ``workers`` processes): returns {request_id: (start_ns, first_content_ns)} (Unix ns)."""
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe
    from collectors.probe.endpoint import request_id_header

    cfg = ProbeConfig(base, api="completions", model="instant",
                      load=LoadSpec(concurrency=concurrency * 2, rate_rps=rate, requests=requests,
                                    warmup_requests=concurrency, seed=7),
                      workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse(str(chunks)), exact_output=False),
                      timeout_s=60, segment=tag, workers=workers)
    res = run_probe(cfg)
    errs = res.metrics["errors"]
    if errs:
        print(f"  probe errors: {errs}", file=sys.stderr)
    health = res.client_health
    print(f"  [{tag}] probe client: loop lag p99 {health['loop_lag_p99_s'] * 1e3:.2f} ms, CPU p90 "
          f"{health['cpu_pct_p90']:.0f}% of a core, {res.metrics['throughput']['requests_per_s']:.0f} req/s")
    # the probe's X-Request-Id is its trace id as a UUID (what the instant server records)
    return {request_id_header(r.trace_id): (r.start_ns, r.first_content_ns) for r in res.results
            if not r.warmup and r.error is None and r.first_content_ns}


def run_probe_asyncio_round(base: str, concurrency: int, requests: int, chunks: int, tag: str,
                            rate: float, workers: int = 1) -> dict[str, tuple[int, int]]:
    """The probe on the stdlib event loop."""
    from collectors.probe import eventloop

    old = os.environ.get(eventloop.ENV_VAR)
    os.environ[eventloop.ENV_VAR] = "asyncio"
    try:
        return run_probe_round(base, concurrency, requests, chunks, tag, rate, workers)
    finally:
        if old is None:
            del os.environ[eventloop.ENV_VAR]
        else:
            os.environ[eventloop.ENV_VAR] = old


def run_openai_round(base: str, concurrency: int, requests: int, chunks: int, tag: str, rate: float) -> dict[str, tuple[int, int]]:
    """The openai package's AsyncOpenAI streaming client, timed like the probe."""
    import openai

    try:
        import httpx2 as httpx  # what this openai build uses
    except ImportError:  # pragma: no cover - other openai versions
        import httpx  # type: ignore[no-redef]

    async def main() -> dict[str, tuple[int, int]]:
        http = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=concurrency * 2,
                                                                  max_keepalive_connections=concurrency * 2))
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60, http_client=http)
        off = time.time_ns() - time.perf_counter_ns()
        out: dict[str, tuple[int, int]] = {}
        counter = iter(range(10**9))
        t_wall = time.perf_counter()

        async def one(rid: str) -> tuple[int, int | None]:
            t0 = time.perf_counter_ns()
            first = None
            stream = await client.completions.create(model="instant", prompt="hello " * 16, max_tokens=chunks,
                                                     stream=True, extra_headers={"X-Request-ID": rid})
            async for ch in stream:
                if first is None and ch.choices and ch.choices[0].text:
                    first = time.perf_counter_ns()
            return t0 + off, (first + off) if first else None

        async def slot(n_total: int, warm: bool) -> None:
            while True:
                i = next(counter)
                if i >= n_total:
                    return
                rid = f"oa-{tag}-{'w' if warm else ''}{i}"
                try:
                    start, first = await one(rid)
                except Exception as exc:  # counted, not fatal
                    print(f"  openai error: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                if not warm and first:
                    out[rid] = (start, first)

        await asyncio.gather(*(slot(concurrency, True) for _ in range(concurrency)))
        t_wall = time.perf_counter()

        async def measured(i: int) -> None:
            rid = f"oa-{tag}-{i}"
            try:
                start, first = await one(rid)
            except Exception as exc:  # counted, not fatal
                print(f"  openai error: {type(exc).__name__}: {exc}", file=sys.stderr)
                return
            if first:
                out[rid] = (start, first)

        rng = random.Random(7)  # the same Poisson schedule as the probe's
        tasks = []
        t_next = time.perf_counter()
        for i in range(requests):
            if i:
                t_next += rng.gammavariate(1.0, 1.0 / rate)
            delay = t_next - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(measured(i)))
        await asyncio.gather(*tasks)
        print(f"  [{tag}] openai client: {len(out) / (time.perf_counter() - t_wall):.0f} req/s")
        await client.close()
        return out

    return asyncio.run(main())


def added_delays(client: dict[str, tuple[int, int]], server: dict[str, list[int]]) -> dict[str, np.ndarray]:
    total, send, recv, ttft = [], [], [], []
    for rid, (start, first) in client.items():
        rec = server.get(rid)
        if rec is None:
            continue
        recv_ns, sent_ns = rec
        ttft.append((first - start) / 1e9)
        total.append(((first - start) - (sent_ns - recv_ns)) / 1e9)
        send.append((recv_ns - start) / 1e9)
        recv.append((first - sent_ns) / 1e9)
    return {k: np.asarray(v) for k, v in (("added", total), ("send", send), ("recv", recv), ("ttft", ttft))}


def main() -> int:
    ap = argparse.ArgumentParser(description="client-added delay on TTFT: the probe vs the openai client")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=1024, help="measured requests per client per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--rate", type=float, help="requests/s (default: concurrency / stream duration)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workers", type=int, default=1, help="probe client processes (ttft probe --workers); the openai baseline stays one")
    a = ap.parse_args()
    stream_s = max(1e-3, (a.chunks - 1) * a.itl_ms / 1e3)
    rate = a.rate or a.concurrency / stream_s
    proc, base = start_server(a.chunks, a.itl_ms)
    clients = [("probe", partial(run_probe_round, workers=a.workers)),
               ("probe-asyncio", partial(run_probe_asyncio_round, workers=a.workers)), ("openai", run_openai_round)]
    got: dict[str, dict[str, tuple[int, int]]] = {name: {} for name, _ in clients}
    srv: dict[str, list[int]] = {}
    try:
        for k in range(a.rounds):
            for name, fn in clients[k % 3:] + clients[:k % 3]:  # each round in another order
                got[name].update(fn(base, a.concurrency, a.requests, a.chunks, f"{name}{k}", rate))
                srv.update(fetch_records(base))
    finally:
        proc.terminate()
        proc.wait(10)
    report: dict[str, Any] = {"concurrency": a.concurrency, "rate_rps": rate, "requests_per_round": a.requests,
                              "rounds": a.rounds, "chunks": a.chunks, "itl_ms": a.itl_ms, "cpus": os.cpu_count(), "workers": a.workers,
                              "loadavg_1m": os.getloadavg()[0]}
    print(f"\nclient-added delay on TTFT, ~{a.concurrency} concurrent streams ({rate:.0f} req/s Poisson), "
          f"{a.chunks} chunks {a.itl_ms:g} ms apart; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'client':13} {'n':>6} {'added p50':>10} {'added p99':>10} {'send p99':>9} {'recv p99':>9} {'TTFT p50':>9} {'TTFT p99':>9}")
    for name in got:
        d = added_delays(got[name], srv)
        if not d["added"].size:
            print(f"{name:13} no matched requests")
            continue
        row = {f"{k}_p{p}_ms": float(np.percentile(v, p) * 1e3) for k, v in d.items() for p in (50, 99)}
        row["n"] = int(d["added"].size)
        report[name] = row
        print(f"{name:13} {row['n']:>6} {row['added_p50_ms']:>8.3f}ms {row['added_p99_ms']:>8.3f}ms "
              f"{row['send_p99_ms']:>7.3f}ms {row['recv_p99_ms']:>7.3f}ms {row['ttft_p50_ms']:>7.3f}ms {row['ttft_p99_ms']:>7.3f}ms")
    if "probe" in report and "openai" in report:
        for p in (50, 99):
            r = report["openai"][f"added_p{p}_ms"] / max(report["probe"][f"added_p{p}_ms"], 1e-9)
            report[f"ratio_openai_over_probe_p{p}"] = r
        print(f"ratio openai/probe: p50 {report['ratio_openai_over_probe_p50']:.2f}x, p99 "
              f"{report['ratio_openai_over_probe_p99']:.2f}x")
        if "probe-asyncio" in report:
            for p in (50, 99):
                report[f"ratio_asyncio_over_uvloop_p{p}"] = (report["probe-asyncio"][f"added_p{p}_ms"]
                                                             / max(report["probe"][f"added_p{p}_ms"], 1e-9))
            print(f"ratio probe on asyncio / probe on its default loop: p50 "
                  f"{report['ratio_asyncio_over_uvloop_p50']:.2f}x, p99 {report['ratio_asyncio_over_uvloop_p99']:.2f}x")
        ok = report["probe"]["added_p99_ms"] < 1.0
        report["budget_met"] = ok
        print(f"budget (< 1 ms at p99): {'met' if ok else 'NOT met'}")
    if a.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
