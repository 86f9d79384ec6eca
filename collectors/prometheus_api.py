"""Engine metrics for a fleet from a Prometheus server's HTTP API (``/api/v1/query_range``):
the same canonical series the /metrics scraper (:mod:`collectors.prometheus`) makes, with PromQL
built from the same engine tables, one entity per replica (``instance``). Synchronous, no thread
of its own; timestamps in Unix seconds, rows with ``diag.ground.stages.SERIES_COLUMNS`` and
``source="prometheus"``.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pandas as pd

from collectors import prometheus_adapters as pa
from collectors.prometheus import one_line, resolve_adapter, rows_to_frame


class PrometheusAPIError(RuntimeError):
    """The Prometheus server refused a query or could not be reached (one-line message)."""


class PrometheusAPIReader:
    """Reads canonical series for a fleet from a Prometheus server's HTTP API.

    Each canonical series of the engine's table becomes one PromQL ``query_range`` (e.g.
    ``sum by (instance) (rate(vllm:request_queue_time_seconds_sum[30s])) / sum by (instance)
    (rate(vllm:request_queue_time_seconds_count[30s]))``); each result's ``instance`` label is
    the entity. Synchronous; call from any one thread.
    """

    def __init__(self, base_url: str, engine: str | None = None, window: str = "30s",
                 by: str = "instance", timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.engine = engine
        self.window = window
        self.by = by
        self.timeout_s = timeout_s
        self.errors: list[str] = []

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = json.loads(exc.read()).get("error", "")
            except Exception:
                pass
            raise PrometheusAPIError(one_line(f"{path}: HTTP {exc.code} {detail or exc.reason}")) from None
        except (urllib.error.URLError, OSError) as exc:
            raise PrometheusAPIError(one_line(f"{self.base_url}: unreachable ({exc})")) from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise PrometheusAPIError(f"{path}: answer is not JSON") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "unknown error") if isinstance(doc, dict) else "bad answer"
            raise PrometheusAPIError(one_line(f"{path}: {err}"))
        return doc.get("data")

    def detect_engine(self) -> str | None:
        """Ask the server which metric names it has (``/api/v1/label/__name__/values``)."""
        names = self._get("/api/v1/label/__name__/values", {}) or []
        return pa.detect_engine(str(n) for n in names)

    def queries(self) -> dict[str, str]:
        """Canonical series → the PromQL this reader sends (needs the engine known)."""
        engine = self.engine or self.detect_engine()
        if engine is None:
            raise PrometheusAPIError(f"{self.base_url}: no known engine metrics on this Prometheus server")
        self.engine = engine
        adapter = resolve_adapter(engine, ())
        assert adapter is not None
        return pa.promql_queries(adapter, self.window, self.by)

    def read(self, start_s: float, end_s: float, step_s: float) -> pd.DataFrame:
        """Canonical rows for [start_s, end_s] every step_s (Unix seconds).

        A series whose query fails is skipped and its one-line error appended to ``errors``;
        an unreachable server raises PrometheusAPIError.
        """
        rows: list[tuple[float, str, str, float]] = []
        for series, query in self.queries().items():
            params = {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"}
            try:
                data = self._get("/api/v1/query_range", params)
            except PrometheusAPIError as exc:
                if "unreachable" in str(exc):
                    raise
                self.errors.append(f"{series}: {exc}")
                continue
            for result in (data or {}).get("result", []) if isinstance(data, dict) else []:
                entity = str((result.get("metric") or {}).get(self.by, ""))
                for point in result.get("values") or ():
                    try:
                        ts, val = float(point[0]), float(point[1])
                    except (TypeError, ValueError, IndexError):
                        continue
                    if math.isfinite(val):
                        rows.append((ts, series, entity, val))
        return rows_to_frame(rows)
