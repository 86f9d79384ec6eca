"""The OpenTelemetry Collector's ClickHouse trace table (``otel_traces``): its DDL, OTLP spans as
its rows, and its rows back as a capture's span table.

The Collector's ``clickhouseexporter`` writes one row per span; this module reproduces what it
writes, so a capture loaded here and a fleet exporting through a real Collector give the same
table. Cited from open-telemetry/opentelemetry-collector-contrib:

* the DDL: ``exporter/clickhouseexporter/internal/sqltemplates/traces_table.sql`` @2bf6b9e1f8c8
  (the ``bloom_filter`` branch, ``MergeTree()``, no TTL; database and table are parameters);
* the row: ``exporter_traces.go`` (``pushTraceData``): ``Timestamp`` is the span's start,
  ``Duration`` its end minus start in ns, ids in lowercase hex, ``ServiceName`` the resource's
  ``service.name``, ``SpanKind``/``StatusCode`` the proto enum names (``SPAN_KIND_SERVER``,
  ``STATUS_CODE_ERROR``: ``internal/coreinternal/traceutil`` ``SpanKindStr``/``StatusCodeStr``);
* every attribute value as a string, by pdata's ``Value.AsString`` (``pdata/pcommon/value.go``):
  ints in decimal, bools ``true``/``false``, doubles in ES6 number form, arrays and maps as
  compact JSON, bytes in base64. The type is lost; :func:`decode_value` gets it back for the
  keys ``diag.ground.stages`` names.

Pure functions; any thread.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.capture_spans import KNOWN_ATTRS, SPAN_COLUMNS

DEFAULT_TABLE = "otel_traces"

#: ``{db}`` and ``{table}`` are checked identifiers (:func:`check_identifier`)
TRACES_TABLE_DDL = """CREATE TABLE IF NOT EXISTS {db}.{table} (
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    ResourceAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), CAST(ResourceAttributes, 'Array(Tuple(String, String))')),
    SpanAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), CAST(SpanAttributes, 'Array(Tuple(String, String))')),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1,
    INDEX idx_lower_span_name lower(SpanName) TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"""

#: the columns the exporter inserts, in its order (``traces_insert.sql``)
INSERT_COLUMNS: tuple[str, ...] = (
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind", "ServiceName",
    "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes", "Duration", "StatusCode", "StatusMessage",
    "Events.Timestamp", "Events.Name", "Events.Attributes", "Links.TraceId", "Links.SpanId", "Links.TraceState",
    "Links.Attributes",
)

#: OTLP's integer enums and the names the exporter stores
SPAN_KINDS: dict[int, str] = {0: "SPAN_KIND_UNSPECIFIED", 1: "SPAN_KIND_INTERNAL", 2: "SPAN_KIND_SERVER",
                              3: "SPAN_KIND_CLIENT", 4: "SPAN_KIND_PRODUCER", 5: "SPAN_KIND_CONSUMER"}
STATUS_CODES: dict[int, str] = {0: "STATUS_CODE_UNSET", 1: "STATUS_CODE_OK", 2: "STATUS_CODE_ERROR"}
_KIND_INT = {v: k for k, v in SPAN_KINDS.items()}
_STATUS_INT = {v: k for k, v in STATUS_CODES.items()}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_identifier(name: str, what: str = "table") -> str:
    """``name`` when it is a plain ClickHouse identifier (letters, digits, ``_``); ValueError otherwise."""
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ValueError(f"bad {what} name {name!r}: letters, digits and _ only")
    return name


def traces_ddl(table: str = DEFAULT_TABLE, db: str = "default") -> str:
    """The exporter's ``CREATE TABLE IF NOT EXISTS`` for ``db.table``."""
    return TRACES_TABLE_DDL.format(db=check_identifier(db, "database"), table=check_identifier(table))


# --- values: OTLP AnyValue <-> the exporter's strings -------------------------------------------


def _es6_number(f: float) -> str:
    """A float as pdata's ``float64AsString`` writes it (Go's JSON number form)."""
    if math.isinf(f) or math.isnan(f):
        return f"json: unsupported value: {'NaN' if math.isnan(f) else ('+Inf' if f > 0 else '-Inf')}"
    a = abs(f)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        s = repr(f)  # shortest digits, exponent form: 1e-07 -> 1e-7 below
        mant, _, exp = s.partition("e")
        sign = exp[0] if exp[:1] in "+-" else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"
        return f"{mant}e{sign}{digits}"
    return np.format_float_positional(f, unique=True, trim="-")


def _raw(value: Mapping[str, Any]) -> Any:
    """An OTLP JSON AnyValue as pdata's ``AsRaw`` gives it (for arrays and maps in JSON)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [_raw(v) for v in (value["arrayValue"] or {}).get("values") or ()]
    if "kvlistValue" in value:
        return {kv["key"]: _raw(kv.get("value") or {}) for kv in (value["kvlistValue"] or {}).get("values") or ()}
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def _json_raw(v: Any) -> str:
    def default(x: Any) -> Any:
        raise TypeError(type(x).__name__)

    if isinstance(v, float):
        return _es6_number(v)
    return json.dumps(v, separators=(",", ":"), sort_keys=True, ensure_ascii=False, default=default)


def encode_value(value: Mapping[str, Any]) -> str:
    """An OTLP JSON AnyValue as the exporter's map string (pdata ``Value.AsString``)."""
    if not isinstance(value, Mapping):
        return ""
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        return "true" if value["boolValue"] else "false"
    if "intValue" in value:
        return str(int(value["intValue"]))
    if "doubleValue" in value:
        return _es6_number(float(value["doubleValue"]))
    if "bytesValue" in value:
        return str(value["bytesValue"])  # OTLP JSON holds bytes in base64 already
    if "arrayValue" in value or "kvlistValue" in value:
        return _json_raw(_raw(value))
    return ""


def encode_attributes(attrs: Any) -> dict[str, str]:
    """OTLP JSON ``attributes`` (a list of ``{key, value}``) as the exporter's map."""
    out: dict[str, str] = {}
    for kv in attrs or ():
        if isinstance(kv, Mapping) and isinstance(kv.get("key"), str):
            out[kv["key"]] = encode_value(kv.get("value") or {})
    return out


#: attributes that hold text even when it reads as a number (a request id "17", a segment "64")
STRING_KEYS = frozenset({
    stages.ATTR_SIDE, stages.ATTR_REQUEST_ID, stages.ATTR_ERROR, stages.ATTR_SEGMENT, stages.ATTR_ENGINE,
    stages.ATTR_PROMPT_TEXT, stages.ATTR_CLIENT_USAGE_SOURCE, stages.ATTR_CLIENT_API, stages.ATTR_CLIENT_PREFIX_ROLE,
    stages.ATTR_CLIENT_SCHEMA_KEY, stages.ATTR_CLIENT_SCHEMA_ROLE, stages.ATTR_GRAMMAR_KEY,
    stages.ATTR_COLD_START_PHASE, stages.GEN_AI_PROVIDER_NAME, stages.GEN_AI_SYSTEM, stages.GEN_AI_OPERATION,
    stages.GEN_AI_REQUEST_MODEL, stages.GEN_AI_RESPONSE_ID, "gen_ai.response.model", "service.name",
})
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def decode_value(key: str, text: str) -> Any:
    """An exporter map string back to the value a capture holds: text for :data:`STRING_KEYS`,
    else a bool, int, float or JSON array/object when it reads as one, else the text."""
    if key in STRING_KEYS or not text:
        return text
    c = text[0]
    if c in "[{":
        try:
            return json.loads(text)
        except ValueError:
            return text
    if text == "true":
        return True
    if text == "false":
        return False
    if c in "-0123456789.":
        if _INT.fullmatch(text):
            return int(text)
        if _FLOAT.fullmatch(text):
            return float(text)
    return text


# --- OTLP spans -> rows ---------------------------------------------------------------------


def _ns(v: Any) -> int:
    return int(v) if v not in (None, "") else 0


def _secs(ns: int) -> str:
    """Unix ns as the decimal seconds a DateTime64(9) column reads exactly."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def rows_from_request(doc: Mapping[str, Any], resource_overrides: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """One ``otel_traces`` row (a JSONEachRow object, the exporter's columns) per span of an OTLP
    JSON ``ExportTraceServiceRequest``; ``resource_overrides`` are set on every span's resource
    (``service.instance.id`` for a capture that lacks it). Raises ValueError/TypeError on a span
    that is not OTLP JSON."""
    for rs in doc.get("resourceSpans") or ():
        res_attrs = encode_attributes((rs.get("resource") or {}).get("attributes"))
        if resource_overrides:
            res_attrs.update(resource_overrides)
        service = res_attrs.get("service.name", "")
        for ss in rs.get("scopeSpans") or ():
            scope = ss.get("scope") or {}
            for span in ss.get("spans") or ():
                start, end = _ns(span.get("startTimeUnixNano")), _ns(span.get("endTimeUnixNano"))
                status = span.get("status") or {}
                events = span.get("events") or ()
                links = span.get("links") or ()
                yield {
                    "Timestamp": _secs(start),
                    "TraceId": str(span.get("traceId") or "").lower(),
                    "SpanId": str(span.get("spanId") or "").lower(),
                    "ParentSpanId": str(span.get("parentSpanId") or "").lower(),
                    "TraceState": str(span.get("traceState") or ""),
                    "SpanName": str(span.get("name") or ""),
                    "SpanKind": SPAN_KINDS.get(int(span.get("kind") or 0), ""),
                    "ServiceName": service,
                    "ResourceAttributes": res_attrs,
                    "ScopeName": str(scope.get("name") or ""),
                    "ScopeVersion": str(scope.get("version") or ""),
                    "SpanAttributes": encode_attributes(span.get("attributes")),
                    "Duration": max(end - start, 0),
                    "StatusCode": STATUS_CODES.get(int(status.get("code") or 0), ""),
                    "StatusMessage": str(status.get("message") or ""),
                    "Events.Timestamp": [_secs(_ns(e.get("timeUnixNano"))) for e in events],
                    "Events.Name": [str(e.get("name") or "") for e in events],
                    "Events.Attributes": [encode_attributes(e.get("attributes")) for e in events],
                    "Links.TraceId": [str(li.get("traceId") or "").lower() for li in links],
                    "Links.SpanId": [str(li.get("spanId") or "").lower() for li in links],
                    "Links.TraceState": [str(li.get("traceState") or "") for li in links],
                    "Links.Attributes": [encode_attributes(li.get("attributes")) for li in links],
                }


# --- rows -> a capture's span table -----------------------------------------------------------

#: what a span query returns (``diag.ground.trace_sql``), one row per span
SPAN_QUERY_COLUMNS: tuple[str, ...] = ("trace_id", "span_id", "parent_span_id", "name", "kind", "service",
                                       "start_ns", "duration_ns", "status", "attributes", "replica")


def span_table(rows: pd.DataFrame, source: str) -> pd.DataFrame:
    """Span rows read back from the table (:data:`SPAN_QUERY_COLUMNS`) as a capture's span table
    (``diag.ground.capture_spans.SPAN_COLUMNS``, one column per known attribute, ``extra`` for the rest), typed
    by :func:`decode_value`. Work is one pass over the rows' attributes: for a bounded sample."""
    n = len(rows)
    start = pd.to_numeric(rows["start_ns"]).astype("int64").to_numpy() if n else np.zeros(0, dtype="int64")
    dur = pd.to_numeric(rows["duration_ns"]).astype("int64").to_numpy() if n else np.zeros(0, dtype="int64")
    out = pd.DataFrame({
        "trace_id": rows["trace_id"].astype(str).to_numpy(),
        "span_id": rows["span_id"].astype(str).to_numpy(),
        "parent_span_id": rows["parent_span_id"].astype(str).to_numpy(),
        "name": rows["name"].astype(str).to_numpy(),
        "kind": np.fromiter((_KIND_INT.get(str(k), 0) for k in rows["kind"]), dtype="int64", count=n),
        "service": rows["service"].astype(str).to_numpy(),
        "start_ns": start,
        "end_ns": start + dur,
        "status_code": np.fromiter((_STATUS_INT.get(str(s), 0) for s in rows["status"]), dtype="int64", count=n),
    })
    known: dict[str, np.ndarray] = {}
    extra = np.full(n, None, dtype=object)
    for i, attrs in enumerate(rows["attributes"]):
        items = attrs.items() if isinstance(attrs, Mapping) else (attrs or ())
        other: dict[str, Any] = {}
        for key, text in items:
            val = decode_value(key, text)
            if key in KNOWN_ATTRS:
                col = known.get(key)
                if col is None:
                    col = known[key] = np.full(n, None, dtype=object)
                col[i] = val
            else:
                other[key] = val
        if other:
            extra[i] = other
    for key, col in known.items():
        out[key] = col
    if any(e is not None for e in extra):
        out["extra"] = extra
    for col in ("trace_id", "span_id", "parent_span_id"):
        out[col] = out[col].astype("string[pyarrow]")
    for col in ("name", "service"):
        out[col] = out[col].astype("category")
    out["source_file"] = source
    return out.loc[:, [*SPAN_COLUMNS, *(c for c in out.columns if c not in SPAN_COLUMNS)]]


# --- a span table -> OTLP JSON (to keep what was read as a capture) --------------------------


def any_value(v: Any) -> dict[str, Any]:
    """A decoded attribute value as an OTLP JSON AnyValue (what the capture loader reads back)."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, (int, np.integer)):
        return {"intValue": str(int(v))}
    if isinstance(v, (float, np.floating)):
        return {"doubleValue": float(v)} if math.isfinite(v) else {"stringValue": str(v)}
    if isinstance(v, (list, tuple, np.ndarray)):
        return {"arrayValue": {"values": [any_value(x) for x in v]}}
    if isinstance(v, Mapping):
        return {"kvlistValue": {"values": [{"key": str(k), "value": any_value(x)} for k, x in v.items()]}}
    return {"stringValue": "" if v is None else str(v)}


def _present(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, float) and math.isnan(v):
        return False
    return True


def requests_from_span_table(spans: pd.DataFrame, resource: Mapping[str, str] | None = None,
                             batch: int = 512) -> Iterator[dict[str, Any]]:
    """A span table (``diag.ground.capture``'s columns) as OTLP JSON ExportTraceServiceRequests of at
    most ``batch`` spans, one resource per service with ``resource`` attributes added."""
    attr_cols = [c for c in spans.columns if c in KNOWN_ATTRS]
    extra = spans["extra"] if "extra" in spans.columns else None
    for service, group in spans.groupby(spans["service"].astype(str), sort=True, observed=True):
        res = [{"key": "service.name", "value": {"stringValue": str(service)}}]
        res += [{"key": k, "value": {"stringValue": str(v)}} for k, v in (resource or {}).items()]
        docs: list[dict[str, Any]] = []
        cols = {c: group[c].to_numpy() for c in ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns",
                                                 "end_ns", "status_code", *attr_cols)}
        extras = group["extra"].to_numpy() if extra is not None else None
        for i in range(len(group)):
            attrs = [{"key": k, "value": any_value(cols[k][i])} for k in attr_cols if _present(cols[k][i])]
            if extras is not None and isinstance(extras[i], Mapping):
                attrs += [{"key": str(k), "value": any_value(v)} for k, v in extras[i].items()]
            code = int(cols["status_code"][i])
            doc: dict[str, Any] = {"traceId": str(cols["trace_id"][i]), "spanId": str(cols["span_id"][i]),
                                   "name": str(cols["name"][i]), "kind": int(cols["kind"][i]),
                                   "startTimeUnixNano": str(int(cols["start_ns"][i])),
                                   "endTimeUnixNano": str(int(cols["end_ns"][i])), "attributes": attrs,
                                   "status": {"code": code} if code else {}}
            parent = cols["parent_span_id"][i]
            if isinstance(parent, str) and parent:
                doc["parentSpanId"] = parent
            docs.append(doc)
            if len(docs) >= batch:
                yield {"resourceSpans": [{"resource": {"attributes": res}, "scopeSpans": [{"spans": docs}]}]}
                docs = []
        if docs:
            yield {"resourceSpans": [{"resource": {"attributes": res}, "scopeSpans": [{"spans": docs}]}]}


__all__ = ["DEFAULT_TABLE", "INSERT_COLUMNS", "SPAN_KINDS", "SPAN_QUERY_COLUMNS", "STATUS_CODES", "STRING_KEYS",
           "TRACES_TABLE_DDL", "check_identifier", "decode_value", "encode_attributes", "encode_value",
           "any_value", "requests_from_span_table", "rows_from_request", "span_table", "traces_ddl"]
