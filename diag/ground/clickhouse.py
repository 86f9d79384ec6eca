"""A ClickHouse connection from a URL: a server over HTTP(S) (``clickhouse-connect``) or an
embedded engine on a local directory (``chdb``, the same SQL and MergeTree tables in-process).

URL forms:

* ``http://host:8123[/db]``, ``https://user:password@host:8443[/db]``: a server; the database
  defaults to ``default``;
* ``chdb:PATH`` (or ``chdb://PATH``): a chdb session directory, made when missing; tests, local
  files, benchmarks. chdb allows one open session per process.

:func:`connect` returns a :class:`Connection`: ``query_df`` (SQL with ``{name:Type}``
parameters, bound by the server, to a DataFrame), ``command`` (DDL) and ``insert_json_rows``
(JSONEachRow). Every failure is a :class:`ClickHouseError` with one line naming the URL.
Not thread-safe: one connection per thread.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import pandas as pd

DEFAULT_DATABASE = "default"
_DB = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ClickHouseError(Exception):
    """A URL, a connection or a query that failed; the message is one line."""


@dataclass(frozen=True)
class Target:
    """Where a URL points: ``kind`` "http" (a server) or "chdb" (a local session directory)."""

    kind: str
    url: str
    database: str = DEFAULT_DATABASE
    host: str = ""
    port: int = 0
    secure: bool = False
    username: str = "default"
    password: str = ""
    path: str = ""

    def redacted(self) -> str:
        """The URL without its password (for messages and captures' meta)."""
        if self.kind == "chdb":
            return f"chdb:{self.path}"
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{self.host}:{self.port}/{self.database}"


def parse_url(url: str) -> Target:
    """A ``--from-clickhouse`` URL as a :class:`Target`; ClickHouseError on anything else."""
    url = (url or "").strip()
    if url.startswith("chdb:"):
        path = url[len("chdb://"):] if url.startswith("chdb://") else url[len("chdb:"):]
        if not path:
            raise ClickHouseError(f"{url!r}: a chdb URL needs a directory (chdb:PATH)")
        return Target("chdb", url, path=str(Path(path).expanduser()))
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClickHouseError(f"{url!r}: not a ClickHouse URL (http://host:8123[/db], https://host:8443[/db] "
                              "or chdb:PATH)")
    db = parts.path.strip("/") or DEFAULT_DATABASE
    if not _DB.fullmatch(db):
        raise ClickHouseError(f"{url!r}: bad database name {db!r}")
    secure = parts.scheme == "https"
    try:
        port = parts.port or (8443 if secure else 8123)
    except ValueError:
        raise ClickHouseError(f"{url!r}: bad port") from None
    return Target("http", url, db, parts.hostname, port, secure, unquote(parts.username or "default"),
                  unquote(parts.password or ""))


class Connection(Protocol):
    """What the trace source and the loader need of a ClickHouse connection."""

    target: Target

    def query_df(self, sql: str, params: Mapping[str, Any] | None = None) -> pd.DataFrame: ...

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None: ...

    def insert_json_rows(self, table: str, lines: Iterable[str]) -> None: ...

    def close(self) -> None: ...


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def _unreachable(exc: BaseException) -> str:
    """Why a server could not be reached, short: the OS's reason when the message holds one."""
    m = re.search(r"\[Errno -?\d+\] ([^\"')\]]+)", str(exc))
    return m.group(1).strip() if m else _one_line(exc)[:160]


class ChdbConnection:
    """An embedded chdb session on a directory (its tables persist there)."""

    def __init__(self, target: Target) -> None:
        try:
            from chdb import session
        except ImportError:
            raise ClickHouseError("chdb is not installed (pip install chdb)") from None
        self.target = target
        try:
            Path(target.path).mkdir(parents=True, exist_ok=True)
            self._s = session.Session(target.path)
        except Exception as exc:  # chdb raises its own RuntimeError subclasses
            raise ClickHouseError(f"{target.redacted()}: cannot open: {_one_line(exc)}") from None

    def _run(self, sql: str, fmt: str, params: Mapping[str, Any] | None = None) -> Any:
        try:
            return self._s.query(sql, fmt, params=dict(params) if params else None)
        except Exception as exc:
            raise ClickHouseError(f"{self.target.redacted()}: {_one_line(exc)}") from None

    def query_df(self, sql: str, params: Mapping[str, Any] | None = None) -> pd.DataFrame:
        out = self._run(sql, "DataFrame", params)
        return out if isinstance(out, pd.DataFrame) else pd.DataFrame()

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self._run(sql, "CSV", params)

    def insert_json_rows(self, table: str, lines: Iterable[str]) -> None:
        body = "\n".join(lines)
        if body:
            self._run(f"INSERT INTO {table} FORMAT JSONEachRow\n{body}", "CSV")

    def close(self) -> None:
        try:
            self._s.close()
        except Exception:  # closing twice, or a session chdb already dropped
            pass


class HttpConnection:
    """A ClickHouse server over its HTTP interface (``clickhouse-connect``)."""

    def __init__(self, target: Target, connect_timeout_s: float = 10.0) -> None:
        try:
            import clickhouse_connect
        except ImportError:
            raise ClickHouseError("clickhouse-connect is not installed (pip install clickhouse-connect)") from None
        self.target = target
        # the driver logs its failures as well as raising them: ours are one line, from the exception
        logging.getLogger("clickhouse_connect").addHandler(logging.NullHandler())
        logging.getLogger("clickhouse_connect").propagate = False
        try:
            self._c = clickhouse_connect.get_client(host=target.host, port=target.port, username=target.username,
                                                    password=target.password, database=target.database,
                                                    secure=target.secure, connect_timeout=connect_timeout_s)
        except Exception as exc:
            raise ClickHouseError(f"{target.redacted()}: unreachable ({_unreachable(exc)})") from None

    def query_df(self, sql: str, params: Mapping[str, Any] | None = None) -> pd.DataFrame:
        try:
            return self._c.query_df(sql, parameters=dict(params) if params else None)
        except Exception as exc:
            raise ClickHouseError(f"{self.target.redacted()}: {_one_line(exc)}") from None

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        try:
            self._c.command(sql, parameters=dict(params) if params else None)
        except Exception as exc:
            raise ClickHouseError(f"{self.target.redacted()}: {_one_line(exc)}") from None

    def insert_json_rows(self, table: str, lines: Iterable[str]) -> None:
        body = "\n".join(lines).encode()
        if not body:
            return
        try:
            self._c.raw_insert(table, insert_block=body, fmt="JSONEachRow")
        except Exception as exc:
            raise ClickHouseError(f"{self.target.redacted()}: insert into {table}: {_one_line(exc)}") from None

    def close(self) -> None:
        try:
            self._c.close()
        except Exception:
            pass


def connect(url: str) -> Connection:
    """Open a connection for a ``--from-clickhouse`` / ``--to-clickhouse`` URL."""
    target = parse_url(url)
    return ChdbConnection(target) if target.kind == "chdb" else HttpConnection(target)


def table_exists(conn: Connection, table: str) -> bool:
    """Whether ``table`` is in the connection's database."""
    df = conn.query_df("SELECT count() AS n FROM system.tables WHERE database = {db:String} AND name = {t:String}",
                       {"db": conn.target.database, "t": table})
    return bool(len(df)) and int(df["n"].iloc[0]) > 0


__all__ = ["ChdbConnection", "ClickHouseError", "Connection", "HttpConnection", "Target", "connect", "parse_url",
           "table_exists"]
