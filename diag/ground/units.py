"""The closed set of units, the one value formatter and the one JSON sanitiser.

Ground floor: imports only the standard library and numpy. Every renderer (``ttft analyze``
text, the Markdown/HTML/JSON reports, the TUI) formats a number with :func:`fmt_value`, so the
same evidence row reads the same everywhere. Pure functions, safe on any thread.

Style of the text, one per unit:

=============  ======================================================
``s``          850 µs, 12.3 ms, 1.52 s, 12.5 s, 2m30s, 1h05m
``share``      a fraction 0..1 shown in percent: 5.0% (one decimal below 10%), 42%
``%``          a number already in percent, same style: 5.0%, 42%
``x``          2.00x
counts         13 requests, 512 tokens, 3 steps, 4 (``count``); whole numbers print whole,
               others keep 3 significant digits (13.5 requests)
``tokens/s``   850 tokens/s, 1.2k tokens/s, 3.4M tokens/s
``s/s``        0.93 s/s
``bytes``      512 B, 1.5 KiB, 1.5 GiB
rates          :func:`fmt_rate`: 12.5 requests/s, 3.4k steps/s, 1.5 GiB/s
``""``         0.123 (3 significant digits)
=============  ======================================================

Missing values (None, NaN) print as ``-``; infinities as ``inf``/``-inf``; strings as they are.
"""

from __future__ import annotations

import math
import re
import string
from enum import Enum
from typing import Any

import numpy as np

__all__ = ["Unit", "MISSING", "unit_of", "is_num", "fmt_value", "fmt_s", "fmt_threshold",
           "fmt_rate", "op_text", "crossed_mark", "fill", "json_safe", "parse_duration_s"]

#: What a missing value prints as.
MISSING = "-"


class Unit(str, Enum):
    """The closed set of units a feature or an evidence row may state (each member says what it counts)."""

    S = "s"                    #: seconds (durations)
    SHARE = "share"            #: a fraction 0..1 of a whole
    PCT = "%"                  #: a number already in percent 0..100
    X = "x"                    #: a ratio of two like quantities (a multiplier)
    REQUESTS = "requests"      #: a count of requests (or requests in flight)
    TOKENS = "tokens"          #: a count of tokens
    STEPS = "steps"            #: a count of engine steps
    TOKENS_PER_S = "tokens/s"  #: a token rate
    S_PER_S = "s/s"            #: busy seconds per second of wall time
    BYTES = "bytes"            #: bytes
    COUNT = "count"            #: a plain count of other things (levels, replicas, GPUs)
    NONE = ""                  #: a dimensionless number (slopes, coefficients)

    def __str__(self) -> str:  # f"{Unit.S}" reads "s", not "Unit.S"
        return self.value


#: Old free-string units and the closed unit each maps to ("ms" also scales the value).
_LEGACY: dict[str, Unit] = {
    "seconds": Unit.S, "ms": Unit.S,
    "fraction": Unit.SHARE, "ratio of TTFT": Unit.SHARE, "ratio of decode time": Unit.SHARE,
    "ratio of samples": Unit.SHARE, "pct": Unit.PCT, "percent": Unit.PCT, "×": Unit.X,
    "tokens/s per stream": Unit.TOKENS_PER_S, "levels": Unit.COUNT, "B": Unit.BYTES,
    "decode steps": Unit.STEPS,
}
_BY_VALUE: dict[str, Unit] = {u.value: u for u in Unit}
_COUNTS = {Unit.REQUESTS: ("request", "requests"), Unit.TOKENS: ("token", "tokens"),
           Unit.STEPS: ("step", "steps")}


def unit_of(unit: Unit | str | None) -> Unit | None:
    """The closed unit for ``unit`` (a member, its value, or a legacy alias); None if unknown.

    ``"ratio"`` is deliberately unknown: it meant a share or a multiplier depending on the feature.
    """
    if isinstance(unit, Unit):
        return unit
    u = (unit or "").strip()
    return _BY_VALUE.get(u) or _LEGACY.get(u)


def is_num(v: object) -> bool:
    """A finite real number (int, float or numpy scalar), not a bool."""
    if isinstance(v, (bool, np.bool_)):
        return False
    if isinstance(v, (int, float, np.integer, np.floating)):
        return math.isfinite(float(v))
    return False


def as_float(v: Any) -> float | None:
    """``v`` as a finite float (numbers, numpy scalars, numeric strings), else None."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _sig3(x: float) -> str:
    """A number: whole numbers whole, else 3 significant digits (no exponent below 1e6)."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    a = abs(x)
    if a >= 1e6 or a < 1e-4:
        return f"{x:.3g}"
    if a >= 100:
        return f"{x:.0f}"
    text = f"{x:.3g}"
    return text


def _pct(p: float) -> str:
    """A percent number: one decimal below 10%, none from 10% up."""
    one = round(p, 1)
    return f"{one:.1f}%" if abs(one) < 10 else f"{p:.0f}%"


def fmt_s(seconds: Any) -> str:
    """Seconds as short text: 850 µs, 12.3 ms, 1.52 s, 12.5 s, 2m30s, 1h05m ("-" when missing)."""
    if seconds is None or isinstance(seconds, bool):
        return MISSING
    try:
        v = float(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    if math.isnan(v):
        return MISSING
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0 s"
    sign, a = ("-" if v < 0 else ""), abs(v)
    if a < 1e-3 and round(a * 1e6) < 1000:
        return f"{sign}{a * 1e6:.0f} µs"
    if a < 1 and round(a * 1e3, 1) < 1000:
        return f"{sign}{a * 1e3:.1f} ms"
    if a < 10 and round(a, 2) < 10:
        return f"{sign}{a:.2f} s"
    if a < 60 and round(a, 1) < 60:
        return f"{sign}{a:.1f} s"
    whole = int(round(a))
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    minutes = int(round(a / 60))
    return f"{sign}{minutes // 60}h{minutes % 60:02d}m"


def _fmt_count(x: float, unit: Unit) -> str:
    text = _sig3(x)
    if unit is Unit.COUNT:
        return text
    one, many = _COUNTS[unit]
    return f"{text} {one if text == '1' else many}"


def _scaled(x: float) -> str:
    """A rate's number with a k/M suffix from 1,000 up."""
    a = abs(x)
    if a >= 1e6 and round(a / 1e6, 1) >= 1:
        return f"{x / 1e6:.1f}M"
    if a >= 1e3 or round(a) >= 1000:
        return f"{x / 1e3:.1f}k"
    return _sig3(x) if a >= 100 or x == int(x) else f"{x:.3g}"


def _fmt_bytes(x: float) -> str:
    for name, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {name}"
    return f"{x:.0f} B"


def fmt_value(value: Any, unit: Unit | str | None = Unit.NONE) -> str:
    """``value`` in ``unit`` as text, the one style every renderer uses (see the module doc).

    ``unit`` is a :class:`Unit`, its string value, or an old free-string unit: known aliases
    (``"ms"``, ``"ratio of TTFT"``, ``"levels"``, …) map to their unit; any other text is kept as
    a label after the number. Strings print as they are, None and NaN as ``-``, bools as yes/no.
    """
    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if not isinstance(value, (int, float, np.integer, np.floating)):
        return str(value)
    x = float(value)
    if math.isnan(x):
        return MISSING
    raw = unit.value if isinstance(unit, Unit) else (unit or "").strip()
    u = unit_of(raw)
    if u is Unit.S:
        return fmt_s(x / 1e3 if raw == "ms" else x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if u is Unit.SHARE:
        return _pct(x * 100.0)
    if u is Unit.PCT:
        return _pct(x)
    if u is Unit.X:
        return f"{x:.2f}x"
    if u in _COUNTS or u is Unit.COUNT:
        return _fmt_count(x, u)  # type: ignore[arg-type]
    if u is Unit.TOKENS_PER_S:
        return f"{_scaled(x)} tokens/s"
    if u is Unit.S_PER_S:
        return f"{x:.2f} s/s"
    if u is Unit.BYTES:
        return _fmt_bytes(x)
    text = _sig3(x)
    return f"{text} {raw}" if raw else text


def fmt_rate(value: Any, unit: Unit | str) -> str:
    """A count per second of wall time: ``fmt_rate(12.5, "requests")`` reads ``12.5 requests/s``;
    bytes take binary prefixes (``1.5 GiB/s``); ``count`` reads ``3.4k/s``."""
    if value is None or isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return fmt_value(value, unit)
    x = float(value)
    if math.isnan(x):
        return MISSING
    u = unit_of(unit)
    if u is Unit.BYTES:
        return _fmt_bytes(x) + "/s"
    if u is Unit.COUNT or u is Unit.NONE:
        return f"{_scaled(x)}/s"
    name = _COUNTS[u][1] if u in _COUNTS else (unit.value if isinstance(unit, Unit) else str(unit))
    return f"{_scaled(x)} {name}/s"


_OPS = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "=", "!=": "≠"}


def op_text(op: str | None) -> str:
    """A comparison as shown to people: ``>=`` reads ``≥``, ``<=`` reads ``≤``."""
    return _OPS.get((op or "").strip(), (op or "").strip())


def fmt_threshold(op: str | None, threshold: Any, unit: Unit | str | None = Unit.NONE) -> str:
    """A threshold as text, e.g. ``≥ 30%``; a legacy text threshold is returned as it is.

    None gives ``""`` (a context row has no threshold).
    """
    if threshold is None:
        return ""
    if isinstance(threshold, str):
        return threshold
    sym = op_text(op)
    text = fmt_value(threshold, unit)
    return f"{sym} {text}" if sym else text


def crossed_mark(crossed: bool | None) -> str:
    """The mark of an evidence row: ``✓ crossed``, ``✗ not crossed``, or ``""`` for context."""
    if crossed is None:
        return ""
    return "✓ crossed" if crossed else "✗ not crossed"


class _Fill(string.Formatter):
    """``str.format`` that prints a missing value as :data:`MISSING` whatever its field's spec."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return MISSING
        return format(value, format_spec)


_FILL = _Fill()


def fill(template: str, /, **values: Any) -> str:
    """``template`` (``str.format`` syntax, named fields) filled with ``values``, each number in
    its field's spec: ``{share:.0%}`` 42%, ``{ratio:.2f}`` 1.50, ``{n:g}`` 12, ``{ms:.1f}`` for a
    duration the caller gives in ms. A missing value (None, NaN) reads :data:`MISSING`. The rules'
    sentences (a pass reason, a check's miss) are filled here and nowhere else."""
    return _FILL.vformat(template, (), values)


def json_safe(obj: Any) -> Any:
    """``obj`` as strict JSON data, recursively.

    Mappings get string keys; lists, tuples, sets and numpy arrays become lists; numpy scalars
    become Python ones; NaN, ±inf, pandas NA/NaT become None; enums their value; any other
    object its ``str``.
    """
    if obj is None or isinstance(obj, (str, bool)):
        return obj
    if isinstance(obj, Enum):
        return json_safe(obj.value)
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [json_safe(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if type(obj).__name__ in ("NAType", "NaTType"):
        return None
    return str(obj)


_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h|d)?\s*")
_DURATION_S = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(text: str) -> float:
    """A duration as a command line gives it (``90``, ``30s``, ``5m``, ``1.5h``, ``2d``, ``250ms``;
    a bare number is seconds) in seconds, > 0; ValueError naming the text otherwise."""
    m = _DURATION.fullmatch(text or "")
    value = float(m.group(1)) * _DURATION_S[m.group(2)] if m else 0.0
    if not m or value <= 0:
        raise ValueError(f"bad duration {text!r}: expected e.g. 30s, 5m, 1h or 2d")
    return value
