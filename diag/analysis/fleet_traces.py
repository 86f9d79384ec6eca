"""Per-replica verdicts from a fleet's traces in ClickHouse (``ttft analyze --from-clickhouse``).

The database does the work (:mod:`diag.ground.trace_sql`): it groups the spans by trace into one row
per request, aggregates those per replica, per window and for the fleet (counts, TTFT and stage
quantiles, stage shares: every request in the window), and picks the slowest requests of each
replica. What comes back to Python is bounded by the answer, not the table: those aggregates,
the slowest ``slowest`` requests of each replica, and for the rules the spans of each replica's
``sample`` most recent requests plus its engine steps in their time (at most ``max_steps``). The
rules need span-level facts (queue spans' starts, prefill windows, engine-step batches, token
times), so the sample comes back as spans and goes through the same tables and rules as a
capture: a replica whose requests all fit in the sample gets the verdict its capture file gets.

:func:`read_store` runs the queries (I/O, the caller's thread); :func:`analyze_store` judges
each replica and the fleet (pure computation on the read).
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import rules
from diag.ground import stages
from diag.ground import trace_sql as T
from diag.analysis import Analysis, analyze_captures
from diag.ground.capture import Capture, CaptureError, base_meta
from diag.ground.clickhouse import ClickHouseError, Connection, connect, table_exists
from diag.analysis.fleet import FleetAnalysis, Replica, hot_replica
from diag.ground.otel_traces import DEFAULT_TABLE, SPAN_QUERY_COLUMNS, check_identifier, requests_from_span_table, span_table

#: the replica label when none is given: the OpenTelemetry resource attribute for one instance
DEFAULT_BY = "service.instance.id"


@dataclass
class StoreQuery:
    """What to read: the table at ``url``, the last ``since_s`` seconds before ``until_ns`` (Unix
    ns; None: now), optionally one service's traces, replicas by ``by``."""

    url: str
    table: str = DEFAULT_TABLE
    service: str | None = None
    since_s: float = 3600.0
    until_ns: int | None = None
    by: str = DEFAULT_BY
    #: width of each row of the per-window table, seconds
    window_s: float = 30.0
    #: the most recent requests per replica the rules judge (their spans come back)
    sample: int = 5000
    #: the slowest requests per replica listed by trace id
    slowest: int = 10
    #: engine-step spans per replica at most
    max_steps: int = 200_000


@dataclass
class StoreRead:
    """What the queries returned: aggregates, slowest requests, the sample's spans (a capture's
    span table with a ``replica`` column) and what it cost."""

    query: StoreQuery
    where: str  # the URL without its password, and the table
    lo_ns: int
    hi_ns: int
    aggregates: pd.DataFrame
    slowest: pd.DataFrame
    spans: pd.DataFrame
    totals: dict[str, int]
    sampled: dict[str, int]
    steps: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-safe: the window, the fleet's and each replica's aggregates (with their windows),
        the slowest requests, what was sampled and how long each query took."""
        agg = self.aggregates
        fleet = agg[agg["level"] == "fleet"]
        per_rep: dict[str, Any] = {}
        for name, row in agg[agg["level"] == "replica"].set_index("replica").iterrows():
            wins = agg[(agg["level"] == "window") & (agg["replica"] == name)]
            per_rep[str(name)] = {**_agg_dict(row), "judged_requests": self.sampled.get(str(name), 0),
                                  "steps_read": self.steps.get(str(name), 0),
                                  "windows": [{"start_ns": int(w["window_start_ns"]), **_agg_dict(w, brief=True)}
                                              for _, w in wins.iterrows()]}
        slow: dict[str, list[dict[str, Any]]] = {}
        for _, r in self.slowest.sort_values(["replica", "ttft_s"], ascending=[True, False]).iterrows():
            slow.setdefault(str(r["replica"]), []).append({
                "trace_id": str(r["trace_id"]), "start_ns": int(r["start_ns"]), "ttft_s": _f(r["ttft_s"]),
                "server_ttft_s": _f(r["server_ttft_s"]), "input_tokens": _f(r["input_tokens"]),
                **{c: _f(r[c]) for c in T.STAGE_COLUMNS}})
        q = self.query
        return {"source": "clickhouse", "where": self.where, "service": q.service, "by": q.by,
                "from_ns": self.lo_ns, "to_ns": self.hi_ns, "window_s": q.window_s, "sample_per_replica": q.sample,
                "fleet": _agg_dict(fleet.iloc[0]) if len(fleet) else None, "replicas": per_rep, "slowest": slow,
                "rows_read": {"aggregates": len(agg), "slowest": len(self.slowest), "spans": len(self.spans)},
                "query_s": {k: round(v, 4) for k, v in self.seconds.items()}}


def _f(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _quantile_dict(arr: Any) -> dict[str, float | None]:
    vals = list(arr) if isinstance(arr, (list, tuple, np.ndarray)) else []
    return {name: (_f(vals[i]) if i < len(vals) else None) for i, (name, _q) in enumerate(T.QUANTILES)}


def _agg_dict(row: pd.Series, brief: bool = False) -> dict[str, Any]:
    """One aggregate row as the decomposition's shape: counts, TTFT summary, stages."""
    ok = int(row["ok_requests"])
    out: dict[str, Any] = {"requests": int(row["requests"]), "ok_requests": ok, "errors": int(row["errors"]),
                           "ttft_s": {"count": ok, **(_quantile_dict(row["ttft_q"]) if ok else
                                                      {n: None for n, _ in T.QUANTILES}),
                                      "max": _f(row["ttft_max"]) if ok else None,
                                      "mean": _f(row["ttft_mean"]) if ok else None}}
    stage_out: dict[str, Any] = {}
    for st in stages.DECOMPOSITION_STAGES:
        c = stages.stage_column(st)
        n = int(row[f"{c}_n"])
        if not n:
            continue
        share = _f(row[f"{c}_share"])
        stage_out[st] = {"share_of_ttft": share} if brief else {"count": n, **_quantile_dict(row[f"{c}_q"]),
                                                               "share_of_ttft": share}
    out["stages"] = stage_out
    if not brief:
        out["first_ns"], out["last_ns"] = int(row["first_ns"]), int(row["last_ns"])
    return out


def _timed(seconds: dict[str, float], name: str, conn: Connection, sql: str, params: dict[str, Any]) -> pd.DataFrame:
    t0 = time.perf_counter()
    out = conn.query_df(sql, params)
    seconds[name] = time.perf_counter() - t0
    return out


def _request_rows(conn: Connection, table: str, by: str | None, service: bool, params: dict[str, Any],
                  seconds: dict[str, float]) -> tuple[str, str | None]:
    """Where the other queries read the request rows from: a temporary table made once (the
    spans are grouped once), or, where the user may not make one (``readonly=1``), the grouping
    as a subquery in each. Returns (source, the temporary table to drop or None)."""
    temp = f"ttft_requests_{uuid.uuid4().hex[:12]}"
    t0 = time.perf_counter()
    try:
        conn.command(f"CREATE TEMPORARY TABLE {temp} ENGINE = Memory AS {T.request_rows_sql(table, by, service)}",
                     params)
    except ClickHouseError:
        return T.request_source(table, by, service), None
    seconds["request_rows"] = time.perf_counter() - t0
    return temp, temp


def read_store(q: StoreQuery, conn: Connection | None = None) -> StoreRead:
    """Run the queries of :mod:`diag.ground.trace_sql` for ``q``; raises ClickHouseError (one line) on a
    bad URL or table, an unreachable server, or a window with no request span."""
    check_identifier(q.table)
    if q.since_s <= 0 or q.window_s <= 0 or q.sample < 1 or q.slowest < 0 or q.max_steps < 0:
        raise ClickHouseError("--since, --window and --sample must be > 0")
    own = conn is None
    conn = conn or connect(q.url)
    try:
        db = conn.target.database
        where = f"{conn.target.redacted()} table {db}.{q.table}"
        if not table_exists(conn, q.table):
            raise ClickHouseError(f"{conn.target.redacted()}: no table {db}.{q.table} (the Collector's "
                                  "clickhouseexporter makes otel_traces; give --table)")
        hi = q.until_ns if q.until_ns is not None else time.time_ns() + 1
        lo = hi - int(q.since_s * 1e9)
        table = T.table_ref(db, q.table)
        params: dict[str, Any] = {"lo": lo, "hi": hi}
        if q.by and q.by != "service.name":
            params["by"] = q.by
        if q.service:
            params["service"] = q.service
        svc = bool(q.service)
        seconds: dict[str, float] = {}
        source, temp = _request_rows(conn, table, q.by, svc, params, seconds)
        try:
            agg = _timed(seconds, "aggregates", conn, T.aggregates_sql(source),
                         {**params, "window_ns": int(q.window_s * 1e9)})
            fleet = agg[agg["level"] == "fleet"]
            if not len(fleet) or int(fleet["requests"].iloc[0]) == 0:
                raise ClickHouseError(f"{where}: no request spans ({stages.SPAN_REQUEST}, {stages.SPAN_CLIENT_REQUEST} "
                                      f"or {stages.VLLM_SPAN_REQUEST}) in the last {q.since_s:g} s"
                                      + (f" from service {q.service!r}" if q.service else ""))
            reps = agg[agg["level"] == "replica"]
            totals = {str(r): int(n) for r, n in zip(reps["replica"], reps["requests"])}
            slowest = _timed(seconds, "slowest", conn, T.slowest_sql(source), {**params, "k": q.slowest}) \
                if q.slowest else pd.DataFrame(columns=["replica", "trace_id", "start_ns", "ttft_s", "server_ttft_s",
                                                        "input_tokens", *T.STAGE_COLUMNS])
            sample = _timed(seconds, "sample", conn, T.sample_sql(source), {**params, "n": q.sample})
            sampled = {str(k): int(v) for k, v in sample.groupby("replica")["trace_id"].count().items()}
            first = {str(k): int(v) for k, v in sample.groupby("replica")["start_ns"].min().items()}
            from_ns = {r: (lo if sampled.get(r, 0) >= totals.get(r, 0) else first[r]) for r in sampled}
            spans = _timed(seconds, "sample_spans", conn, T.sample_spans_sql(table, source), {**params, "n": q.sample})
            steps = _timed(seconds, "steps", conn, T.steps_sql(table, q.by, svc),
                           {**params, "from_ns": from_ns, "max_steps": q.max_steps}) if q.max_steps and from_ns \
                else pd.DataFrame(columns=list(SPAN_QUERY_COLUMNS))
        finally:
            if temp:
                try:
                    conn.command(f"DROP TEMPORARY TABLE IF EXISTS {temp}")
                except ClickHouseError:
                    pass
    finally:
        if own:
            conn.close()
    step_counts = {str(k): int(v) for k, v in steps.groupby("replica")["span_id"].count().items()} if len(steps) else {}
    rows = pd.concat([spans, steps], ignore_index=True) if len(steps) else spans
    rows = rows.drop_duplicates(subset=["trace_id", "span_id"], keep="first").reset_index(drop=True)
    table_df = span_table(rows, f"clickhouse:{db}.{q.table}")
    table_df["replica"] = rows["replica"].astype(str).to_numpy()
    return StoreRead(q, where, lo, hi, agg, slowest, table_df, totals, sampled, step_counts, seconds)


def _empty_series() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("ts_s", "value") else object)
                         for c in stages.SERIES_COLUMNS})


def _capture(read: StoreRead, name: str, spans: pd.DataFrame, series: pd.DataFrame | None = None) -> Capture:
    q = read.query
    meta = {**base_meta(), "command": "analyze --from-clickhouse", "source": {
        "clickhouse": read.where, "service": q.service, "by": q.by, "replica": name or None,
        "from_ns": read.lo_ns, "to_ns": read.hi_ns}}
    return Capture(path=Path(f"clickhouse/{q.table}/{name or 'fleet'}"), meta=meta,
                   spans=spans.drop(columns=["replica"]).reset_index(drop=True),
                   series=series if series is not None else _empty_series(), warnings=[])


def analyze_store(read: StoreRead, rules_file: str | None = None, slo: dict[str, float] | None = None,
                  series: pd.DataFrame | None = None) -> FleetAnalysis:
    """Judge each replica on its sampled spans, the fleet on all of them, and name the hot replica
    (a bottleneck verdict and the highest TTFT p95 over all its requests in the window, from the
    database). ``series`` (``diag.ground.stages.SERIES_COLUMNS``, e.g. ``--from-prometheus``'s) joins in:
    the fleet gets every row, a replica the rows whose ``entity`` is its name. Raises CaptureError
    when no span names a replica by ``by``."""
    spans = read.spans
    fleet = analyze_captures([_capture(read, "", spans, series)], rules_file=rules_file, slo=slo)
    entity = series["entity"].astype(str) if series is not None and len(series) else None
    p95 = {}
    reps = read.aggregates[read.aggregates["level"] == "replica"]
    for name, q in zip(reps["replica"], reps["ttft_q"]):
        p95[str(name)] = _quantile_dict(q)["p95"]
    replicas: list[Replica] = []
    for name in sorted(n for n in spans["replica"].unique() if n):
        rows = spans[spans["replica"] == name]
        own = series[entity == name].reset_index(drop=True) if entity is not None else None
        one: Analysis = analyze_captures([_capture(read, name, rows, own)], rules_file=rules_file, slo=slo)
        replicas.append(Replica(name, one, p95.get(name), len(rows)))
    if not replicas:
        raise CaptureError(f"{read.where}: no span carries a replica label {read.query.by!r} (a resource or span "
                           "attribute; give --by, e.g. host.name or service.name)")
    return FleetAnalysis(read.query.by, fleet, replicas, hot_replica(replicas), store=read.summary())


def write_captures(read: StoreRead, out: str | Path) -> list[Path]:
    """What was read, kept as captures: ``out/<replica>/`` holds that replica's sampled spans
    (``spans.otlp.jsonl``, its resource naming the replica by ``by``) and a ``meta.json`` saying
    where they came from; ``ttft report``, ``view``, ``diff`` and ``export`` read them."""
    from diag.ground.capture import CaptureWriter
    from diag.ground.otlp_json import json_line

    base = Path(out)
    written = []
    for name in sorted(str(n) for n in read.spans["replica"].unique()):
        rows = read.spans[read.spans["replica"] == name].drop(columns=["replica"])
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "unlabelled"
        cap = _capture(read, name, read.spans[read.spans["replica"] == name])
        with CaptureWriter(base / safe, meta={"command": "analyze --from-clickhouse -o",
                                              "source": cap.meta["source"]}) as w:
            w.append_span_lines(json_line(doc) for doc in
                                requests_from_span_table(rows, {read.query.by: name} if name and read.query.by else None))
        written.append(base / safe)
    return written


def analyze_clickhouse(q: StoreQuery, rules_file: str | None = None, slo: dict[str, float] | None = None) -> FleetAnalysis:
    """:func:`read_store` then :func:`analyze_store`."""
    return analyze_store(read_store(q), rules_file, slo)


__all__ = ["DEFAULT_BY", "StoreQuery", "StoreRead", "analyze_clickhouse", "analyze_store", "read_store",
           "write_captures"]
