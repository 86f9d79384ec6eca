"""OpenTelemetry's environment conventions, as ``serve``, ``probe`` and ``instrument`` honour them.

- ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the traces URL, used as given) or else
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL: ``/v1/traces`` is appended) name where spans go
  when no ``--otlp URL`` is given (:func:`endpoint_from_env`);
- ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k=v``, percent-encoded values)
  set the spans' resource; our own service name (``ttft-engine``, ``ttft-probe``) is the
  default only when neither names one (:func:`resource_for`).

Only OTLP over HTTP/protobuf is spoken: ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` set to
anything else is refused in one line (:func:`check_protocol`). Pure functions; any thread.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping

from opentelemetry.sdk.resources import Resource

TRACES_PATH = "/v1/traces"


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for ``endpoint``: a URL without a path gets ``/v1/traces``
    (``--otlp http://127.0.0.1:4318``); one with a path is used as given."""
    url = endpoint.strip()
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/"):
        return url.rstrip("/") + TRACES_PATH
    return url


def endpoint_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The traces URL the OTEL_EXPORTER_OTLP_* variables name, or None when neither is set."""
    env = os.environ if env is None else env
    traces = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
    if traces:
        return traces
    base = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    if base:
        return base.rstrip("/") + TRACES_PATH
    return None


def check_protocol(env: Mapping[str, str] | None = None) -> None:
    """ValueError (one line) when the environment asks for an OTLP protocol other than http/protobuf."""
    env = os.environ if env is None else env
    for key in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = (env.get(key) or "").strip()
        if value:
            if value != "http/protobuf":
                raise ValueError(f"{key}={value}: only http/protobuf is supported (OTLP over HTTP, port 4318)")
            return


def _env_attributes(env: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (env.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[key.strip()] = urllib.parse.unquote(value.strip())
    return out


def resource_for(service_name: str, env: Mapping[str, str] | None = None) -> Resource:
    """The spans' resource: the environment's attributes and service name, ours by default."""
    env = os.environ if env is None else env
    attrs: dict[str, str] = _env_attributes(env)
    named = (env.get("OTEL_SERVICE_NAME") or "").strip()
    if named:
        attrs["service.name"] = named
    attrs.setdefault("service.name", service_name)
    return Resource.create(attrs)


__all__ = ["TRACES_PATH", "check_protocol", "endpoint_from_env", "resource_for", "traces_url"]
