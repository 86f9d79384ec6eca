"""Numeric helpers the feature themes share: columns as floats, span-name masks, interval
coverage, sweep-label parsing and a least-squares line. Pure functions (``Coverage`` is
immutable after construction); times in ns unless a name says ``_s``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd

from diag.ground.units import as_float  # noqa: F401  (the feature themes import it from here)

NS = 1e9  #: nanoseconds per second



def num_col(df: pd.DataFrame, name: str) -> pd.Series:
    """Column ``name`` as float64 (unparseable -> NaN); all NaN when the column is absent."""
    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce").astype("float64")
    return pd.Series(np.nan, index=df.index, dtype="float64")


def bool_col(df: pd.DataFrame, name: str, default: bool = False) -> pd.Series:
    """Column ``name`` as bool (missing -> ``default``)."""
    if name in df.columns:
        return df[name].fillna(default).astype(bool)
    return pd.Series(default, index=df.index, dtype=bool)


def name_is(spans: pd.DataFrame, name: str) -> np.ndarray:
    """Boolean mask of spans with this name; compares categorical codes, never casts 1M names to str."""
    col = spans["name"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        if name not in cats:
            return np.zeros(len(col), dtype=bool)
        return col.cat.codes.to_numpy() == cats.get_loc(name)
    return (col.astype(str) == name).to_numpy()


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals (any order) as sorted disjoint intervals."""
    if start.size == 0:
        return start.astype("float64"), end.astype("float64")
    order = np.argsort(start, kind="stable")
    s = start[order].astype("float64")
    e = end[order].astype("float64")
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    ms = s[idx]
    me = np.maximum.reduceat(run_end, idx) if idx.size else run_end[:0]
    return ms, me


class Coverage:
    """Time covered by a set of intervals between any a and b, O(log n) per query (vectorised)."""

    def __init__(self, start: np.ndarray, end: np.ndarray) -> None:
        self.s, self.e = merge_intervals(np.asarray(start, dtype="float64"), np.asarray(end, dtype="float64"))
        self.cum = np.concatenate([[0.0], np.cumsum(self.e - self.s)])

    def upto(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype="float64")
        if self.s.size == 0:
            return np.zeros_like(t)
        i = np.searchsorted(self.s, t, side="right")  # intervals starting at or before t
        prev = np.maximum(i - 1, 0)
        full = self.cum[prev]
        partial = np.clip(t - self.s[prev], 0.0, (self.e - self.s)[prev])
        return np.where(i > 0, full + partial, 0.0)

    def between(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.upto(b) - self.upto(a)

    @property
    def total(self) -> float:
        return float(self.cum[-1])


_SEG_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (col, re.compile(rf"(?i)(?:^|[\s,;/_-])(?:{key})\s*[=:]\s*([0-9.]+)"))
    for key, col in (("prompt|input", "prompt"), ("conc|concurrency|c", "conc"), ("tp", "tp"))
)


def _parse_segment(label: str) -> tuple[float, float, float]:
    out = []
    for _, pat in _SEG_PATTERNS:
        m = pat.search(label)
        try:
            out.append(float(m.group(1)) if m else math.nan)
        except ValueError:
            out.append(math.nan)
    return out[0], out[1], out[2]


def segment_numbers(segments: pd.Series) -> pd.DataFrame:
    """Parse sweep labels such as ``prompt=512`` / ``concurrency=8`` / ``tp=2`` into numeric columns.

    Parses each distinct label once (a capture has a handful), then maps.
    """
    out = pd.DataFrame(np.nan, index=segments.index, columns=["prompt", "conc", "tp"], dtype="float64")
    if segments.empty:
        return out
    obj = segments.to_numpy(dtype=object)
    labels = pd.unique(obj)
    parsed = {lab: _parse_segment(lab) for lab in labels if isinstance(lab, str) and lab}
    if not parsed:
        return out
    codes = pd.Index(list(parsed), dtype=object).get_indexer(obj)
    table = np.array([parsed[k] for k in parsed], dtype="float64")
    vals = np.where((codes >= 0)[:, None], table[np.maximum(codes, 0)], np.nan)
    out.loc[:, ["prompt", "conc", "tp"]] = vals
    return out


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least squares y = a + b x: (slope b, intercept a, R²)."""
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    sxy = float(((x - xm) * (y - ym)).sum())
    slope = sxy / sxx if sxx > 0 else 0.0
    intercept = float(ym - slope * xm)
    ss_tot = float(((y - ym) ** 2).sum())
    ss_res = float(((y - (intercept + slope * x)) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    return slope, intercept, r2


def linear_fit_se(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Standard errors of :func:`linear_fit`'s (slope, intercept), from its residuals; infinite
    with fewer than 3 points or one distinct x (nothing left to measure the scatter with)."""
    n = int(x.size)
    xm = float(x.mean()) if n else 0.0
    sxx = float(((x - xm) ** 2).sum()) if n else 0.0
    if n < 3 or sxx <= 0:
        return math.inf, math.inf
    slope, intercept, _ = linear_fit(x, y)
    s2 = float(((y - (intercept + slope * x)) ** 2).sum()) / (n - 2)
    return math.sqrt(s2 / sxx), math.sqrt(s2 * (1.0 / n + xm * xm / sxx))
