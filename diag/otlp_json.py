"""OTLP JSON <-> ``opentelemetry.proto`` messages, by the OTLP/JSON rules.

OTLP JSON is protobuf's JSON mapping with three differences that a plain
``google.protobuf.json_format`` round trip gets wrong: trace and span ids are lowercase hex
(not base64), enums are integers, and keys are lowerCamelCase. 64-bit integers are strings.
This module is the only place that converts; everything else handles dicts or messages.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

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
