"""Fleet traces in ClickHouse: ``--from-clickhouse`` on 10,000,000 spans against a capture file.

What it does, each measurement in a fresh interpreter (peak RSS is its own; imports are not
timed):

1. writes a capture of ``--file-spans`` spans (default 1,000,000: 125,000 requests of
   ``capture_1m_spans.py``'s shape, a root, six stages and an engine step each) dated the last
   50 minutes, and times ``analyze`` of it (load, tables, rules): the baseline;
2. loads that capture into an embedded ClickHouse (chdb) ``otel_traces`` table through the
   Collector-exporter loader (``ttft export --to-clickhouse``), as replica ``replica-0``, and
   times ``--from-clickhouse`` (the SQL, the sample's spans, tables and rules per replica);
3. copies the table's spans in SQL (``INSERT ... SELECT``) as replicas ``replica-1`` ...
   ``replica-9``: ``--table-copies`` x the file's spans (10,000,000 by default), and times
   ``--from-clickhouse`` again.

A 10,000,000-span capture file is about 4.6 GB and needs about 2x that in memory to load, more
than this machine can spare beside other work: its figures are the 1,000,000-span file's scaled
by 10 (loading is linear in spans: ``capture_1m_spans.py``), and printed as such. The embedded
engine runs inside the measured process, so the ClickHouse figures' memory includes the
database's own working memory (a server would hold that, not the client).

Usage: python benchmarks/clickhouse_10m_spans.py [--file-spans N] [--table-copies K] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capture_1m_spans import SPANS_PER_REQUEST, _attr, _request_spans  # noqa: E402
from diag.ground.capture import SPANS_FILE, CaptureWriter  # noqa: E402

BATCH = 512


def write_capture(path: Path, n_spans: int, t0: int, span_ns: int) -> int:
    """``n_spans`` spans of ``capture_1m_spans.py``'s requests, starting at ``t0`` over ``span_ns``."""
    n_req = n_spans // SPANS_PER_REQUEST
    gap = span_ns // max(n_req, 1)
    resource = {"attributes": [_attr("service.name", "bench-engine")]}
    w = CaptureWriter(path, meta={"what_ran": "benchmarks/clickhouse_10m_spans.py"})
    pending: list[dict] = []
    lines: list[str] = []
    for i in range(n_req):
        pending.extend(_request_spans(i, t0 + i * gap))
        if len(pending) >= BATCH or i == n_req - 1:
            doc = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "ttft-diag"},
                                                                           "spans": pending}]}]}
            lines.append(json.dumps(doc, separators=(",", ":")))
            pending = []
            if len(lines) >= 64 or i == n_req - 1:
                w.append_span_lines(lines)
                lines = []
    w.close()
    return n_req * SPANS_PER_REQUEST


_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
mode, arg = sys.argv[1], sys.argv[2]
from diag.analysis import analyze_paths
from diag.analysis.fleet_traces import StoreQuery, analyze_store, read_store
import rules
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if mode == "file":
    a = analyze_paths([arg])
    out = {{"verdict": a.diagnosis.verdict.category, "requests": a.decomposition["requests"]}}
else:
    read = read_store(StoreQuery(arg, since_s=3600, sample=int(sys.argv[3])))
    f = analyze_store(read)
    out = {{"verdict": f.fleet.diagnosis.verdict.category, "replicas": len(f.replicas),
           "requests": read.summary()["fleet"]["requests"], "spans_back": len(read.spans),
           "query_s": read.seconds}}
elapsed = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"elapsed_s": elapsed, "peak_rss_delta_bytes": (peak - before) * 1024,
                   "peak_rss_bytes": peak * 1024, **out}}))
"""


def measure(*argv: str) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", _CHILD.format(root=root), *argv], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"child failed: {argv}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def copy_sql(copies: int) -> str:
    """The table's spans again as replicas 1..copies-1: trace ids made unique by their first hex
    digit, the replica label set on the resource."""
    from diag.ground.otel_traces import INSERT_COLUMNS

    cols = ", ".join(INSERT_COLUMNS)
    exprs = {"TraceId": "concat(lower(substring(hex(toUInt8(k.c)), 2, 1)), substring(t.TraceId, 2))",
             "ResourceAttributes": "mapUpdate(t.ResourceAttributes, "
                                   "map('service.instance.id', concat('replica-', toString(k.c))))"}
    select = ", ".join(exprs.get(c, f"t.{c}") for c in INSERT_COLUMNS)
    return (f"INSERT INTO default.otel_traces ({cols}) SELECT {select} "
            f"FROM default.otel_traces AS t, (SELECT number + 1 AS c FROM numbers({copies - 1})) AS k")


def _line(name: str, r: dict, base: dict, scale: float = 1.0) -> str:
    t, m = r["elapsed_s"], r["peak_rss_delta_bytes"]
    return (f"{name:<44} {t:8.2f} s  {t / (base['elapsed_s'] * scale):6.3f}x   peak RSS +{m / 2**20:7.0f} MiB  "
            f"{m / max(base['peak_rss_delta_bytes'] * scale, 1):6.3f}x  (process {r['peak_rss_bytes'] / 2**20:.0f} MiB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file-spans", type=int, default=1_000_000)
    ap.add_argument("--table-copies", type=int, default=10, help="table spans = file spans x this (at most 16)")
    ap.add_argument("--sample", type=int, default=5000, help="requests per replica the rules judge")
    ap.add_argument("--dir", default=None, help="working directory (default: a temp dir)")
    args = ap.parse_args()
    if not 1 <= args.table_copies <= 16:
        ap.error("--table-copies must be 1..16")
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ttft-bench-ch-"))
    cap, db = base / "capture", base / "chdb"
    t0 = time.time_ns() - 3000 * 10**9
    t = time.perf_counter()
    n = write_capture(cap, args.file_spans, t0, 2900 * 10**9)
    size = (cap / SPANS_FILE).stat().st_size
    print(f"capture: {n:,} spans, {size / 2**20:.0f} MiB, written in {time.perf_counter() - t:.1f} s")

    from diag.ground.clickhouse import connect
    from diag.ground.clickhouse_load import load_captures

    conn = connect(f"chdb:{db}")
    try:
        t = time.perf_counter()
        loaded, _ = load_captures(conn, [cap], resource_overrides={"service.instance.id": "replica-0"})
        load_s = time.perf_counter() - t
    finally:
        conn.close()
    print(f"loader (export --to-clickhouse): {loaded:,} spans in {load_s:.1f} s = {loaded / load_s:,.0f} spans/s")

    file_r = measure("file", str(cap))
    ch1 = measure("ch", f"chdb:{db}", str(args.sample))
    conn = connect(f"chdb:{db}")
    try:
        t = time.perf_counter()
        if args.table_copies > 1:
            conn.command(copy_sql(args.table_copies))
        total = int(conn.query_df("SELECT count() AS n FROM default.otel_traces")["n"].iloc[0])
        copy_s = time.perf_counter() - t
    finally:
        conn.close()
    print(f"table: {total:,} spans ({args.table_copies} replicas) after an INSERT ... SELECT of {copy_s:.1f} s")
    chn = measure("ch", f"chdb:{db}", str(args.sample))

    k = args.table_copies
    print()
    print(f"{'':<44} {'time':>10}  {'/file':>7}   {'memory':>20}  {'/file':>6}")
    print(_line(f"capture file, {n:,} spans (baseline)", file_r, file_r))
    print(f"{f'capture file, {n * k:,} spans (x{k}, scaled)':<44} {file_r['elapsed_s'] * k:8.2f} s  "
          f"{'1.000x':>7}   peak RSS +{file_r['peak_rss_delta_bytes'] * k / 2**20:7.0f} MiB  {'1.000x':>6}")
    print(_line(f"--from-clickhouse, {n:,} spans", ch1, file_r))
    print(_line(f"--from-clickhouse, {total:,} spans", chn, file_r, scale=k) + f"   (vs the x{k} file)")
    for name, r in ((f"{n:,}", ch1), (f"{total:,}", chn)):
        q = ", ".join(f"{key} {v:.2f} s" for key, v in r["query_s"].items())
        print(f"  {name} spans: {r['requests']:,} requests, {r['replicas']} replicas, {r['spans_back']:,} spans back "
              f"to Python; verdict {r['verdict']}; queries: {q}")
    print(f"  file: {file_r['requests']:,} requests, verdict {file_r['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
