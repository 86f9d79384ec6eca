"""Engine metrics into canonical time series: a /metrics scraper and the parsing and mapping it
shares with the Prometheus-API reader (:mod:`collectors.prometheus_api`).

* :class:`PrometheusScraper` polls one /metrics URL every ``interval_s`` on a background
  thread, parses the text with ``prometheus_client.parser`` and maps it with the engine's
  table (:mod:`collectors.prometheus_adapters`): counters → per-second rates between scrapes,
  histograms → windowed mean and p50/p95/p99 from bucket deltas, gauges as they are. A dead
  endpoint or a malformed text is counted and kept as a one-line ``last_error``; it never
  raises out of the thread.
* Which URL: :func:`metrics_url` appends ``/metrics`` to a server's base URL. trtllm-serve
  answers ``/metrics`` with JSON iteration stats and serves the Prometheus text at
  ``/prometheus/metrics`` (``tensorrt_llm/serve/openai_server.py`` @e7f7345e); a scraper whose
  ``/metrics`` answers JSON switches to that sibling once and says so (``stats()["url_note"]``).
* :func:`adapt_texts` maps saved /metrics texts the same way, without a thread.

Both produce long-format rows with ``diag.ground.stages.SERIES_COLUMNS`` and ``source="prometheus"``.
"""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from collectors import prometheus_adapters as pa
from diag.ground import stages

SOURCE = "prometheus"
#: /metrics bodies above this are refused (a runaway exposition must not eat the memory).
MAX_BODY_BYTES = 32 * 1024 * 1024


class ExpositionError(ValueError):
    """A /metrics text prometheus_client cannot parse; the message is one line."""


class ScrapeError(RuntimeError):
    """A scrape that did not produce a snapshot (connection, HTTP status, size)."""


#: where trtllm-serve serves Prometheus text (its /metrics is JSON)
TRTLLM_PROMETHEUS_PATH = "/prometheus/metrics"


def metrics_url(url: str) -> str:
    """The /metrics URL for ``url``: unchanged when its path already names a metrics endpoint
    (``/metrics``, ``/prometheus/metrics``), else the base URL + ``/metrics``."""
    path = urllib.parse.urlsplit(url).path
    if path.rstrip("/").endswith("metrics"):
        return url
    return url.rstrip("/") + "/metrics"


#: ``--metrics ROLE=URL``: the roles of a disaggregated prefill/decode pair, each its own endpoint,
#: and the entity its series are labelled with (what ``rules.features.pd`` reads as each instance's own)
METRICS_ROLES = {"prefill": stages.ENTITY_ROLE_PREFILL, "decode": stages.ENTITY_ROLE_DECODE}
_ROLE_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*)=(.*)$")


@dataclass(frozen=True)
class MetricsTarget:
    """One /metrics endpoint to scrape: ``url`` as given (``/metrics`` is appended later when its path
    names none) and ``role`` (``""`` for a single endpoint, else a key of :data:`METRICS_ROLES`)."""

    url: str
    role: str = ""

    @property
    def entity(self) -> str:
        """The entity prefix of its rows (``role=prefill``; ``""`` without a role)."""
        return METRICS_ROLES[self.role] if self.role else ""

    @property
    def source(self) -> str:
        """The capture's series file it goes to: ``prometheus``, or ``prometheus-<role>``."""
        return f"{SOURCE}-{self.role}" if self.role else SOURCE


def metrics_targets(values: str | Sequence[str] | None, option: str = "--metrics") -> list[MetricsTarget]:
    """The endpoints of ``--metrics`` (given once, or repeated): one ``URL``, or ``prefill=URL`` and
    ``decode=URL`` (a disaggregated pair, each instance its own /metrics). Raises ValueError with one
    line for an unknown role, a role given twice, a pair missing a side, or a bare URL beside roles."""
    given = [values] if isinstance(values, str) else list(values or ())
    known = ", ".join(METRICS_ROLES)
    out: list[MetricsTarget] = []
    for v in given:
        m = _ROLE_RE.match(v.strip())
        if m is None:
            if not v.strip():
                raise ValueError(f"{option}: empty URL")
            out.append(MetricsTarget(v.strip()))
            continue
        role, url = m.group(1).lower(), m.group(2).strip()
        if role not in METRICS_ROLES:
            raise ValueError(f"{option} {v}: unknown role {m.group(1)!r} (known: {known}); give URL, or "
                             "prefill=URL and decode=URL for a disaggregated pair")
        if not url:
            raise ValueError(f"{option} {v}: no URL after {role}=")
        out.append(MetricsTarget(url, role))
    roles = [t.role for t in out if t.role]
    if len(roles) != len(set(roles)):
        twice = ", ".join(sorted(r for r in set(roles) if roles.count(r) > 1))
        raise ValueError(f"{option}: a role given twice ({twice})")
    if roles and len(roles) != len(out):
        raise ValueError(f"{option}: a bare URL beside ROLE=URL; give one URL, or prefill=URL and decode=URL")
    if not roles and len(out) > 1:
        raise ValueError(f"{option}: {len(out)} URLs without roles; give one URL, or prefill=URL and decode=URL "
                         "(each instance of a disaggregated pair its own /metrics)")
    missing = [r for r in METRICS_ROLES if roles and r not in roles]
    if missing:
        raise ValueError(f"{option}: {', '.join(f'{r}=URL' for r in missing)} missing: a disaggregated pair is read "
                         "from both instances' /metrics")
    return out


def _looks_like_json(text: str) -> bool:
    head = text.lstrip()[:1]
    return head in ("{", "[")


def _prometheus_sibling(url: str) -> str | None:
    """``http://h:p/metrics`` -> ``http://h:p/prometheus/metrics``; None when not a plain /metrics URL."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics") or path.endswith(TRTLLM_PROMETHEUS_PATH):
        return None
    new_path = path[: -len("/metrics")] + TRTLLM_PROMETHEUS_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, new_path, parts.query, parts.fragment))


def one_line(text: str, limit: int = 160) -> str:
    """``text`` on one line (whitespace runs as one space), cut to ``limit`` characters with an ellipsis."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def parse_exposition(text: str, ts_s: float | None = None) -> pa.Snapshot:
    """Parse Prometheus text exposition into a Snapshot at ``ts_s`` (default: now).

    Raises ExpositionError naming the first offending line.
    """
    ts = time.time() if ts_s is None else ts_s
    if _looks_like_json(text):
        raise ExpositionError("the /metrics answer is JSON, not Prometheus text (trtllm-serve's /metrics serves "
                              f"JSON iteration stats; its Prometheus text is at {TRTLLM_PROMETHEUS_PATH})")
    try:
        return pa.snapshot_from_families(text_string_to_metric_families(text), ts)
    except Exception as exc:  # the parser raises ValueError, IndexError, TypeError, ...
        lineno, bad = _find_bad_line(text)
        where = f"line {lineno}: {one_line(bad, 80)!r}: " if lineno else ""
        raise ExpositionError(f"malformed exposition text: {where}{one_line(str(exc), 100)}") from exc


def _find_bad_line(text: str) -> tuple[int, str]:
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            for _ in text_string_to_metric_families(line + "\n"):
                pass
        except Exception:
            return i, line
    return 0, ""


def rows_to_frame(rows: Iterable[tuple[float, str, str, float]]) -> pd.DataFrame:
    """(ts_s, series, entity, value) tuples → a SERIES_COLUMNS frame with source="prometheus"."""
    data = list(rows)
    df = pd.DataFrame(data, columns=["ts_s", "series", "entity", "value"])
    df.insert(1, "source", SOURCE)
    df["ts_s"] = df["ts_s"].astype("float64")
    df["value"] = df["value"].astype("float64")
    return df.loc[:, list(stages.SERIES_COLUMNS)]


def resolve_adapter(engine: str | None, names: Iterable[str]) -> pa.EngineAdapter | None:
    """The adapter for ``engine`` or, when None, the one detected from the metric names."""
    if engine:
        try:
            return pa.ADAPTERS_BY_ENGINE[engine]
        except KeyError:
            known = ", ".join(sorted(pa.ADAPTERS_BY_ENGINE))
            raise ValueError(f"unknown engine {engine!r} (known: {known})") from None
    found = pa.detect_engine(names)
    return pa.ADAPTERS_BY_ENGINE[found] if found else None


def adapt_texts(texts: Sequence[tuple[float, str]], engine: str | None = None, entity: str = "") -> pd.DataFrame:
    """Offline: a series of (ts_s, exposition text) scrapes → canonical long-format rows."""
    rows: list[tuple[float, str, str, float]] = []
    prev: pa.Snapshot | None = None
    adapter: pa.EngineAdapter | None = None
    for ts, text in texts:
        snap = parse_exposition(text, ts)
        if adapter is None:
            adapter = resolve_adapter(engine, snap.names())
            if adapter is None:  # no engine names yet (labelled families with no children): still a baseline
                prev = snap
                continue
        rows.extend((ts, r.series, r.entity, r.value) for r in pa.adapt(adapter, prev, snap, entity))
        prev = snap
    return rows_to_frame(rows)


# --- the /metrics scraper ---------------------------------------------------------------------


class PrometheusScraper:
    """Polls one /metrics URL into canonical rows (Unix-second timestamps).

    A :class:`collectors.base.SeriesCollector`. Threading: :meth:`start` runs
    :meth:`scrape_once` every ``interval_s`` on a daemon thread; :meth:`collect` and
    :meth:`stats` may be called from any thread.
    Errors (connection refused, timeouts, HTTP errors, malformed text) are counted in
    ``errors`` and kept as a one-line ``last_error``; the previous good scrape is kept, so the
    next good one's deltas span the gap. ``on_rows`` (optional) is called on the scraper
    thread with each scrape's new rows; it must not block. ``on_text`` (optional) makes the
    thread only fetch: it gets each (Unix s, text) unparsed, and whoever holds the texts parses
    them with :meth:`ingest`, in the order taken.
    """

    def __init__(
        self,
        url: str,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        engine: str | None = None,
        entity: str = "",
        max_rows: int = 2_000_000,
        on_rows: Callable[[list[tuple[float, str, str, float]]], None] | None = None,
        fetch: Callable[[str, float], str] | None = None,
        on_text: Callable[[float, str], None] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.url = url
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.engine_hint = engine
        self.entity = entity
        self.max_rows = max_rows
        self.on_rows = on_rows
        self.on_text = on_text
        self._fetch = fetch or _http_get_text
        self.adapter: pa.EngineAdapter | None = resolve_adapter(engine, ()) if engine else None
        self._prev: pa.Snapshot | None = None
        self._rows: list[tuple[float, str, str, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.scrapes = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.dropped_rows = 0
        self.last_error = ""
        self.last_ok_ts_s = math.nan
        self.url_note = ""

    @property
    def engine(self) -> str | None:
        return self.adapter.engine if self.adapter else None

    def scrape_once(self, now_s: float | None = None) -> list[tuple[float, str, str, float]]:
        """Fetch, parse and adapt one scrape; returns its rows ([] on error, counted)."""
        got = self.fetch_text(now_s)
        return [] if got is None else self.ingest(*got)

    def fetch_text(self, now_s: float | None = None) -> tuple[float, str] | None:
        """Fetch one exposition text, not parsed: (Unix s it was taken at, text), or None on an
        error (counted). The parse is :meth:`ingest`'s, on whichever thread calls it."""
        ts = time.time() if now_s is None else now_s
        self.scrapes += 1
        try:
            text = self._fetch(self.url, self.timeout_s)
            if _looks_like_json(text):
                text = self._switch_from_json()
            return ts, text
        except (ScrapeError, ValueError) as exc:
            self._error(str(exc))
        except Exception as exc:  # never let the thread die
            self._error(f"{type(exc).__name__}: {exc}")
        return None

    def ingest(self, ts_s: float, text: str) -> list[tuple[float, str, str, float]]:
        """:meth:`ingest_text`, with a malformed text counted as an error instead of raised."""
        try:
            return self.ingest_text(text, ts_s)
        except (ExpositionError, ValueError) as exc:
            self._error(str(exc))
        except Exception as exc:
            self._error(f"{type(exc).__name__}: {exc}")
        return []

    def _switch_from_json(self) -> str:
        """``/metrics`` answered JSON (trtllm-serve's iteration stats): fetch ``/prometheus/metrics``
        instead and keep that URL. Raises ScrapeError with a one-line reason when it cannot."""
        sibling = _prometheus_sibling(self.url)
        if sibling is None:
            raise ScrapeError(f"{self.url}: answered JSON, not Prometheus text")
        try:
            text = self._fetch(sibling, self.timeout_s)
        except ScrapeError as exc:
            why = str(exc).replace(sibling + ": ", "")
            raise ScrapeError(f"{self.url} answered JSON; trtllm-serve serves Prometheus text at "
                              f"{TRTLLM_PROMETHEUS_PATH} only with return_perf_metrics: true ({why})") from None
        if _looks_like_json(text):
            raise ScrapeError(f"{self.url} and {sibling}: both answered JSON, not Prometheus text")
        self.url_note = f"{self.url} answered JSON (trtllm-serve's iteration stats): scraping {sibling}"
        self.url = sibling
        return text

    def ingest_text(self, text: str, ts_s: float) -> list[tuple[float, str, str, float]]:
        """Adapt one exposition text taken at ``ts_s`` (raises ExpositionError, ValueError)."""
        snap = parse_exposition(text, ts_s)
        if self.adapter is None:
            self.adapter = resolve_adapter(None, snap.names())
            if self.adapter is None:
                self._prev = snap  # the next scrape's deltas start here
                raise ValueError(f"{self.url}: no known engine metrics (vLLM, SGLang, TGI, "
                                 "llama.cpp, TensorRT-LLM/Triton, Dynamo, ttft_engine) in the exposition")
        rows = [(ts_s, r.series, r.entity, r.value) for r in pa.adapt(self.adapter, self._prev, snap, self.entity)]
        self._prev = snap
        self.consecutive_errors = 0
        self.last_ok_ts_s = ts_s
        with self._lock:
            room = self.max_rows - len(self._rows)
            if room < len(rows):
                self.dropped_rows += len(rows) - max(room, 0)
            self._rows.extend(rows[: max(room, 0)])
        if self.on_rows and rows:
            try:
                self.on_rows(rows)
            except Exception as exc:  # a consumer's bug is reported, not fatal
                self._error(f"on_rows callback failed: {type(exc).__name__}: {exc}")
        return rows

    def _error(self, message: str) -> None:
        self.errors += 1
        self.consecutive_errors += 1
        self.last_error = one_line(message, 200)

    def start(self) -> None:
        """Start polling on a daemon thread (first scrape immediately)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"ttft-scrape {self.url}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            if self.on_text is None:
                self.scrape_once()
            else:
                got = self.fetch_text()
                if got is not None:
                    self.on_text(*got)
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (slow endpoint): skip the missed ticks
                next_t = time.monotonic()
                delay = 0
            if self._stop.wait(delay):
                break

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop polling and join the thread (waits at most ``timeout_s``, default a scrape)."""
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(self.timeout_s + 1.0 if timeout_s is None else timeout_s)
        self._thread = None

    def collect(self) -> pd.DataFrame:
        """All rows so far as a SERIES_COLUMNS frame (source="prometheus"; any thread)."""
        with self._lock:
            rows = list(self._rows)
        return rows_to_frame(rows)

    def stats(self) -> dict[str, Any]:
        """Counters for reports: scrapes, errors, last_error, engine, dropped_rows."""
        return {
            "url": self.url,
            "engine": self.engine,
            "scrapes": self.scrapes,
            "errors": self.errors,
            "consecutive_errors": self.consecutive_errors,
            "last_error": self.last_error,
            "dropped_rows": self.dropped_rows,
            "url_note": self.url_note,
        }


def _http_get_text(url: str, timeout_s: float) -> str:
    """GET a /metrics text; raises ScrapeError with a one-line reason."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "ttft-diag"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read(MAX_BODY_BYTES + 1)
            charset = resp.headers.get_content_charset() or "utf-8"
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise ScrapeError(f"{url}: unreachable ({exc.reason})") from None
    except (TimeoutError, OSError) as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {exc}") from None
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError(f"{url}: /metrics body over {MAX_BODY_BYTES} bytes; refused")
    return body.decode(charset, errors="replace")
