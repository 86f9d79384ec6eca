"""Per-request table export (``ttft export``): one row per request, client and server joined.

Columns (every time in the unit its name ends with; NaN/empty where a side did not see it):

- ids and context: ``trace_id`` (joins client and server), ``request_id`` (the server's),
  ``segment`` (sweep point or phase), ``warmup``, ``has_client``, ``has_server``, ``engine``,
  ``tp_size``, ``preemptions``, ``error``;
- AIPerf's ``profile_export`` names, with their unit in the name: ``x_request_id``,
  ``request_start_ns`` / ``request_end_ns`` (Unix ns; the client's when it was seen, else the
  server's), ``time_to_first_token_ms``, ``request_latency_ms``, ``inter_token_latency_ms``
  ((latency − TTFT) / (output tokens − 1), as AIPerf defines it), ``input_sequence_length``,
  ``output_sequence_length`` (tokens);
- ours: ``ttft_s``, ``client_ttft_s``, ``server_ttft_s``, ``e2e_s``, every stage's
  ``<stage>_s`` (tokenize, queue, prefill, comm, sample, detokenize, lumped, network, decode),
  ``slot_wait_s``, ``itl_p50_s``, ``itl_p99_s``, ``itl_max_s``, ``tpot_s``.

No prompt text is ever exported (the request table holds none). Pure functions; any thread.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.tables import Tables

#: file suffix -> format name
FORMATS: dict[str, str] = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl"}

_CONTEXT = ("trace_id", "request_id", "segment", "warmup", "has_client", "has_server", "engine", "tp_size",
            "preemptions", "error")
_OURS = ("ttft_s", "client_ttft_s", "server_ttft_s", "e2e_s", *stages.STAGE_COLUMNS, "decode_s", "slot_wait_s",
         "itl_p50_s", "itl_p99_s", "itl_max_s", "tpot_s")


class ExportError(ValueError):
    """An output path the export cannot write (unknown format); one line."""


def export_format(path: str | Path) -> str:
    """The format an output path asks for, from its suffix; ExportError for any other."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ExportError(f"{path}: unknown export format; use one of {', '.join(FORMATS)}")
    return fmt


def _col(req: pd.DataFrame, name: str) -> pd.Series:
    if name in req.columns:
        return req[name]
    return pd.Series(np.nan, index=req.index, dtype="float64")


def request_rows(tables: Tables) -> pd.DataFrame:
    """The export's rows, in start order (see the module docstring for the columns)."""
    req = tables.requests
    out = pd.DataFrame(index=req.index)
    for c in _CONTEXT:
        out[c] = _col(req, c)
    start = pd.to_numeric(_col(req, "client_start_ns"), errors="coerce").fillna(
        pd.to_numeric(_col(req, "server_start_ns"), errors="coerce"))
    e2e_s = pd.to_numeric(_col(req, "e2e_s"), errors="coerce")
    ttft_s = pd.to_numeric(_col(req, "ttft_s"), errors="coerce")
    osl = pd.to_numeric(_col(req, "output_tokens"), errors="coerce")
    out["x_request_id"] = _col(req, "request_id")
    out["request_start_ns"] = start.round().astype("Int64")
    out["request_end_ns"] = (start + e2e_s * 1e9).round().astype("Int64")
    out["time_to_first_token_ms"] = ttft_s * 1e3
    out["request_latency_ms"] = e2e_s * 1e3
    out["inter_token_latency_ms"] = ((e2e_s - ttft_s) / (osl - 1).where(osl > 1)) * 1e3
    out["input_sequence_length"] = pd.to_numeric(_col(req, "input_tokens"), errors="coerce").astype("Int64")
    out["output_sequence_length"] = osl.astype("Int64")
    for c in _OURS:
        out[c] = pd.to_numeric(_col(req, c), errors="coerce")
    out["error"] = out["error"].where(out["error"].notna(), None).astype(object)
    order = np.argsort(start.fillna(np.inf).to_numpy(), kind="stable")
    return out.iloc[order].reset_index(drop=True)


def write_rows(rows: pd.DataFrame, path: str | Path) -> str:
    """Write ``rows`` in the format ``path``'s suffix names (parent directories made); returns it."""
    fmt = export_format(path)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        rows.to_parquet(p, index=False)
    elif fmt == "csv":
        rows.to_csv(p, index=False)
    else:
        rows.to_json(p, orient="records", lines=True)
    return fmt


__all__ = ["ExportError", "FORMATS", "export_format", "request_rows", "write_rows"]
