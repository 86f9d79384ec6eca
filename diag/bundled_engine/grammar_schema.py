"""A ``response_format`` as a grammar source: the JSON schema checked against the supported subset and
turned into a small tree of nodes, with its cache key.

:func:`grammar_source` is what the server calls (on its event loop); it raises :class:`GrammarError`
(one line, never the schema's text) for anything outside the subset or past the limits below.
Pure functions; the compile of a source is in :mod:`diag.bundled_engine.grammar`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from diag.bundled_engine.automaton import PatternError, parse_pattern

#: nesting of a generic JSON value (json_object, an object without properties, items without a schema)
GENERIC_DEPTH = 3
#: schema limits checked before compiling (400 on the request)
MAX_SCHEMA_DEPTH = 12
MAX_PROPERTIES = 1024
MAX_ENUM = 4096
MAX_STRING_LENGTH = 512
MAX_ITEMS = 128
#: states x tokens per gather while computing masks (bounds the compile's memory: int32 each)
_MASK_BLOCK = 1 << 21

_ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "default", "examples",
                          "deprecated", "readOnly", "writeOnly"})
_KEYWORDS: dict[str, frozenset[str]] = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "string": frozenset({"pattern", "minLength", "maxLength"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "boolean": frozenset(),
    "null": frozenset(),
    "array": frozenset({"items", "minItems", "maxItems"}),
}


class GrammarError(ValueError):
    """A response_format or schema this engine cannot turn into a grammar; one line, never the
    schema's text."""


# --- the schema as nodes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Literals:
    """One of these JSON texts (``enum``, ``const``, ``boolean``, ``null``)."""

    texts: tuple[bytes, ...]


@dataclass(frozen=True)
class Str:
    """A JSON string: ``atoms`` (a parsed pattern) or any text of ``min_len..max_len`` characters."""

    atoms: tuple[tuple[int, int, int | None], ...] | None = None
    min_len: int = 0
    max_len: int | None = None


@dataclass(frozen=True)
class Int:
    lo: int | None = None
    hi: int | None = None


@dataclass(frozen=True)
class Num:
    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True)
class Arr:
    items: "Node"
    min_items: int = 0
    max_items: int | None = None


@dataclass(frozen=True)
class Obj:
    """An object with these properties in this order (name, node, required)."""

    props: tuple[tuple[str, "Node", bool], ...]


@dataclass(frozen=True)
class AnyJson:
    """Any JSON value (``object_only``: any object) nested at most ``depth`` levels."""

    depth: int
    object_only: bool = False


Node = Literals | Str | Int | Num | Arr | Obj | AnyJson


@dataclass(frozen=True)
class GrammarSource:
    """What a request asks its output to follow: ``kind`` (``json_object`` or ``json_schema``),
    the node tree and ``key``, the grammar cache's key (16 hex digits)."""

    kind: str
    key: str
    root: Node


def schema_key(schema: Any) -> str:
    """The cache key of a JSON schema: the first 16 hex digits of the SHA-256 of its canonical
    JSON (``sort_keys=True, separators=(",", ":"), ensure_ascii=False``, UTF-8), as the probe's
    ``collectors.probe.schemas.schema_key`` computes it. Schemas that differ only in key order
    share a grammar: its properties come in the first one's order, an answer valid for both."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


#: the one key every ``{"type": "json_object"}`` request shares
JSON_OBJECT_KEY = schema_key({"response_format": "json_object"})


def grammar_source(response_format: Any) -> GrammarSource | None:
    """The grammar a ``response_format`` asks for (None for ``text`` or absent); GrammarError
    (one line, naming the field) for a malformed one or a schema outside the supported subset."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise GrammarError("'response_format' must be an object")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSource("json_object", JSON_OBJECT_KEY, AnyJson(GENERIC_DEPTH, object_only=True))
    if kind != "json_schema":
        raise GrammarError(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', "
                           f"got {json.dumps(kind)[:40]}")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise GrammarError("'response_format.json_schema' must be an object with a 'schema'")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise GrammarError("'response_format.json_schema.name' must be a string")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise GrammarError("'response_format.json_schema.schema' must be a JSON schema object")
    return GrammarSource("json_schema", schema_key(schema), schema_node(schema))


def schema_node(schema: Any, path: str = "schema", depth: int = 0) -> Node:
    """The node tree of a JSON schema; GrammarError naming the keyword and where it is."""
    if not isinstance(schema, dict):
        raise GrammarError(f"response_format: {path} must be a schema object")
    if depth > MAX_SCHEMA_DEPTH:
        raise GrammarError(f"response_format: schemas nest at most {MAX_SCHEMA_DEPTH} levels")
    keys = set(schema) - _ANNOTATIONS
    kind = schema.get("type")
    if "const" in schema or "enum" in schema:
        extra = keys - {"type", "enum", "const"} - _KEYWORDS.get(kind if isinstance(kind, str) else "", frozenset())
        if extra:
            raise GrammarError(f"response_format: unsupported keyword {sorted(extra)[0]!r} in {path}")
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values or len(values) > MAX_ENUM:
            raise GrammarError(f"response_format: {path}.enum must be a list of 1..{MAX_ENUM} values")
        texts = sorted({json.dumps(v, ensure_ascii=False, separators=(", ", ": ")).encode("utf-8") for v in values})
        return Literals(tuple(texts))
    if not isinstance(kind, str) or kind not in _KEYWORDS:
        raise GrammarError(f"response_format: {path}.type must be one of {', '.join(_KEYWORDS)} "
                           "(or give 'enum'/'const'); type lists are not supported")
    extra = keys - {"type"} - _KEYWORDS[kind]
    if extra:
        raise GrammarError(f"response_format: unsupported keyword {sorted(extra)[0]!r} in {path} ({kind})")
    if kind == "boolean":
        return Literals((b"false", b"true"))
    if kind == "null":
        return Literals((b"null",))
    if kind == "string":
        lo = _count(schema, "minLength", path, 0, MAX_STRING_LENGTH) or 0
        hi = _count(schema, "maxLength", path, 0, MAX_STRING_LENGTH)
        if hi is not None and hi < lo:
            raise GrammarError(f"response_format: {path}: maxLength < minLength")
        pattern = schema.get("pattern")
        if pattern is None:
            return Str(None, lo, hi)
        if not isinstance(pattern, str):
            raise GrammarError(f"response_format: {path}.pattern must be a string")
        if "minLength" in schema or "maxLength" in schema:
            raise GrammarError(f"response_format: {path}: pattern with minLength/maxLength is not supported")
        try:
            return Str(tuple(parse_pattern(pattern)))
        except PatternError as exc:
            raise GrammarError(f"response_format: {path}.{exc}") from None
    if kind in ("integer", "number"):
        return _numeric(schema, kind, path)
    if kind == "array":
        items = schema.get("items")
        node = AnyJson(GENERIC_DEPTH - 1) if items is None else schema_node(items, f"{path}.items", depth + 1)
        lo = _count(schema, "minItems", path, 0, MAX_ITEMS) or 0
        hi = _count(schema, "maxItems", path, 0, MAX_ITEMS)
        if hi is not None and hi < lo:
            raise GrammarError(f"response_format: {path}: maxItems < minItems")
        return Arr(node, lo, hi)
    props = schema.get("properties")
    if props is None:
        return AnyJson(GENERIC_DEPTH, object_only=True)
    if not isinstance(props, dict) or len(props) > MAX_PROPERTIES:
        raise GrammarError(f"response_format: {path}.properties must be an object of at most {MAX_PROPERTIES}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise GrammarError(f"response_format: {path}.required must be a list of property names")
    missing = [r for r in required if r not in props]
    if missing:
        raise GrammarError(f"response_format: {path}.required names a property not in properties")
    add = schema.get("additionalProperties", False)
    if not isinstance(add, (bool, dict)):
        raise GrammarError(f"response_format: {path}.additionalProperties must be a boolean or a schema")
    out = []
    for name, sub in props.items():
        out.append((name, schema_node(sub, f"{path}.properties.{_segment(name)}", depth + 1), name in required))
    return Obj(tuple(out))


def _segment(name: str) -> str:
    """A property name as one short piece of an error's path (one line, at most 40 characters)."""
    text = " ".join(name.split())
    return text if len(text) <= 40 else text[:37] + "..."


def _count(schema: dict[str, Any], key: str, path: str, lo: int, hi: int) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise GrammarError(f"response_format: {path}.{key} must be an integer in [{lo}, {hi}]")
    return v


def _numeric(schema: dict[str, Any], kind: str, path: str) -> Node:
    """Bounds as inclusive ones: an exclusive bound ``x`` becomes the nearest whole number past it
    (an integer's exact bound; for a number it leaves out the values between, never lets one out)."""
    lo: float | None = None
    hi: float | None = None
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        v = schema.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise GrammarError(f"response_format: {path}.{key} must be a finite number")
        if key == "minimum":
            b: float = math.ceil(v) if kind == "integer" else v
            lo = b if lo is None else max(lo, b)
        elif key == "exclusiveMinimum":
            b = math.floor(v) + 1
            lo = b if lo is None else max(lo, b)
        elif key == "maximum":
            b = math.floor(v) if kind == "integer" else v
            hi = b if hi is None else min(hi, b)
        else:
            b = math.ceil(v) - 1
            hi = b if hi is None else min(hi, b)
    if lo is not None and hi is not None and math.ceil(lo) > math.floor(hi):
        raise GrammarError(f"response_format: {path}: bounds that hold no whole number are not supported")
    if kind == "integer":
        return Int(None if lo is None else int(lo), None if hi is None else int(hi))
    return Num(lo, hi)
