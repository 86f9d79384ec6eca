"""Offline analysis budget: load a 1,000,000-span capture and build its tables.

Prints (a) load + tables time as a ratio to the standard library's ``json.loads`` of the same
lines, and (b) peak memory as a ratio to the file size. Budget (docs/design.md): <= 2x and < 3x.

Usage: python benchmarks/capture_1m_spans.py [--spans N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diag.ground import stages  # noqa: E402
from diag.ground.capture import SPANS_FILE, CaptureWriter  # noqa: E402

SPANS_PER_REQUEST = 8  # root + 6 stages + 1 engine step
BATCH = 512


def _attr(key: str, value: object) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    if isinstance(value, list):
        return {"key": key, "value": {"arrayValue": {"values": [{"intValue": str(v)} for v in value]}}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _request_spans(i: int, t0: int) -> list[dict]:
    tid = f"{i + 1:032x}"
    root = f"{i * 16 + 1:016x}"
    ms = 1_000_000
    tokens = [t0 + (40 + k * 10) * ms for k in range(4)]
    spans = [{
        "traceId": tid, "spanId": root, "name": stages.SPAN_REQUEST, "kind": 2,
        "startTimeUnixNano": str(t0), "endTimeUnixNano": str(tokens[-1]),
        "attributes": [_attr(stages.ATTR_SIDE, "server"), _attr(stages.ATTR_REQUEST_ID, f"req-{i}"),
                       _attr(stages.GEN_AI_REQUEST_MODEL, "tiny"), _attr(stages.GEN_AI_USAGE_INPUT_TOKENS, 100 + i % 900),
                       _attr(stages.GEN_AI_USAGE_OUTPUT_TOKENS, 4), _attr(stages.ATTR_TOKEN_TIMES_NS, tokens),
                       _attr(stages.ATTR_FIRST_TOKEN_NS, tokens[0])],
        "status": {},
    }]
    t = t0
    colocated = (stages.TOKENIZE, stages.QUEUE, stages.PREFILL, stages.COMM, stages.SAMPLE, stages.DETOKENIZE)
    for k, (name, dur) in enumerate(zip(colocated, (1, 5, 25, 3, 1, 1))):
        spans.append({"traceId": tid, "spanId": f"{i * 16 + 2 + k:016x}", "parentSpanId": root, "name": name,
                      "kind": 1, "startTimeUnixNano": str(t), "endTimeUnixNano": str(t + dur * ms), "status": {}})
        t += dur * ms if name != stages.COMM else 0
    spans.append({"traceId": f"{i + 10**9:032x}", "spanId": f"{i * 16 + 9:016x}", "name": stages.SPAN_ENGINE_STEP,
                  "kind": 1, "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 30 * ms),
                  "attributes": [_attr(stages.ATTR_STEP_PREFILL_TOKENS, 100), _attr(stages.ATTR_STEP_DECODE_SEQS, 3),
                                 _attr(stages.ATTR_STEP_KV_USAGE, 0.4)], "status": {}})
    return spans


def write_capture(path: Path, n_spans: int) -> Path:
    resource_doc = {"attributes": [_attr("service.name", "bench-engine")]}
    w = CaptureWriter(path, meta={"what_ran": "benchmarks/capture_1m_spans.py"})
    pending: list[dict] = []
    lines: list[str] = []
    t0 = 1_700_000_000_000_000_000
    for i in range(n_spans // SPANS_PER_REQUEST):
        pending.extend(_request_spans(i, t0 + i * 50_000_000))
        if len(pending) >= BATCH:
            doc = {"resourceSpans": [{"resource": resource_doc, "scopeSpans": [{"scope": {"name": "ttft-diag"}, "spans": pending}]}]}
            lines.append(json.dumps(doc, separators=(",", ":")))
            pending = []
            if len(lines) >= 64:
                w.append_span_lines(lines)
                lines = []
    if pending:
        doc = {"resourceSpans": [{"resource": resource_doc, "scopeSpans": [{"scope": {"name": "ttft-diag"}, "spans": pending}]}]}
        lines.append(json.dumps(doc, separators=(",", ":")))
    w.append_span_lines(lines)
    w.close()
    return path


_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
mode, path = sys.argv[1], sys.argv[2]
if mode != "json":  # imports are not part of the measurement
    from diag.ground.capture import load_capture
    from diag.ground.tables import build_tables, stage_decomposition
    if mode == "rules":
        import rules
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if mode == "json":
    n = 0
    with open(path + "/spans.otlp.jsonl", "rb") as fh:
        for line in fh:
            n += len(json.loads(line)["resourceSpans"])
else:
    tables = build_tables(load_capture(path))
    stage_decomposition(tables.requests)
    n = len(tables.spans)
    if mode == "rules":
        rules.run_rules(tables)
elapsed = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"elapsed_s": elapsed, "peak_rss_delta_bytes": (peak - before) * 1024, "n": n}}))
"""


def measure(mode: str, path: Path) -> dict:
    """Run one measurement in a fresh interpreter so peak RSS is its own."""
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", _CHILD.format(root=root), mode, str(path)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="where to write the capture (default: a temp dir)")
    ap.add_argument("--rules", action="store_true", help="also time features + rules (rules.run_rules)")
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ttft-bench-"))
    cap = base / "capture"
    if not (cap / SPANS_FILE).exists():
        t = time.perf_counter()
        write_capture(cap, args.spans)
        print(f"wrote {args.spans:,} spans in {time.perf_counter() - t:.1f}s")
    size = os.path.getsize(cap / SPANS_FILE)
    print(f"file: {cap / SPANS_FILE} ({size / 2**20:.1f} MiB)")
    modes = ["json", "load", "json", "load"] + (["rules"] if args.rules else [])
    results: dict[str, list[dict]] = {}
    for mode in modes:  # interleaved, best of two
        results.setdefault(mode, []).append(measure(mode, cap))
    best = {m: min(r, key=lambda x: x["elapsed_s"]) for m, r in results.items()}
    base_s = best["json"]["elapsed_s"]
    print(f"baseline json.loads of every line: {base_s:.2f}s")
    for mode in ("load", "rules"):
        if mode in best:
            b = best[mode]
            print(f"{mode:5s}: {b['elapsed_s']:.2f}s = {b['elapsed_s'] / base_s:.2f}x json.loads (budget <= 2x); "
                  f"peak memory {b['peak_rss_delta_bytes'] / 2**20:.0f} MiB = {b['peak_rss_delta_bytes'] / size:.2f}x file size (budget < 3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
