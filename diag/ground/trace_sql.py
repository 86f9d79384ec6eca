"""The SQL that reads a fleet's traces where the Collector stores them (``otel_traces``).

The work is done in the database: one row per request is computed by grouping the spans by trace
(:func:`request_rows_sql`: TTFT on both sides, every stage's seconds from our stage spans or
vLLM's ``llm_request`` latencies, the replica from a resource or span attribute); from those
rows come the aggregates per replica, per window and for the fleet (:func:`aggregates_sql`:
counts, TTFT and stage quantiles, stage shares), the slowest requests of each replica
(:func:`slowest_sql`), and, for the rules, the spans of a bounded sample of each replica's most
recent requests (:func:`sample_spans_sql`) and its engine steps in their time (:func:`steps_sql`).
Only those results leave the database. The request rows are grouped once into a temporary table
that the other queries read (``diag.analysis.fleet_traces``), or, where that is refused, recomputed as a
subquery (:func:`request_source`).

The per-request arithmetic follows ``diag.ground.tables`` (stage spans count only in traces with our
``ttft.request`` root; ``prefill`` is exclusive of ``comm``; network is client TTFT minus server
TTFT; vLLM's TTFT minus queue minus prefill is the lumped stage, and with a client its gap too).
It does not correct clock skew between client and server (``diag.ground.tables`` does, on the sample).

Values are bound by the server (``{name:Type}`` parameters); the table and database names are
checked identifiers. Pure string building; any thread.
"""

from __future__ import annotations

from diag.ground import stages
from diag.ground.otel_traces import check_identifier

S = stages
#: quantiles of every latency summary, as ``diag.ground.tables.PCTS`` holds them
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))
#: spans that make a request row: roots on each side, vLLM's request span, our stage spans
REQUEST_SPAN_NAMES: tuple[str, ...] = (S.SPAN_REQUEST, S.SPAN_CLIENT_REQUEST, S.VLLM_SPAN_REQUEST, *S.ALL_STAGES)
#: spans outside requests that the rules read: engine steps and cold starts
TIMELINE_SPAN_NAMES: tuple[str, ...] = (S.SPAN_ENGINE_STEP, S.SPAN_COLD_START, S.COLD_START)
#: the stage columns of a request row (seconds; NULL where the trace has no such stage)
STAGE_COLUMNS: tuple[str, ...] = tuple(S.stage_column(s) for s in S.DECOMPOSITION_STAGES)


def _q(text: str) -> str:
    """A SQL string literal of a name from ``diag.ground.stages`` (quotes doubled)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_ref(db: str, table: str) -> str:
    return f"{check_identifier(db, 'database')}.{check_identifier(table)}"


def label_expr(by: str | None) -> str:
    """The replica of a span: ``service.name`` is the ServiceName column; any other key is looked
    up in the resource's attributes, then the span's (``{by:String}``)."""
    if not by:
        return "''"
    if by == "service.name":
        return "toString(ServiceName)"
    return ("if(mapContains(ResourceAttributes, {by:String}), ResourceAttributes[{by:String}], "
            "SpanAttributes[{by:String}])")


def window_filter(service: bool) -> str:
    """The ``--since`` window (``{lo:Int64}``, ``{hi:Int64}``: Unix ns) and, with ``service``,
    ``ServiceName = {service:String}``."""
    out = "Timestamp >= fromUnixTimestamp64Nano({lo:Int64}) AND Timestamp < fromUnixTimestamp64Nano({hi:Int64})"
    return out + (" AND ServiceName = {service:String}" if service else "")


def _a(key: str) -> str:
    return f"SpanAttributes[{_q(key)}]"


def request_rows_sql(table: str, by: str | None, service: bool) -> str:
    """One row per request (trace with a request root on either side) in the window: ``trace_id,
    replica, start_ns, end_ns, ok, error, warmup, server_ttft_s, client_ttft_s, ttft_s, e2e_s,
    input_tokens, output_tokens`` and :data:`STAGE_COLUMNS`. With ``service``, only the traces
    that service has a span in (``{service:String}``)."""
    vllm = (f"(SpanName = {_q(S.VLLM_SPAN_REQUEST)} OR (mapContains(SpanAttributes, {_q(S.GEN_AI_OPERATION)}) "
            f"AND mapContains(SpanAttributes, {_q(S.VLLM_TTFT)}) AND mapContains(SpanAttributes, {_q(S.VLLM_QUEUE)})))")
    srv, cli = f"SpanName = {_q(S.SPAN_REQUEST)}", f"SpanName = {_q(S.SPAN_CLIENT_REQUEST)}"

    def anyattr(key: str, cond: str) -> str:  # '' (absent) is NULL, which any() skips
        return f"anyIf(nullIf(a[{_q(key)}], ''), {cond})"

    def num(key: str, cond: str) -> str:
        return f"toFloat64OrNull({anyattr(key, cond)})"

    def ns(key: str, cond: str) -> str:
        return f"toInt64OrNull({anyattr(key, cond)})"

    names = ", ".join(_q(n) for n in REQUEST_SPAN_NAMES)
    roots = ", ".join(_q(n) for n in (S.SPAN_REQUEST, S.SPAN_CLIENT_REQUEST, S.VLLM_SPAN_REQUEST))
    stage_sums = ",\n    ".join(
        f"if(has_server AND countIf(SpanName = {_q(st)}) > 0, sumIf(dur_s, SpanName = {_q(st)}), NULL) AS own_{st}"
        for st in S.TTFT_STAGES + (S.NETWORK, S.LUMPED))
    having = "(has_server OR has_client OR has_vllm)"
    if service:
        having += " AND countIf(ServiceName = {service:String}) > 0"
    col = S.stage_column
    return f"""
SELECT
    TraceId AS trace_id,
    countIf({srv}) > 0 AS has_server,
    countIf({cli}) > 0 AS has_client,
    countIf(is_vllm) > 0 AS has_vllm,
    multiIf(has_server, anyIf(label, {srv}), has_vllm, anyIf(label, is_vllm), anyIf(label, {cli})) AS replica,
    if(has_server, minIf(s_start, {srv}), if(has_vllm, minIf(s_start, is_vllm), NULL)) AS server_start_ns,
    if(has_client, coalesce({ns(S.ATTR_CLIENT_START_NS, cli)}, minIf(s_start, {cli})), NULL) AS client_start_ns,
    coalesce(client_start_ns, server_start_ns) AS start_ns,
    maxIf(s_end, {srv} OR {cli} OR is_vllm) AS end_ns,
    if(has_server, ({ns(S.ATTR_FIRST_TOKEN_NS, srv)} - server_start_ns) / 1e9,
       {num(S.VLLM_TTFT, 'is_vllm')}) AS server_ttft_s,
    ({ns(S.ATTR_CLIENT_FIRST_CONTENT_NS, cli)} - client_start_ns) / 1e9 AS client_ttft_s,
    coalesce(client_ttft_s, server_ttft_s) AS ttft_s,
    coalesce(if(has_client, (coalesce({ns(S.ATTR_CLIENT_LAST_NS, cli)}, maxIf(s_end, {cli})) - client_start_ns) / 1e9,
                NULL),
             if(has_server, (maxIf(s_end, {srv}) - server_start_ns) / 1e9,
                coalesce({num(S.VLLM_E2E, 'is_vllm')}, (maxIf(s_end, is_vllm) - server_start_ns) / 1e9))) AS e2e_s,
    coalesce({anyattr(S.ATTR_ERROR, cli)}, {anyattr(S.ATTR_ERROR, srv)}) AS error,
    coalesce({anyattr(S.ATTR_WARMUP, cli)}, '') = 'true' AS warmup,
    coalesce({num(S.GEN_AI_USAGE_INPUT_TOKENS, srv)}, {num(S.VLLM_PROMPT_TOKENS, 'is_vllm')},
             {num(S.GEN_AI_USAGE_INPUT_TOKENS, 'is_vllm')}, {num(S.GEN_AI_USAGE_INPUT_TOKENS, cli)}) AS input_tokens,
    coalesce({num(S.GEN_AI_USAGE_OUTPUT_TOKENS, srv)}, {num(S.VLLM_COMPLETION_TOKENS, 'is_vllm')},
             {num(S.GEN_AI_USAGE_OUTPUT_TOKENS, 'is_vllm')}, {num(S.GEN_AI_USAGE_OUTPUT_TOKENS, cli)}) AS output_tokens,
    {stage_sums},
    {num(S.VLLM_QUEUE, 'is_vllm')} AS vllm_queue,
    {num(S.VLLM_PREFILL, 'is_vllm')} AS vllm_prefill,
    if(has_client AND (has_server OR has_vllm), client_ttft_s - server_ttft_s, NULL) AS gap_s,
    own_{S.TOKENIZE} AS {col(S.TOKENIZE)},
    if(has_server, own_{S.QUEUE}, vllm_queue) AS {col(S.QUEUE)},
    if(has_server, if(own_{S.COMM} IS NULL, own_{S.PREFILL}, greatest(own_{S.PREFILL} - own_{S.COMM}, 0)),
       vllm_prefill) AS {col(S.PREFILL)},
    own_{S.COMM} AS {col(S.COMM)},
    own_{S.SAMPLE} AS {col(S.SAMPLE)},
    own_{S.KV_TRANSFER} AS {col(S.KV_TRANSFER)},
    own_{S.DETOKENIZE} AS {col(S.DETOKENIZE)},
    if(has_server, own_{S.LUMPED},
       greatest(server_ttft_s - vllm_queue - vllm_prefill, 0) + if(gap_s IS NULL, 0, greatest(gap_s, 0))
       ) AS {col(S.LUMPED)},
    if(has_server, coalesce(own_{S.NETWORK}, gap_s), NULL) AS {col(S.NETWORK)},
    NOT warmup AND error IS NULL AND ttft_s IS NOT NULL AS ok
FROM (
    SELECT TraceId, SpanName, ServiceName,
           toUnixTimestamp64Nano(Timestamp) AS s_start,
           s_start + toInt64(Duration) AS s_end,
           {vllm} AS is_vllm,
           -- the attributes of request roots only: the stage spans need their duration alone
           if(SpanName IN ({roots}) OR is_vllm, SpanAttributes, CAST(map(), 'Map(LowCardinality(String), String)')) AS a,
           if(SpanName IN ({roots}), Duration / 1e9, coalesce(toFloat64OrNull({_a(S.ATTR_DURATION_S)}), Duration / 1e9)) AS dur_s,
           if(SpanName IN ({roots}) OR is_vllm, {label_expr(by)}, '') AS label
    FROM {table}
    WHERE {window_filter(False)}
      AND (SpanName IN ({names}) OR mapContains(SpanAttributes, {_q(S.VLLM_TTFT)}))
)
GROUP BY TraceId
HAVING {having}
"""


def _quantiles(expr: str, cond: str) -> str:
    qs = ", ".join(str(q) for _, q in QUANTILES)
    return f"quantilesExactInclusiveIf({qs})({expr}, {cond})"


def request_source(table: str, by: str | None, service: bool) -> str:
    """:func:`request_rows_sql` as a subquery to read from (where it cannot be materialized once)."""
    return f"({request_rows_sql(table, by, service)})"


def aggregates_sql(source: str) -> str:
    """Per replica, per window (``{window_ns:Int64}`` wide, by request start) and for the fleet
    (``level``: "fleet", "replica", "window"): requests, completed ones (``ok``: not warm-up,
    no error, a TTFT), errors, TTFT and server TTFT quantiles (:data:`QUANTILES`, arrays), max
    and mean, and per stage the count, quantiles and share of TTFT (the stage's sum over the sum
    of TTFT of the same requests), all over the completed requests."""
    parts = [
        "count() AS requests", "countIf(ok) AS ok_requests", "countIf(error IS NOT NULL) AS errors",
        "min(start_ns) AS first_ns", "max(end_ns) AS last_ns",
        f"{_quantiles('ttft_s', 'ok')} AS ttft_q", "maxIf(ttft_s, ok) AS ttft_max", "avgIf(ttft_s, ok) AS ttft_mean",
        f"{_quantiles('server_ttft_s', 'ok AND server_ttft_s IS NOT NULL')} AS server_ttft_q",
    ]
    for c in STAGE_COLUMNS:
        have = f"ok AND {c} IS NOT NULL"
        parts += [f"countIf({have}) AS {c}_n", f"{_quantiles(c, have)} AS {c}_q",
                  f"sumIf({c}, {have}) / nullIf(sumIf(ttft_s, {have}), 0) AS {c}_share"]
    cols = ",\n    ".join(parts)
    return f"""
SELECT
    multiIf(grouping(replica, win) = 3, 'fleet', grouping(replica, win) = 1, 'replica', 'window') AS level,
    replica, win * {{window_ns:Int64}} AS window_start_ns,
    {cols}
FROM (SELECT *, intDiv(start_ns, {{window_ns:Int64}}) AS win FROM {source})
GROUP BY GROUPING SETS ((), (replica), (replica, win))
ORDER BY level, replica, window_start_ns
"""


def slowest_sql(source: str) -> str:
    """The ``{k:UInt64}`` completed requests with the highest TTFT per replica: their trace ids
    (to look up in the trace store), TTFT and stages."""
    cols = ", ".join(STAGE_COLUMNS)
    return f"""
SELECT replica, trace_id, start_ns, ttft_s, server_ttft_s, client_ttft_s, input_tokens, output_tokens, {cols}
FROM {source}
WHERE ok
ORDER BY ttft_s DESC
LIMIT {{k:UInt64}} BY replica
"""


def sample_sql(source: str) -> str:
    """The ``{n:UInt64}`` most recent requests of each replica (all of them, errors and warm-ups
    too): ``trace_id, replica, start_ns``; what the rules judge each replica on."""
    return f"""
SELECT trace_id, replica, start_ns
FROM {source}
ORDER BY start_ns DESC
LIMIT {{n:UInt64}} BY replica
"""


_SPAN_COLUMNS = """TraceId AS trace_id, SpanId AS span_id, ParentSpanId AS parent_span_id, toString(SpanName) AS name,
       toString(SpanKind) AS kind, toString(ServiceName) AS service, toUnixTimestamp64Nano(Timestamp) AS start_ns,
       Duration AS duration_ns, toString(StatusCode) AS status, SpanAttributes AS attributes"""


def sample_spans_sql(table: str, source: str) -> str:
    """Every span of the sampled requests (:func:`sample_sql`) with its request's replica
    (``diag.ground.otel_traces.SPAN_QUERY_COLUMNS``)."""
    return f"""
SELECT {_SPAN_COLUMNS}, s.replica AS replica
FROM {table} AS t
INNER JOIN ({sample_sql(source)}) AS s ON t.TraceId = s.trace_id
WHERE {window_filter(False)}
"""


def steps_sql(table: str, by: str | None, service: bool) -> str:
    """Engine-step and cold-start spans of the replicas in ``{from_ns:Map(String, Int64)}``
    (replica -> the first Unix ns to read: the window's start when the sample holds every
    request of the replica, else its earliest sampled request), the ``{max_steps:UInt64}`` most
    recent per replica."""
    names = ", ".join(_q(n) for n in TIMELINE_SPAN_NAMES)
    return f"""
SELECT * FROM (
    SELECT {_SPAN_COLUMNS}, {label_expr(by)} AS replica
    FROM {table}
    WHERE {window_filter(service)} AND SpanName IN ({names})
)
WHERE mapContains({{from_ns:Map(String, Int64)}}, replica) AND start_ns >= {{from_ns:Map(String, Int64)}}[replica]
ORDER BY start_ns DESC
LIMIT {{max_steps:UInt64}} BY replica
"""


__all__ = ["QUANTILES", "REQUEST_SPAN_NAMES", "STAGE_COLUMNS", "TIMELINE_SPAN_NAMES", "aggregates_sql",
           "label_expr", "request_rows_sql", "request_source", "sample_spans_sql", "sample_sql", "slowest_sql", "steps_sql",
           "table_ref", "window_filter"]
