"""What the external engines' spans have in common: the request-row columns, the notes by engine
and TGI's Rust ``Debug`` duration strings parsed.

Each engine's own names, with the file and commit each was read from, are in its module of
:mod:`diag.ground.external` (the table is ``docs/engines.md``). Pure; safe from any thread.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd

from diag.ground.external import sglang, tgi, vllm

#: engine -> which of our stages its spans cannot separate (shown next to its verdicts)
NOTES: dict[str, str] = {vllm.NAME: vllm.NOTE, tgi.NAME: tgi.NOTE, sglang.NAME: sglang.NOTE}
#: engine -> what the client-server gap holds besides the network (engines whose server TTFT
#: starts after the front end has tokenized)
GAP_INCLUDES_FRONTEND: dict[str, str] = {vllm.NAME: vllm.GAP_NOTE}
#: Columns of the request rows :func:`adapt_spans_frame` returns (all durations seconds).
REQUEST_COLUMNS: tuple[str, ...] = (
    "trace_id", "engine", "start_ns", "server_ttft_s", "e2e_s", "input_tokens", "output_tokens",
    "queue_s", "prefill_s", "tokenize_s", "decode_s", "lumped_s", "lumped_note",
)
#: Extra columns after REQUEST_COLUMNS: the engine span's id, the model and the inference time
#: (prefill + decode) where the engine reports it.
EXTRA_COLUMNS: tuple[str, ...] = ("span_id", "model", "inference_s", "cached_tokens")


# --- Rust Debug durations ----------------------------------------------------------------------

UNIT_S: dict[str, float] = {"ns": 1e-9, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s)\s*$")
DURATION_PAT = r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s)\s*$"


def parse_rust_duration_s(value: Any) -> float | None:
    """A Rust ``Debug`` duration ("12.3ms", "1.2s", "850µs", "3.1µs", "12ns") in seconds.

    Numbers are taken as seconds already. Anything else (None, "", "12 parsecs", negative)
    gives None.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
        return v if math.isfinite(v) and v >= 0 else None
    if not isinstance(value, str):
        return None
    m = DURATION_RE.match(value)
    if not m:
        return None
    return float(m.group(1)) * UNIT_S[m.group(2)]


def parse_duration_series(values: pd.Series) -> np.ndarray:
    """Vectorised :func:`parse_rust_duration_s` over an object Series (NaN where invalid)."""
    num = pd.to_numeric(values.where(values.map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))),
                        errors="coerce").to_numpy(dtype="float64")
    text = values.where(values.map(lambda v: isinstance(v, str))).astype("string")
    parts = text.str.extract(DURATION_PAT)
    mag = pd.to_numeric(parts[0], errors="coerce").to_numpy(dtype="float64")
    unit = parts[1].map(UNIT_S).to_numpy(dtype="float64", na_value=np.nan)
    out = np.where(np.isfinite(num), num, mag * unit)
    out[out < 0] = np.nan
    return out
