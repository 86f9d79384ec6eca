"""Offline analysis of a 1,000,000-span capture against the docs/design.md budget.

Builds a capture of ``--requests`` requests x 8 spans (client root, server root with 8 token
times, tokenize, queue, prefill, sample, detokenize, one engine step), written through
``diag.ground.capture.CaptureWriter.append_span_lines`` as pre-encoded OTLP JSON lines of 512 spans.
Then, each in a fresh process so that peak memory is its own:

* baseline: the standard library's ``json.loads`` of every line of the same file;
* analysis: ``load_capture`` + ``build_tables`` + ``rules.run_rules`` (features + rules).

Prints the time ratio analysis / json (budget <= 2x) and the analysis's peak-RSS growth as a
ratio to the file size (budget < 3x), with a per-phase breakdown.

Usage: python benchmarks/rules_1m_spans.py [--requests 125000] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPANS_PER_LINE = 512
ROOT = Path(__file__).resolve().parents[1]


def _attr(key: str, kind: str, value: object) -> str:
    if kind == "s":
        return f'{{"key":"{key}","value":{{"stringValue":"{value}"}}}}'
    if kind == "i":
        return f'{{"key":"{key}","value":{{"intValue":"{value}"}}}}'
    if kind == "d":
        return f'{{"key":"{key}","value":{{"doubleValue":{value}}}}}'
    if kind == "ai":
        vals = ",".join(f'{{"intValue":"{v}"}}' for v in value)  # type: ignore[union-attr]
        return f'{{"key":"{key}","value":{{"arrayValue":{{"values":[{vals}]}}}}}}'
    raise ValueError(kind)


def _span(trace: str, span: str, parent: str, name: str, kind: int, start: int, end: int, attrs: list[str]) -> str:
    p = f',"parentSpanId":"{parent}"' if parent else ""
    return (f'{{"traceId":"{trace}","spanId":"{span}"{p},"name":"{name}","kind":{kind},'
            f'"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}","attributes":[{",".join(attrs)}],"status":{{}}}}')


def _line(service: str, spans: list[str]) -> str:
    return ('{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"'
            + service + '"}}]},"scopeSpans":[{"scope":{"name":"ttft-diag"},"spans":[' + ",".join(spans) + "]}]}]}")


def build_capture(path: Path, n_requests: int, seed: int = 0) -> int:
    """Write the synthetic capture; returns the number of spans."""
    from diag.ground import stages as S
    from diag.ground.capture import CaptureWriter

    rng = random.Random(seed)
    t = (time.time_ns() // 10**9 - 7200) * 10**9
    client: list[str] = []
    server: list[str] = []
    n_spans = 0
    with CaptureWriter(path, meta={"benchmark": "rules_1m_spans"}) as w:
        def flush(force: bool = False) -> None:
            nonlocal client, server
            lines = []
            while len(client) >= SPANS_PER_LINE or (force and client):
                lines.append(_line("probe", client[:SPANS_PER_LINE]))
                client = client[SPANS_PER_LINE:]
            while len(server) >= SPANS_PER_LINE or (force and server):
                lines.append(_line("engine", server[:SPANS_PER_LINE]))
                server = server[SPANS_PER_LINE:]
            if lines:
                w.append_span_lines(lines)

        for i in range(n_requests):
            trace = f"{rng.getrandbits(128):032x}"
            cid, sid = f"{rng.getrandbits(64):016x}", f"{rng.getrandbits(64):016x}"
            prompt = rng.choice((64, 128, 256, 512))
            t += rng.randint(200_000, 2_000_000)  # ~1 ms between arrivals
            c0 = t
            s0 = c0 + 200_000
            tok = s0 + 30_000 + prompt * 100
            q = tok + rng.randint(0, 3_000_000)
            pre = q + 1_000_000 + prompt * 10_000
            smp = pre + 100_000
            first = smp + 50_000
            times = [first + k * 4_000_000 for k in range(8)]
            cfirst = first + 200_000
            rid = f"r{i}"
            client.append(_span(trace, cid, "", S.SPAN_CLIENT_REQUEST, 3, c0, times[-1] + 200_000, [
                _attr(S.ATTR_SIDE, "s", "client"), _attr(S.ATTR_REQUEST_ID, "s", rid),
                _attr(S.ATTR_CLIENT_START_NS, "i", c0), _attr(S.ATTR_CLIENT_SENT_NS, "i", c0 + 50_000),
                _attr(S.ATTR_CLIENT_FIRST_CONTENT_NS, "i", cfirst), _attr(S.ATTR_CLIENT_LAST_NS, "i", times[-1] + 200_000),
                _attr(S.GEN_AI_USAGE_INPUT_TOKENS, "i", prompt), _attr(S.GEN_AI_USAGE_OUTPUT_TOKENS, "i", 8),
                _attr(S.ATTR_SEGMENT, "s", "steady"), _attr(S.ATTR_TOKEN_TIMES_NS, "ai", [x + 200_000 for x in times])]))
            server.append(_span(trace, sid, cid, S.SPAN_REQUEST, 2, s0, times[-1], [
                _attr(S.ATTR_SIDE, "s", "server"), _attr(S.ATTR_REQUEST_ID, "s", rid),
                _attr(S.GEN_AI_USAGE_INPUT_TOKENS, "i", prompt), _attr(S.GEN_AI_USAGE_OUTPUT_TOKENS, "i", 8),
                _attr(S.ATTR_TP_SIZE, "i", 1), _attr(S.ATTR_FIRST_TOKEN_NS, "i", first),
                _attr(S.ATTR_TOKEN_TIMES_NS, "ai", times)]))
            for name, a, b in ((S.TOKENIZE, s0, tok), (S.QUEUE, tok, q), (S.PREFILL, q, pre), (S.SAMPLE, pre, smp),
                               (S.DETOKENIZE, smp, first)):
                server.append(_span(trace, f"{rng.getrandbits(64):016x}", sid, name, 1, a, b, []))
            server.append(_span(f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}", "", S.SPAN_ENGINE_STEP, 1,
                                q, pre, [_attr(S.ATTR_STEP_PREFILL_TOKENS, "i", prompt), _attr(S.ATTR_STEP_DECODE_SEQS, "i", 3),
                                         _attr(S.ATTR_STEP_KV_USAGE, "d", round(rng.random() * 0.5, 4)),
                                         _attr(S.ATTR_STEP_WAITING, "i", rng.randint(0, 3)),
                                         _attr(S.ATTR_STEP_RUNNING, "i", rng.randint(1, 8))]))
            n_spans += 8
            if len(server) >= 4 * SPANS_PER_LINE:
                flush()
        flush(force=True)
    return n_spans


_CHILD_JSON = """
import json, resource, sys, time
path = sys.argv[1]
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
n = 0
with open(path, "rb") as fh:
    for line in fh:
        doc = json.loads(line)
        n += 1
dt = time.perf_counter() - t
print(json.dumps({"json_s": dt, "lines": n, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0}))
"""

_CHILD_ANALYSIS = """
import json, resource, sys, time
import pandas, numpy  # imports are not part of the measurement
from diag.ground.capture import load_capture
from diag.ground.tables import build_tables
from rules.features import compute_features
import rules
path = sys.argv[1]
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
cap = load_capture(path)
t1 = time.perf_counter()
tables = build_tables(cap)
t2 = time.perf_counter()
d = rules.run_rules(tables)
t3 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
t4 = time.perf_counter()
compute_features(tables)
t5 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "tables_s": t2 - t1, "diagnose_s": t3 - t2, "features_only_s": t5 - t4,
                  "total_s": t3 - t0, "rss_kb": rss, "spans": int(len(cap.spans)), "requests": int(len(tables.requests)),
                  "verdict": d.verdict.category}))
"""


def _run_child(code: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=125_000, help="requests (8 spans each); default 125000 = 1M spans")
    ap.add_argument("--dir", type=Path, help="where to build the capture (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the capture")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    tmp = args.dir or Path(tempfile.mkdtemp(prefix="ttft-bench-"))
    cap = tmp / "capture"
    try:
        t = time.perf_counter()
        n_spans = build_capture(cap, args.requests)
        build_s = time.perf_counter() - t
        spans_file = cap / "spans.otlp.jsonl"
        size = spans_file.stat().st_size
        base = _run_child(_CHILD_JSON, spans_file)
        res = _run_child(_CHILD_ANALYSIS, cap)
        time_ratio = res["total_s"] / base["json_s"]
        mem_ratio = res["rss_kb"] * 1024 / size
        print(f"capture: {n_spans:,} spans, {args.requests:,} requests, {size / 2**20:.1f} MiB ({base['lines']:,} lines; "
              f"built in {build_s:.1f} s)")
        print(f"stdlib json.loads of every line: {base['json_s']:.2f} s")
        print(f"analysis: load {res['load_s']:.2f} s + tables {res['tables_s']:.2f} s + features&rules "
              f"{res['diagnose_s']:.2f} s = {res['total_s']:.2f} s  (features alone {res['features_only_s']:.2f} s); "
              f"verdict {res['verdict']}")
        print(f"time ratio (analysis / json): {time_ratio:.2f}x  [budget <= 2x: {'PASS' if time_ratio <= 2 else 'FAIL'}]")
        print(f"peak RSS growth: {res['rss_kb'] / 1024:.0f} MiB = {mem_ratio:.2f}x the file  "
              f"[budget < 3x: {'PASS' if mem_ratio < 3 else 'FAIL'}]")
        print(f"ru_maxrss of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
