"""Features: the numbers the triage rules read, computed once per capture (or time window).

Front door: :func:`compute_features` (tables -> :class:`Features`). Pure pandas/numpy, no I/O,
vectorised over spans and token gaps (per-request Python work is bounded to a few dozen
cold-start candidates). Every feature says whether it could be computed and, when not, why
(``Feature.reason``), so a rule can answer "skipped: needs …" instead of passing silently.
Every feature name, its theme and its unit are in :mod:`rules.features.catalog`.

Populations:

* *ok* requests: not warm-up, no error, with a TTFT.
* *steady* requests: ok minus cold-start outliers (the first request(s) far above the rest);
  TTFT percentiles, stage shares and fits are on the steady population. Cold-start outliers
  are reported apart (``cold_start_*``) and never counted as TTFT.

Themes (one module each; a theme is a function taking the shared
:class:`~rules.features.context.FeatureContext` and adding features), run in the order of
:data:`THEMES`:

* ``populations`` — request counts, error rate, sides, the steady population, cold start;
* ``engine_metrics`` — the engine's /metrics series, the series-only mode and its fallback;
* ``latency`` — TTFT / e2e percentiles, the client-server gap, the SLO checks;
* ``stage_shares`` — each stage's share of TTFT (slowest 5% and median);
* ``concurrency`` — requests in flight, TTFT vs concurrency, the knee, decode speed by level, and what one load level shows (waiting in line);
* ``prompt_fit`` — TTFT vs prompt length, a prompt token against a decode step;
* ``floor`` — what a request's own work costs on this server, and each TTFT against it;
* ``device`` — device busy, step times, KV usage and preemptions, queue depth, TP comm, CPU profile;
* ``loop`` — the engine's step loop: time between steps while requests wait inside the engine;
* ``pipeline`` — pipeline-parallel bubbles: stage idle time in the engine steps, PP against TP;
* ``itl`` — inter-token latency, TPOT, prefill-decode interference;
* ``client`` — the load generator's health;
* ``frontend`` — waits before the engine (HTTP workers, tokenizer threads), the client-server gap by load;
* ``admission`` — short requests behind long prompts (head-of-line), waiting beside low KV usage (reservation);
* ``prefix_cache`` — repeats of the probe's shared prefix: their TTFT and cached tokens, engine hit ratios.
* ``grammar`` — structured output: a schema's first uses against its repeats, the engine's grammar waits;
* ``lora`` — LoRA adapters: all the adapters against one at the same load, requests for an adapter not in flight, deferred waits;
* ``pd`` — disaggregated prefill/decode: the KV transfer and the decode side's admission as shares of TTFT.

Parameters (``tail_quantile``, ``min_fit_requests``, …) are the ``[features]`` table of
``rules/defaults.toml`` (read through :mod:`rules.config`), overridden by ``params``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from diag.ground.tables import Tables
from rules.config import default_feature_params
from rules.features import (admission, client, concurrency, device, engine_metrics, itl, latency, populations,
                            prompt_fit, stage_shares)
from rules.features import pipeline
from rules.features import frontend
from rules.features import prefix_cache
from rules.features import floor
from rules.features import loop
from rules.features import grammar
from rules.features import lora
from rules.features import pd
from rules.features.catalog import CATALOG, FeatureSpec
from rules.features.context import FeatureContext
from rules.features.feature import Feature, Features

Theme = Callable[[FeatureContext], None]

#: The themes in the order they run; each reads what the ones before it wrote (see FeatureContext).
THEMES: tuple[Theme, ...] = (
    populations.populations,  # writes ctx.ok, ctx.steady
    engine_metrics.engine_metrics,  # writes ctx.series_only
    latency.ttft,
    stage_shares.stage_shares,
    engine_metrics.series_fallback,  # series-only: TTFT, stage shares, request count from the series
    concurrency.inflight,  # writes ctx.inflight_at
    concurrency.concurrency,
    concurrency.long_ramp,  # reads ctx.long_ramp and the short ramp's segments
    concurrency.long_outputs,  # reads ctx.long_out and ctx.long_ramp
    prompt_fit.prompt_fit,  # reads ctx.inflight_at
    device.device_busy,  # writes ctx.busy
    device.kv,
    loop.loop,  # reads ctx.steady and the engine steps
    admission.head_of_line,  # reads ctx.steady and the engine steps
    admission.reservation,
    prefix_cache.prefix_cache,  # reads ctx.steady (the probe's prefix roles) and the series
    grammar.grammar,  # reads ctx.steady (the probe's schema roles, the engine's grammar waits)
    lora.lora,  # reads ctx.steady (the probe's LoRA roles) and the series
    pd.pd_split,  # reads ctx.steady (the engine's prefill/decode hand-off)
    device.comm_tp,
    pipeline.pipeline,  # pipeline-parallel idle (bubble) from the engine steps' stage accounts
    itl.itl,
    floor.floor,  # reads ctx.inflight_at, the stage columns and ITL p50
    concurrency.single_level,  # reads ITL p50 and ctx.inflight_at
    populations.cold_start_spans,
    latency.network,
    client.client_health,
    device.cpu_profile,
    prompt_fit.prompt_slope_per_itl,  # reads the prompt fit and ITL
    latency.slo_checks,  # reads ITL
    frontend.frontend,  # the front end before the engine: reads ITL, in-flight and the engine's queue depth
)


def theme_name(theme: Theme) -> str:
    """The theme's module name (``"device"``), as the catalogue names producers."""
    return theme.__module__.rsplit(".", 1)[-1]


def compute_features(tables: Tables, window_ns: tuple[int, int] | None = None, slo: Mapping[str, float] | None = None,
                     *, params: Mapping[str, float] | None = None) -> Features:
    """All features of a capture (optionally only requests starting in ``window_ns``, Unix ns).

    ``slo`` maps ``"ttft_p99"``-style keys to seconds (``diag.ground.slo.parse_slo``); ``params``
    overrides the ``[features]`` defaults. Never raises on missing data: such features are
    unavailable with a reason. Runs on the calling thread; no shared state.
    """
    ctx = run_themes(tables, window_ns, slo, params)
    return ctx.features


def run_themes(tables: Tables, window_ns: tuple[int, int] | None = None, slo: Mapping[str, float] | None = None,
               params: Mapping[str, float] | None = None) -> FeatureContext:
    """Run :data:`THEMES` in order on a fresh context and return it (features and who produced them)."""
    ctx = FeatureContext(tables, window_ns, slo, {**default_feature_params(), **(params or {})})
    for theme in THEMES:
        ctx.theme = theme_name(theme)
        theme(ctx)
    return ctx


__all__ = ["CATALOG", "Feature", "FeatureContext", "FeatureSpec", "Features", "THEMES", "compute_features",
           "run_themes", "theme_name"]
