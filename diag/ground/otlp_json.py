"""OTLP JSON <-> ``opentelemetry.proto`` messages, by the OTLP/JSON rules.

OTLP JSON is protobuf's JSON mapping with three differences that a plain
``google.protobuf.json_format`` round trip gets wrong: trace and span ids are lowercase hex
(not base64), enums are integers, and keys are lowerCamelCase. 64-bit integers are strings.
This module is the only place that converts; everything else handles dicts or messages. SDK spans
(``ReadableSpan``) become OTLP JSON straight from their fields (:func:`spans_to_dict`), the same
document the protobuf route gives, at a fraction of its CPU on an export thread.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import SpanKind

try:  # a dependency; the stdlib encoder stands in where it is missing
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - depends on the environment
    _orjson_dumps = None

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


class OTLPJSONError(ValueError):
    """An OTLP JSON document that cannot be turned into an ExportTraceServiceRequest."""


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The dict items of a JSON list (anything else is left for the schema check to reject)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _walk_ids(doc: dict[str, Any], convert: Any) -> None:
    for rs in _dicts(doc.get("resourceSpans")):
        for ss in _dicts(rs.get("scopeSpans")):
            for span in _dicts(ss.get("spans")):
                for key in _ID_KEYS:
                    if isinstance(span.get(key), str) and span[key]:
                        span[key] = convert(span[key])
                for link in _dicts(span.get("links")):
                    for key in ("traceId", "spanId"):
                        if isinstance(link.get(key), str) and link[key]:
                            link[key] = convert(link[key])


def _b64_to_hex(value: str) -> str:
    try:
        return base64.b64decode(value).hex()
    except ValueError as exc:
        raise OTLPJSONError(f"id {value!r} is not base64") from exc


def _hex_to_b64(value: str) -> str:
    try:
        raw = bytes.fromhex(value)
    except ValueError as exc:
        raise OTLPJSONError(f"id {value!r} is not hex") from exc
    return base64.b64encode(raw).decode("ascii")


def request_to_dict(message: ExportTraceServiceRequest) -> dict[str, Any]:
    """An ExportTraceServiceRequest as an OTLP JSON object (hex ids, integer enums)."""
    doc = json_format.MessageToDict(message, use_integers_for_enums=True)
    _walk_ids(doc, _b64_to_hex)
    return doc


def request_to_json_line(message: ExportTraceServiceRequest) -> str:
    """One compact JSON line, as the OpenTelemetry Collector's file exporter writes it."""
    return json.dumps(request_to_dict(message), separators=(",", ":"))


def dict_to_request(doc: dict[str, Any]) -> ExportTraceServiceRequest:
    """Parse an OTLP JSON object into a message; unknown fields are ignored (OTLP rule).

    Raises OTLPJSONError when the document does not fit the schema.
    """
    if not isinstance(doc, dict):
        raise OTLPJSONError("an OTLP JSON document must be an object")
    doc = json.loads(json.dumps(doc))  # deep copy: ids are rewritten in place
    _walk_ids(doc, _hex_to_b64)
    try:
        return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise OTLPJSONError(f"not OTLP JSON: {exc}".splitlines()[0]) from exc


def json_to_request(text: str | bytes) -> ExportTraceServiceRequest:
    """Parse OTLP JSON text (one request) into a message."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OTLPJSONError(f"invalid JSON: {exc}") from exc
    return dict_to_request(doc)


# --- straight from SDK spans, without protobuf (the capture exporter's fast path) --------------

_OTLP_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_FLAGS_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


class NotPlainValue(Exception):
    """A value the fast path does not encode (bytes, mappings): the protobuf route takes the batch."""


def _json_value(value: Any) -> dict[str, Any]:
    """An attribute value as OTLP JSON ``AnyValue`` (int64 as a string, as proto3 JSON writes it)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise NotPlainValue  # "NaN"/"Infinity": leave them to the protobuf route
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        if not value:
            return {"arrayValue": {}}
        if all(type(v) is int for v in value):  # token times: the one long array, ints only
            return {"arrayValue": {"values": [{"intValue": str(v)} for v in value]}}
        return {"arrayValue": {"values": [_json_value(v) for v in value]}}
    raise NotPlainValue


def _json_attributes(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _json_value(v)} for k, v in attributes.items()] if attributes else []


def _json_span(span: Any) -> dict[str, Any]:
    return span_to_dict(span.context, span.parent, span.name, span.kind, span.start_time, span.end_time,
                        span.attributes, span.dropped_attributes, span.status)


def span_to_dict(ctx: Any, parent: Any, name: str, kind: SpanKind, start_ns: int,
                   end_ns: int, attributes: Mapping[str, Any] | None, dropped_attributes: int,
                   status: Any) -> dict[str, Any]:
    """One span as OTLP JSON (what ``request_to_dict(encode_spans(...))`` holds for it)."""
    doc: dict[str, Any] = {"traceId": format(ctx.trace_id, "032x"), "spanId": format(ctx.span_id, "016x")}
    if ctx.trace_state:
        doc["traceState"] = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    if parent is not None:
        doc["parentSpanId"] = format(parent.span_id, "016x")
    doc["flags"] = _FLAGS_HAS_IS_REMOTE | (_FLAGS_IS_REMOTE if parent is not None and parent.is_remote else 0)
    doc["name"] = name
    doc["kind"] = _OTLP_KIND[kind]
    doc["startTimeUnixNano"] = str(start_ns)
    doc["endTimeUnixNano"] = str(end_ns)
    attrs = _json_attributes(attributes)
    if attrs:
        doc["attributes"] = attrs
    if dropped_attributes:
        doc["droppedAttributesCount"] = dropped_attributes
    status_doc: dict[str, Any] = {}
    if status.status_code.value:
        status_doc["code"] = status.status_code.value
    if status.description:
        status_doc["message"] = status.description
    doc["status"] = status_doc
    return doc


def json_line(doc: Mapping[str, Any]) -> str:
    """One compact JSON line for an OTLP JSON document: orjson (8x the stdlib encoder's speed on
    span batches, 5 vs 41 us a span on the export thread), the stdlib where it is missing."""
    if _orjson_dumps is not None:
        return _orjson_dumps(doc).decode()
    return json.dumps(doc, separators=(",", ":"))


def spans_to_dict(spans: Sequence[Any]) -> dict[str, Any] | None:
    """The OTLP JSON ``ExportTraceServiceRequest`` for ``spans`` (hex ids, integer enums).

    The document ``request_to_dict(encode_spans(spans))`` gives, built directly; None when a span
    has events or links or a value outside str/bool/int/finite float and their arrays.
    """
    # grouped by identity, then by value: ``Resource.__hash__`` serialises its attributes to JSON
    # on every call (35 us a span, more than encoding the span); a sink's spans share one object
    by_id: dict[tuple[int, int], tuple[Any, Any, list[dict[str, Any]]]] = {}
    try:
        for span in spans:
            if span.events or span.links or span.end_time is None:
                return None
            resource, scope = span.resource, span.instrumentation_scope
            key = (id(resource), id(scope))
            group = by_id.get(key)
            if group is None:
                group = by_id[key] = (resource, scope, [])
            group[2].append(_json_span(span))
        groups: dict[Any, dict[Any, list[dict[str, Any]]]] = {}
        for resource, scope, docs in by_id.values():
            groups.setdefault(resource, {}).setdefault(scope, []).extend(docs)
        out = [resource_spans_to_dict(resource, by_scope) for resource, by_scope in groups.items()]
    except NotPlainValue:
        return None
    return {"resourceSpans": out}


def resource_spans_to_dict(resource: Any, by_scope: Mapping[Any, list[dict[str, Any]]]) -> dict[str, Any]:
    """OTLP JSON ``ResourceSpans`` for span docs grouped by instrumentation scope."""
    scope_spans = []
    for scope, docs in by_scope.items():
        sdoc: dict[str, Any] = {}
        if scope is not None:
            if scope.name:
                sdoc["name"] = scope.name
            if scope.version:
                sdoc["version"] = scope.version
            if _json_attributes(scope.attributes):
                sdoc["attributes"] = _json_attributes(scope.attributes)
        entry: dict[str, Any] = {"scope": sdoc, "spans": docs}
        if scope is not None and scope.schema_url:
            entry["schemaUrl"] = scope.schema_url
        scope_spans.append(entry)
    rdoc: dict[str, Any] = {}
    if _json_attributes(resource.attributes):
        rdoc["attributes"] = _json_attributes(resource.attributes)
    rs: dict[str, Any] = {"resource": rdoc, "scopeSpans": scope_spans}
    if resource.schema_url:
        rs["schemaUrl"] = resource.schema_url
    return rs
