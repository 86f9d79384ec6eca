"""The probe beside AIPerf 0.13 on the same ``ttft serve``: TTFT, E2E and the engine's own step time.

Budget (docs/design.md): the engine's step time under our load <= 1.10x under AIPerf's, same server,
same nominal load, one run. The load: closed loop, ``--concurrency`` (4) in flight, ``--requests``
(80) chat requests of 128 prompt / 32 output tokens (exactly: ``min_tokens`` + ``ignore_eos``, as
both tools send), no warm-up, ``--rounds`` (3) interleaved rounds (ours first in odd rounds, AIPerf
first in even ones) against one ``ttft serve`` running a random-weight Llama checkpoint
(``tests/thirdparty/hf_serve.py``), warmed up before the first round.

Each tool runs as a user would run it, in its own process: ``ttft probe URL --json`` and
``aiperf profile ... --streaming`` (from its own venv, ``--aiperf``, default
``/work/aiperf-venv/bin/aiperf``; install: ``python3 -m venv /work/aiperf-venv &&
/work/aiperf-venv/bin/pip install aiperf==0.13.0``). AIPerf loads its tokenizer through the
Hugging Face hub API only, so without hub access it gets one in a local hub-cache layout
(``HF_HUB_CACHE``/``models--local--tiny-llama``, ``HF_HUB_OFFLINE=1``) built from the checkpoint's
tokenizer; the probe gets the same ``tokenizer.json`` (exact prompt lengths).

The engine's step time is its own: ``ttft_engine:step_duration_seconds`` sum/count from its
``/metrics`` (prometheus_client's parser) read before and after each run; the prompt and
generated token counters and the step count say both runs put the same work through. TTFT p50/p99
and E2E p50 are each tool's own report (the probe's ``metrics``; AIPerf's
``profile_export_aiperf.json`` ``time_to_first_token``/``request_latency``). Each tool's CPU is its
process tree's (``RUSAGE_CHILDREN``), start-up included; the probe's CPU per chunk is
its ``client_health.client_cpu`` (the whole session: start-up included).

``--engine-cpus`` / ``--client-cpus`` pin the server and both tools (``os.sched_setaffinity``;
the probe through its own ``--cpus``) to show what keeping the client off the engine's cores is
worth. Prints per round and the medians with min-max; the load on the box (``os.getloadavg``)
before and after. Not run by CI. Run: ``python benchmarks/aiperf_side_by_side.py [--rounds 3]
[--requests 80] [--concurrency 4] [--hidden-size 256] [--layers 4] [--threads N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "thirdparty"))

DEFAULT_AIPERF = "/work/aiperf-venv/bin/aiperf"
AIPERF_VERSION = "0.13"
HUB_REPO = "local/tiny-llama"
_SNAPSHOT = "0" * 40
BUDGET_RATIO = 1.10


def find_aiperf(path: str) -> str:
    """The aiperf executable, checked to be 0.13; SystemExit with one line when it is missing."""
    exe = shutil.which(path) or (path if Path(path).exists() else None)
    if exe is None:
        raise SystemExit(f"AIPerf not found at {path}: python3 -m venv /work/aiperf-venv && "
                         f"/work/aiperf-venv/bin/pip install aiperf==0.13.0 (or pass --aiperf PATH)")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    version = (out.stdout.strip() or out.stderr.strip()).splitlines()[-1:] or [""]
    if not version[0].startswith(AIPERF_VERSION):
        raise SystemExit(f"{exe} is AIPerf {version[0] or '?'}, not {AIPERF_VERSION}.x: install aiperf==0.13.0")
    return exe


def hub_cache(model_dir: Path, cache: Path) -> Path:
    """A Hugging Face hub-cache layout holding ``model_dir``'s tokenizer as repo HUB_REPO."""
    repo = cache / ("models--" + HUB_REPO.replace("/", "--"))
    snap = repo / "snapshots" / _SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(_SNAPSHOT)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "config.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, snap / name)
    return cache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpus: list[int] | None):  # noqa: ANN201 - a preexec_fn or None
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, set(cpus))


def engine_counters(base: str) -> dict[str, float]:
    """Step-time sum/count and token counters from the engine's /metrics (summed over labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    want = {"ttft_engine:step_duration_seconds_sum": "step_s", "ttft_engine:step_duration_seconds_count": "steps",
            "ttft_engine:prompt_tokens_total": "prompt_tokens", "ttft_engine:generation_tokens_total": "gen_tokens"}
    out = {v: 0.0 for v in want.values()}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in want:
                out[want[s.name]] += float(s.value)
    return out


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_ours(base: str, args: argparse.Namespace, tokenizer: Path, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "diag", "probe", base, "--api", "chat", "--model", "model",
           "-c", str(args.concurrency), "-n", str(args.requests), "--warmup", "0",
           "--input-tokens", f"fixed:{args.input_tokens}", "--output-tokens", f"fixed:{args.output_tokens}",
           "--tokenizer", str(tokenizer), "--seed", str(args.seed), "-o", str(out), "--json", "--no-progress"]
    if args.client_cpus:
        cmd += ["--cpus", ",".join(map(str, args.client_cpus))]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"ttft probe failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    doc = json.loads(p.stdout)
    m = doc["metrics"]
    if m["requests"]["errors"]:
        raise SystemExit(f"ttft probe: {m['requests']['errors']} failed requests: {m.get('errors')}")
    cc = doc["client_health"].get("client_cpu") or {}
    return {"ttft_p50_ms": m["ttft_s"]["p50"] * 1e3, "ttft_p99_ms": m["ttft_s"]["p99"] * 1e3,
            "e2e_p50_ms": m["e2e_s"]["p50"] * 1e3, "cpu_us_per_chunk": cc.get("cpu_us_per_chunk")}


def run_aiperf(exe: str, base: str, args: argparse.Namespace, cache: Path, out: Path) -> dict[str, Any]:
    cmd = [exe, "profile", "--model", "model", "--url", base, "--endpoint-type", "chat", "--streaming",
           "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
           "--isl", str(args.input_tokens), "--prompt-input-tokens-stddev", "0", "--osl", str(args.output_tokens),
           "--extra-inputs", f"min_tokens:{args.output_tokens}", "--extra-inputs", "ignore_eos:true",
           "--tokenizer", HUB_REPO, "--artifact-dir", str(out), "--random-seed", str(args.seed), "--ui-type", "none"]
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, preexec_fn=pin(args.client_cpus))
    report = out / "profile_export_aiperf.json"
    if p.returncode != 0 or not report.exists():
        tail = " ".join((p.stdout + p.stderr).split())[-400:]
        raise SystemExit(f"aiperf failed ({p.returncode}): {tail}")
    d = json.loads(report.read_text())
    errors = d.get("error_summary") or []
    if errors:
        raise SystemExit(f"aiperf: failed requests: {errors}")
    return {"ttft_p50_ms": d["time_to_first_token"]["p50"], "ttft_p99_ms": d["time_to_first_token"]["p99"],
            "e2e_p50_ms": d["request_latency"]["p50"], "cpu_us_per_chunk": None}


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf", default=DEFAULT_AIPERF, help=f"the aiperf executable (default {DEFAULT_AIPERF})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--hidden-size", type=int, default=256, help="the random Llama's hidden size (default 256)")
    ap.add_argument("--layers", type=int, default=4, help="the random Llama's layers (default 4)")
    ap.add_argument("--threads", type=int, default=None, help="ttft serve --threads (default: its own)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--engine-cpus", help="pin ttft serve to these CPUs (e.g. 0)")
    ap.add_argument("--client-cpus", help="pin both tools to these CPUs (e.g. 1)")
    args = ap.parse_args(argv)
    if min(args.rounds, args.requests, args.concurrency) < 1:
        ap.error("--rounds, --requests and --concurrency must be >= 1")
    from collectors.probe.affinity import parse_cpu_list

    try:
        args.engine_cpus = list(parse_cpu_list(args.engine_cpus)) if args.engine_cpus else None
        args.client_cpus = list(parse_cpu_list(args.client_cpus)) if args.client_cpus else None
    except ValueError as exc:
        ap.error(str(exc))
    exe = find_aiperf(args.aiperf)
    from hf_serve import build_tiny_llama

    tmp = Path(tempfile.mkdtemp(prefix="ttft-aiperf-sbs-"))
    model = build_tiny_llama(tmp / "model", hidden_size=args.hidden_size, layers=args.layers)
    cache = hub_cache(model, tmp / "hub")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "diag", "serve", "--model", str(model), "--port", str(port)]
    if args.threads:
        serve += ["--threads", str(args.threads)]
    log = open(tmp / "serve.log", "wb")
    srv = subprocess.Popen(serve, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin(args.engine_cpus))
    load0 = os.getloadavg()
    rows: dict[str, list[dict[str, Any]]] = {"ttft probe": [], "aiperf": []}
    try:
        for _ in range(600):
            try:
                engine_counters(base)
                break
            except OSError:
                if srv.poll() is not None:
                    raise SystemExit(f"ttft serve exited: {(tmp / 'serve.log').read_text()[-400:]}")
                time.sleep(0.2)
        warm = argparse.Namespace(**{**vars(args), "requests": 4 * args.concurrency, "client_cpus": args.client_cpus})
        run_ours(base, warm, model / "tokenizer.json", tmp / "warmup")  # the engine's first requests are slow
        t0 = time.monotonic()
        for i in range(args.rounds):
            order = ["ttft probe", "aiperf"] if i % 2 == 0 else ["aiperf", "ttft probe"]
            for tool in order:
                before, cpu0 = engine_counters(base), children_cpu_s()
                out = tmp / f"{tool.replace(' ', '-')}-{i}"
                r = (run_ours(base, args, model / "tokenizer.json", out) if tool == "ttft probe"
                     else run_aiperf(exe, base, args, cache, out))
                after, cpu1 = engine_counters(base), children_cpu_s()
                d = {k: after[k] - before[k] for k in after}
                r.update(steps=d["steps"], step_ms=d["step_s"] / max(d["steps"], 1) * 1e3,
                         prompt_tokens=d["prompt_tokens"], gen_tokens=d["gen_tokens"], tool_cpu_s=cpu1 - cpu0)
                rows[tool].append(r)
                print(f"round {i + 1} {tool:<10} TTFT p50 {r['ttft_p50_ms']:6.1f} ms  p99 {r['ttft_p99_ms']:6.1f} ms  "
                      f"E2E p50 {r['e2e_p50_ms']:6.1f} ms  engine step {r['step_ms']:.2f} ms x {r['steps']:.0f} "
                      f"({r['prompt_tokens']:.0f} prompt / {r['gen_tokens']:.0f} generated tokens)  "
                      f"tool CPU {r['tool_cpu_s']:.1f} s", flush=True)
        elapsed = time.monotonic() - t0
    finally:
        srv.terminate()
        try:
            srv.wait(30)
        except subprocess.TimeoutExpired:
            srv.kill()
        log.close()
    load1 = os.getloadavg()
    print(f"\nttft serve (random Llama {args.hidden_size} x {args.layers}), closed loop {args.concurrency} in flight, "
          f"{args.requests} requests of {args.input_tokens}/{args.output_tokens} tokens, {args.rounds} interleaved "
          f"rounds, {elapsed:.0f} s; load average {load0[0]:.2f} -> {load1[0]:.2f} on {os.cpu_count()} CPUs; "
          f"engine CPUs {args.engine_cpus or 'any'}, client CPUs {args.client_cpus or 'any'}")
    for tool, rs in rows.items():
        per_chunk = [r["cpu_us_per_chunk"] for r in rs if r["cpu_us_per_chunk"]]
        print(f"{tool:<10}: TTFT p50 {spread([r['ttft_p50_ms'] for r in rs])} ms, p99 "
              f"{spread([r['ttft_p99_ms'] for r in rs])} ms, E2E p50 {spread([r['e2e_p50_ms'] for r in rs])} ms, "
              f"engine step {spread([r['step_ms'] for r in rs], '{:.3f}')} ms, tool CPU "
              f"{spread([r['tool_cpu_s'] for r in rs], '{:.1f}')} s"
              + (f", {spread(per_chunk, '{:.0f}')} us probe CPU per chunk (whole session, client_cpu)" if per_chunk else ""))
    ratios = [o["step_ms"] / a["step_ms"] for o, a in zip(rows["ttft probe"], rows["aiperf"])]
    verdict = "within" if statistics.median(ratios) <= BUDGET_RATIO else "OVER"
    print(f"engine step time, ours / AIPerf's: {spread(ratios, '{:.3f}')} per round -> {verdict} the "
          f"{BUDGET_RATIO:.2f}x budget (median)")
    e2e = [o["e2e_p50_ms"] / a["e2e_p50_ms"] for o, a in zip(rows["ttft probe"], rows["aiperf"])]
    ttft = [o["ttft_p50_ms"] / a["ttft_p50_ms"] for o, a in zip(rows["ttft probe"], rows["aiperf"])]
    print(f"TTFT p50 ours / AIPerf's {spread(ttft, '{:.3f}')}, E2E p50 {spread(e2e, '{:.3f}')}; files in {tmp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
