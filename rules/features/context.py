"""The shared state of one feature computation (:class:`FeatureContext`).

The inputs (the capture's tables, cut to the time window), the parameters, the output
:class:`~rules.features.feature.Features`, and the few derived populations that one theme
writes and later themes read. Each derived attribute names its writer; the order the themes
run in is the one list in :mod:`rules.features` (``THEMES``).

Threading: one context per computation, used by one thread; nothing here is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from diag.ground import stages
from diag.ground.tables import Tables
from diag.ground.units import json_safe
from rules.features.catalog import CATALOG
from rules.features.feature import Feature, Features
from rules.features.numeric import Coverage, as_float


class FeatureContext:
    """Inputs, parameters and output of one :func:`rules.features.compute_features` call."""

    def __init__(self, tables: Tables, window_ns: tuple[int, int] | None, slo: Mapping[str, float] | None,
                 params: Mapping[str, float]) -> None:
        self.tables = tables
        #: (start, end) Unix ns, or None for the whole capture
        self.window_ns = window_ns
        #: ``"ttft_p99"``-style keys -> seconds
        self.slo: dict[str, float] = dict(slo or {})
        #: the ``[features]`` parameters (rules/defaults.toml, overridden by a rules file)
        self.params: dict[str, float] = dict(params)
        self.features = Features()
        cut = tables.window(window_ns)
        req = cut.requests if cut.requests is not None else pd.DataFrame()
        steps = cut.steps if cut.steps is not None else pd.DataFrame()
        series = cut.series if cut.series is not None else pd.DataFrame()
        #: every request starting in the window (warm-up and failed included)
        self.req_all: pd.DataFrame = req.reset_index(drop=True)
        #: engine steps overlapping the window
        self.steps: pd.DataFrame = steps.reset_index(drop=True)
        #: time series samples in the window (long format, ``stages.SERIES_COLUMNS``)
        self.series: pd.DataFrame = series
        self.spans: pd.DataFrame = tables.spans if tables.spans is not None else pd.DataFrame()
        self.meta: dict[str, Any] = tables.meta or {}
        # -- derived state, written once by the theme named, read by the themes after it --
        #: populations: completed requests (not warm-up, no error, with a TTFT), by start time
        self.ok: pd.DataFrame = pd.DataFrame()
        #: populations: ``ok`` minus cold-start outliers and diagnose's long ramp, longout and mixed follow-ups; TTFT statistics use these
        self.steady: pd.DataFrame = pd.DataFrame()
        #: populations: completed requests of ttft diagnose's long ramp (segments ``long=N``)
        self.long_ramp: pd.DataFrame = pd.DataFrame()
        #: populations: completed requests of ttft diagnose's mixed follow-up (segments ``mixed=N``)
        self.mixed: pd.DataFrame = pd.DataFrame()
        #: populations: completed requests of ttft diagnose's longout follow-up (segments ``longout=N``)
        self.long_out: pd.DataFrame = pd.DataFrame()
        #: populations: completed requests of ttft diagnose's grammar and LoRA follow-ups (``grammar=R``, ``lora=C``)
        self.grammar_design: pd.DataFrame = pd.DataFrame()
        self.lora_design: pd.DataFrame = pd.DataFrame()
        #: populations.users_workload: the users' shortest and longest prompt (tokens), as ttft
        #: diagnose --workload recorded them; None when not given
        self.users_prompt_tokens: tuple[float, float] | None = None
        #: engine_metrics: no request has a TTFT, the engine's /metrics series describe the run
        self.series_only: bool = False
        #: concurrency.inflight: requests in flight at each steady request's arrival (itself included)
        self.inflight_at: pd.Series = pd.Series(dtype="float64")
        #: device.device_busy: time covered by engine steps (None without step spans)
        self.busy: Coverage | None = None
        #: the theme now running (set by the front door) and the first theme that wrote each feature
        self.theme: str = ""
        self.produced_by: dict[str, str] = {}

    # -- writing features --
    def add(self, name: str, value: Any, reason: str | None = None, source: str | None = None) -> None:
        """Record feature ``name`` (unit from the catalogue); unavailable when ``value`` is None or a ``reason`` is given."""
        if isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, bool):
            value = as_float(value)
        ok = value is not None and reason is None
        self.produced_by.setdefault(name, self.theme)
        self.features.add(Feature(name, json_safe(value) if ok else None, CATALOG[name].unit, ok,
                                  None if ok else (reason or "no data"), source))

    def na(self, names: tuple[str, ...], reason: str) -> None:
        """Record every feature in ``names`` as unavailable for ``reason``."""
        for name in names:
            self.produced_by.setdefault(name, self.theme)
            self.features.add(Feature(name, None, CATALOG[name].unit, False, reason))

    # -- reading series --
    def series_values(self, name: str, source: str | None = None) -> pd.DataFrame:
        """Windowed samples of series ``name`` (optionally of one ``source``) with a numeric value."""
        s = self.series
        if s is None or s.empty or "series" not in s.columns:
            return pd.DataFrame(columns=list(stages.SERIES_COLUMNS))
        m = s["series"].astype(str) == name
        if source is not None:
            m &= s["source"].astype(str) == source
        out = s.loc[m]
        return out.loc[pd.to_numeric(out["value"], errors="coerce").notna()]

    def weighted(self, name: str, weight: str | None = None) -> pd.DataFrame:
        """Rows of series ``name`` as (entity, value, w): ``w`` is the matching ``weight`` row's value
        (same scrape, same entity), or 1.0 for every row when the weight series does not cover them all."""
        s = self.series_values(name)
        if s.empty:
            return pd.DataFrame({"entity": pd.Series(dtype=object), "value": pd.Series(dtype="float64"),
                                 "w": pd.Series(dtype="float64")})
        out = pd.DataFrame({"ts_s": pd.to_numeric(s["ts_s"], errors="coerce").to_numpy(),
                            "entity": s["entity"].astype(str).to_numpy(),
                            "value": pd.to_numeric(s["value"], errors="coerce").to_numpy(dtype="float64")})
        out = out.loc[np.isfinite(out["value"])]
        w = np.ones(len(out))
        if weight is not None:
            ws = self.series_values(weight)
            if len(ws):
                wdf = pd.DataFrame({"ts_s": pd.to_numeric(ws["ts_s"], errors="coerce").to_numpy(),
                                    "entity": ws["entity"].astype(str).to_numpy(),
                                    "w": pd.to_numeric(ws["value"], errors="coerce").to_numpy(dtype="float64")})
                wdf = wdf.drop_duplicates(["ts_s", "entity"], keep="last")
                m = out[["ts_s", "entity"]].merge(wdf, how="left", on=["ts_s", "entity"])["w"].to_numpy(dtype="float64")
                if len(m) and np.isfinite(m).all() and (m >= 0).all() and m.sum() > 0:
                    w = m
        out = out.assign(w=w)
        return out.loc[out["w"] > 0, ["entity", "value", "w"]]

    def wmean(self, name: str, weight: str | None = None) -> float | None:
        """Weighted mean of a series' windowed values (weights: see :meth:`weighted`); None when absent."""
        d = self.weighted(name, weight)
        if d.empty:
            return None
        return float(np.average(d["value"].to_numpy(), weights=d["w"].to_numpy()))
