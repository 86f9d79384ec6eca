"""Per-engine tables that map /metrics names onto the canonical series of ``diag.stages``.

One table per engine (vLLM, SGLang, TGI, llama.cpp, trtllm-serve, Triton + TensorRT-LLM
backend, and our bundled engine's ``ttft_engine:`` names). A table is a list of
:class:`SeriesMap`: a canonical series and the *sources* it may come from, tried in order
(the first one with data wins — that is how renamed metrics such as
``vllm:gpu_cache_usage_perc`` → ``vllm:kv_cache_usage_perc`` are handled).

A source knows how to evaluate itself over two scrapes (:meth:`Source.evaluate`: counters →
per-second rates from deltas, histograms → windowed mean Δsum/Δcount and percentiles from
bucket deltas, gauges → as they are) and how to say the same thing in PromQL
(:meth:`Source.promql`), so the /metrics scraper and the Prometheus-server reader share one
table. Names are the *exposition* names (what a scrape shows and what PromQL queries).

To add a metric: append a :class:`SeriesMap` to the engine's table (or a source to an
existing one). Pure code, no I/O; safe from any thread.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diag import stages

#: Percentiles emitted for every histogram-backed series, as extra series ``<series>_p<NN>``.
PERCENTILES: tuple[float, ...] = (0.5, 0.95, 0.99)

SERIES_PREEMPTIONS_PER_S = stages.SERIES_PREEMPTIONS_PER_S
SERIES_PAUSED = stages.SERIES_PAUSED

Labels = tuple[tuple[str, str], ...]


def percentile_series(series: str, q: float) -> str:
    """The series name of a windowed percentile: ``ttft_s`` and 0.99 → ``ttft_s_p99``."""
    pct = q * 100
    tag = f"{pct:g}".replace(".", "_")
    return f"{series}_p{tag}"


# --- snapshots ------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """One parsed scrape: sample name → list of (labels, value). ``ts_s`` is Unix seconds.

    Counter samples are indexed both with and without their ``_total`` suffix, because
    prometheus_client's parser adds ``_total`` to counters that were exposed without it (TGI).
    """

    ts_s: float
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def get(self, name: str) -> list[tuple[dict[str, str], float]]:
        return self.samples.get(name, [])

    def names(self) -> set[str]:
        return set(self.samples)


def snapshot_from_families(families: Iterable[Any], ts_s: float) -> Snapshot:
    """Build a Snapshot from ``prometheus_client`` metric families (``*_created`` dropped)."""
    snap = Snapshot(ts_s=ts_s)
    for fam in families:
        for s in fam.samples:
            name = s.name
            if name.endswith("_created"):
                continue
            value = float(s.value)
            entry = (dict(s.labels), value)
            snap.samples.setdefault(name, []).append(entry)
            if fam.type == "counter" and name.endswith("_total"):
                snap.samples.setdefault(name[: -len("_total")], []).append(entry)
    return snap


# --- evaluation helpers ---------------------------------------------------------------------


@dataclass(frozen=True)
class EvalContext:
    """How samples are grouped into entities for one scrape pair.

    ``entity_labels``: labels that name a replica/engine/model (kept apart when a family has
    more than one value of them, otherwise summed over). ``prefix``: prepended to the entity
    (e.g. the replica's URL), joined with "/".
    """

    entity_labels: tuple[str, ...] = ()
    prefix: str = ""


def _entity_of(labels: Mapping[str, str], keep: Sequence[str]) -> str:
    return ",".join(f"{k}={labels[k]}" for k in keep if k in labels)


def _matches(labels: Mapping[str, str], match: Labels) -> bool:
    return all(labels.get(k) == v for k, v in match)


def _group(samples: list[tuple[dict[str, str], float]], match: Labels, ctx: EvalContext,
           extra_key: str | None = None) -> dict[tuple[str, str], float]:
    """Sum matching samples by (entity, extra label value)."""
    chosen = [(lab, v) for lab, v in samples if _matches(lab, match)]
    keep = [k for k in ctx.entity_labels if len({lab.get(k) for lab, _ in chosen}) > 1]
    out: dict[tuple[str, str], float] = {}
    for lab, v in chosen:
        ent = _entity_of(lab, keep)
        ek = lab.get(extra_key, "") if extra_key else ""
        out[(ent, ek)] = out.get((ent, ek), 0.0) + v
    return out


def _delta(cur: float, prev: float | None) -> float:
    """Counter delta with Prometheus reset semantics (a drop means it restarted from 0).

    A label set absent from the previous scrape started from 0 (client libraries create
    labelled children on first use).
    """
    if prev is None:
        return cur
    d = cur - prev
    return cur if d < 0 else d


def _le(value: str) -> float:
    return math.inf if value in ("+Inf", "Inf", "inf") else float(value)


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` over (upper bound, cumulative count) pairs.

    Linear interpolation inside the bucket that holds rank q·total; the first bucket's lower
    bound is 0 (or its upper bound when that is ≤ 0); a rank in +Inf returns the highest
    finite bound. NaN when the window holds no observations.
    """
    if not buckets:
        return math.nan
    b = sorted(buckets)
    total = b[-1][1]
    if not (total > 0) or not math.isinf(b[-1][0]):
        return math.nan
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for i, (bound, count) in enumerate(b):
        if count >= rank:
            if math.isinf(bound):
                return b[-2][0] if len(b) > 1 else math.nan
            if i == 0 and bound <= 0:
                return bound
            in_bucket = count - prev_count
            if in_bucket <= 0:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / in_bucket
        prev_bound, prev_count = bound, count
    return b[-2][0] if len(b) > 1 else math.nan


def _sel(name: str, match: Labels) -> str:
    if not match:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in match)
    return f"{name}{{{inner}}}"


def _fmt_scale(expr: str, scale: float) -> str:
    return expr if scale == 1.0 else f"({expr}) * {scale:g}"


# --- sources --------------------------------------------------------------------------------


class Source:
    """Where one canonical series comes from. Subclasses evaluate over a scrape pair."""

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        """entity → value (empty when the metric is absent or the window has no data)."""
        raise NotImplementedError

    def promql(self, window: str, by: str = "instance") -> str:
        """The same value as a PromQL expression, one result per ``by`` label value."""
        raise NotImplementedError

    def names(self) -> tuple[str, ...]:
        """The exposition sample names this source reads (for engine detection)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Gauge(Source):
    """A gauge as it is (summed over non-entity labels), times ``scale``."""

    name: str
    match: Labels = ()
    scale: float = 1.0

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        return {ent: v * self.scale for (ent, _), v in _group(cur.get(self.name), self.match, ctx).items()}

    def promql(self, window: str, by: str = "instance") -> str:
        return _fmt_scale(f"sum by ({by}) ({_sel(self.name, self.match)})", self.scale)

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class CounterValue(Source):
    """A counter's cumulative value (e.g. preemptions so far)."""

    name: str
    match: Labels = ()

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        return {ent: v for (ent, _), v in _group(cur.get(self.name), self.match, ctx).items()}

    def promql(self, window: str, by: str = "instance") -> str:
        return f"sum by ({by}) ({_sel(self.name, self.match)})"

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class CounterRate(Source):
    """Δcounter / Δt between two scrapes (per second), times ``scale``."""

    name: str
    match: Labels = ()
    scale: float = 1.0

    def deltas(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        if prev is None:
            return {}
        c = _group(cur.get(self.name), self.match, ctx)
        p = _group(prev.get(self.name), self.match, ctx)
        out = {}
        return {key[0]: _delta(v, p.get(key)) for key, v in c.items()}

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        if prev is None or cur.ts_s <= prev.ts_s:
            return {}
        dt = cur.ts_s - prev.ts_s
        return {ent: d / dt * self.scale for ent, d in self.deltas(prev, cur, ctx).items()}

    def promql(self, window: str, by: str = "instance") -> str:
        return _fmt_scale(f"sum by ({by}) (rate({_sel(self.name, self.match)}[{window}]))", self.scale)

    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class Histogram(Source):
    """A histogram ``<base>_bucket/_sum/_count``: windowed mean Δsum/Δcount × scale.

    :meth:`quantiles` gives percentiles from the bucket deltas (``le`` bounds × scale too).
    """

    base: str
    match: Labels = ()
    scale: float = 1.0

    def _deltas(self, suffix: str, prev: Snapshot, cur: Snapshot, ctx: EvalContext,
                extra_key: str | None = None) -> dict[tuple[str, str], float]:
        c = _group(cur.get(self.base + suffix), self.match, ctx, extra_key)
        p = _group(prev.get(self.base + suffix), self.match, ctx, extra_key)
        return {key: _delta(v, p.get(key)) for key, v in c.items()}

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        if prev is None:
            return {}
        sums = self._deltas("_sum", prev, cur, ctx)
        counts = self._deltas("_count", prev, cur, ctx)
        out = {}
        for key, n in counts.items():
            if n > 0 and key in sums:
                out[key[0]] = sums[key] / n * self.scale
        return out

    def quantiles(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext,
                  qs: Sequence[float] = PERCENTILES) -> dict[float, dict[str, float]]:
        """q → entity → windowed percentile (only entities with observations in the window)."""
        out: dict[float, dict[str, float]] = {q: {} for q in qs}
        if prev is None:
            return out
        d = self._deltas("_bucket", prev, cur, ctx, extra_key="le")
        per_entity: dict[str, list[tuple[float, float]]] = {}
        for (ent, le), v in d.items():
            try:
                per_entity.setdefault(ent, []).append((_le(le), v))
            except ValueError:
                continue
        for ent, buckets in per_entity.items():
            # cumulative deltas can lose monotonicity after a partial reset; enforce it
            buckets.sort()
            mono, running = [], 0.0
            for bound, count in buckets:
                running = max(running, count)
                mono.append((bound, running))
            for q in qs:
                val = bucket_quantile(q, mono)
                if not math.isnan(val):
                    out[q][ent] = val * self.scale
        return out

    def promql(self, window: str, by: str = "instance") -> str:
        num = f"sum by ({by}) (rate({_sel(self.base + '_sum', self.match)}[{window}]))"
        den = f"sum by ({by}) (rate({_sel(self.base + '_count', self.match)}[{window}]))"
        return _fmt_scale(f"{num} / {den}", self.scale)

    def promql_quantile(self, q: float, window: str, by: str = "instance") -> str:
        inner = f"sum by ({by}, le) (rate({_sel(self.base + '_bucket', self.match)}[{window}]))"
        return _fmt_scale(f"histogram_quantile({q:g}, {inner})", self.scale)

    def names(self) -> tuple[str, ...]:
        return (self.base + "_bucket", self.base + "_sum", self.base + "_count")


@dataclass(frozen=True)
class CounterRatio(Source):
    """Δnum / Δden over the window × scale (e.g. Triton's cumulative µs per request)."""

    num: CounterRate
    den: CounterRate
    scale: float = 1.0

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        n = self.num.deltas(prev, cur, ctx)
        d = self.den.deltas(prev, cur, ctx)
        return {e: n[e] / d[e] * self.scale for e in n if d.get(e, 0) > 0}

    def promql(self, window: str, by: str = "instance") -> str:
        a = CounterRate(self.num.name, self.num.match).promql(window, by)
        b = CounterRate(self.den.name, self.den.match).promql(window, by)
        return _fmt_scale(f"{a} / {b}", self.scale)

    def names(self) -> tuple[str, ...]:
        return self.num.names() + self.den.names()


@dataclass(frozen=True)
class GaugeRatio(Source):
    """num / den of two gauges (e.g. used / max KV blocks)."""

    num: Gauge
    den: Gauge

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        n = self.num.evaluate(prev, cur, ctx)
        d = self.den.evaluate(prev, cur, ctx)
        return {e: n[e] / d[e] for e in n if d.get(e, 0) > 0}

    def promql(self, window: str, by: str = "instance") -> str:
        return f"{self.num.promql(window, by)} / {self.den.promql(window, by)}"

    def names(self) -> tuple[str, ...]:
        return self.num.names() + self.den.names()


@dataclass(frozen=True)
class Combine(Source):
    """Σ sign·source over entities present in all parts (e.g. e2e − ttft ≈ decode)."""

    parts: tuple[tuple[float, Source], ...]

    def evaluate(self, prev: Snapshot | None, cur: Snapshot, ctx: EvalContext) -> dict[str, float]:
        vals = [(sign, src.evaluate(prev, cur, ctx)) for sign, src in self.parts]
        if not vals:
            return {}
        common = set(vals[0][1])
        for _, v in vals[1:]:
            common &= set(v)
        return {e: sum(sign * v[e] for sign, v in vals) for e in common}

    def promql(self, window: str, by: str = "instance") -> str:
        out = ""
        for i, (sign, src) in enumerate(self.parts):
            term = f"({src.promql(window, by)})"
            if i == 0:
                out = term if sign > 0 else f"-{term}"
            else:
                out += f" {'+' if sign > 0 else '-'} {term}"
        return out

    def names(self) -> tuple[str, ...]:
        return tuple(n for _, s in self.parts for n in s.names())


@dataclass(frozen=True)
class SeriesMap:
    """A canonical series and its sources, tried in order; ``note`` says what it approximates."""

    series: str
    sources: tuple[Source, ...]
    note: str = ""

    def promql(self, window: str, by: str = "instance") -> str:
        """All sources joined with ``or`` (first present wins, per ``by`` value)."""
        exprs = [s.promql(window, by) for s in self.sources]
        return exprs[0] if len(exprs) == 1 else " or ".join(f"({e})" for e in exprs)


@dataclass(frozen=True)
class EngineAdapter:
    """One engine's table. ``prefixes`` detect it; ``entity_labels`` name replicas/engines."""

    engine: str
    prefixes: tuple[str, ...]
    maps: tuple[SeriesMap, ...]
    entity_labels: tuple[str, ...] = ()
    note: str = ""

    def metric_names(self) -> set[str]:
        return {n for m in self.maps for s in m.sources for n in s.names()}


# --- the tables -----------------------------------------------------------------------------

S = stages


def _vllm_style(prefix: str) -> list[SeriesMap]:
    """vLLM V1's names under ``prefix`` (shared by vLLM and our bundled engine)."""
    p = prefix
    return [
        SeriesMap(S.SERIES_QUEUE_TIME_S, (Histogram(p + "request_queue_time_seconds"),)),
        SeriesMap(S.SERIES_PREFILL_TIME_S, (Histogram(p + "request_prefill_time_seconds"),)),
        SeriesMap(S.SERIES_DECODE_TIME_S, (Histogram(p + "request_decode_time_seconds"),)),
        SeriesMap(S.SERIES_TTFT_S, (Histogram(p + "time_to_first_token_seconds"),)),
        SeriesMap(S.SERIES_ITL_S, (Histogram(p + "inter_token_latency_seconds"),
                                   Histogram(p + "time_per_output_token_seconds"))),
        SeriesMap(S.SERIES_E2E_S, (Histogram(p + "e2e_request_latency_seconds"),)),
        SeriesMap(S.SERIES_KV_USAGE, (Gauge(p + "kv_cache_usage_perc"), Gauge(p + "gpu_cache_usage_perc"))),
        SeriesMap(S.SERIES_WAITING, (Gauge(p + "num_requests_waiting"),)),
        SeriesMap(S.SERIES_RUNNING, (Gauge(p + "num_requests_running"),)),
        SeriesMap(S.SERIES_PREEMPTIONS, (CounterValue(p + "num_preemptions_total"),)),
        SeriesMap(SERIES_PREEMPTIONS_PER_S, (CounterRate(p + "num_preemptions_total"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate(p + "prompt_tokens_total"),)),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate(p + "generation_tokens_total"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate(p + "time_to_first_token_seconds_count"),),
                  note="requests that got their first token: Δ TTFT histogram count / Δt"),
    ]


VLLM = EngineAdapter(
    engine="vllm",
    prefixes=("vllm:",),
    maps=tuple(_vllm_style("vllm:")),
    entity_labels=("engine",),
    note="renamed metrics read under both names: gpu_cache_usage_perc (<0.9) -> kv_cache_usage_perc, "
    "time_per_output_token_seconds (<0.11) -> inter_token_latency_seconds",
)

BUNDLED = EngineAdapter(
    engine="bundled",
    prefixes=("ttft_engine:",),
    maps=tuple(_vllm_style("ttft_engine:")),
    entity_labels=("engine", "rank"),
)

_SG_STAGE = "sglang:per_stage_req_latency_seconds"
_SG_STAGE_OLD = "sglang:request_latency_seconds"
SGLANG = EngineAdapter(
    engine="sglang",
    prefixes=("sglang:",),
    maps=(
        SeriesMap(S.SERIES_QUEUE_TIME_S, (Histogram("sglang:queue_time_seconds"),)),
        SeriesMap(S.SERIES_PREFILL_TIME_S, (Histogram(_SG_STAGE, (("stage", "prefill_forward"),)),
                                            Histogram(_SG_STAGE_OLD, (("stage", "prefill_forward"),))),
                  note="per prefill_forward slice (the last chunk under chunked prefill)"),
        SeriesMap(S.SERIES_TTFT_S, (Histogram("sglang:time_to_first_token_seconds"),)),
        SeriesMap(S.SERIES_ITL_S, (Histogram("sglang:inter_token_latency_seconds"),)),
        SeriesMap(S.SERIES_E2E_S, (Histogram("sglang:e2e_request_latency_seconds"),)),
        SeriesMap(S.SERIES_DECODE_TIME_S, (Combine(((1.0, Histogram("sglang:e2e_request_latency_seconds")),
                                                    (-1.0, Histogram("sglang:time_to_first_token_seconds")))),),
                  note="mean e2e - mean TTFT over the window"),
        SeriesMap(S.SERIES_KV_USAGE, (Gauge("sglang:token_usage"),)),
        SeriesMap(S.SERIES_WAITING, (Gauge("sglang:num_queue_reqs"),)),
        SeriesMap(S.SERIES_RUNNING, (Gauge("sglang:num_running_reqs"),)),
        SeriesMap(S.SERIES_PREEMPTIONS, (CounterValue("sglang:num_retracted_requests_total"),),
                  note="retractions"),
        SeriesMap(SERIES_PREEMPTIONS_PER_S, (CounterRate("sglang:num_retracted_requests_total"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate("sglang:prompt_tokens_total"),)),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("sglang:generation_tokens_total"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate("sglang:time_to_first_token_seconds_count"),),
                  note="Δ TTFT histogram count / Δt"),
    ),
    entity_labels=("dp_rank",),
    note="decode time = mean e2e - mean TTFT; prefill = prefill_forward stage histogram",
)

_TGI_PREFILL = Histogram("tgi_batch_inference_duration", (("method", "prefill"),))
TGI = EngineAdapter(
    engine="tgi",
    prefixes=("tgi_",),
    maps=(
        SeriesMap(S.SERIES_QUEUE_TIME_S, (Histogram("tgi_request_queue_duration"),)),
        SeriesMap(S.SERIES_PREFILL_TIME_S, (_TGI_PREFILL,), note="router-side prefill step of a batch"),
        SeriesMap(S.SERIES_DECODE_TIME_S, (Combine(((1.0, Histogram("tgi_request_inference_duration")),
                                                    (-1.0, _TGI_PREFILL))),),
                  note="mean inference - mean prefill batch step"),
        SeriesMap(S.SERIES_TTFT_S, (Combine(((1.0, Histogram("tgi_request_validation_duration")),
                                             (1.0, Histogram("tgi_request_queue_duration")),
                                             (1.0, _TGI_PREFILL))),),
                  note="approximation: mean validation + mean queue + mean prefill step"),
        SeriesMap(S.SERIES_ITL_S, (Histogram("tgi_request_mean_time_per_token_duration"),)),
        SeriesMap(S.SERIES_E2E_S, (Histogram("tgi_request_duration"),)),
        SeriesMap(S.SERIES_KV_USAGE, (GaugeRatio(Gauge("tgi_batch_current_max_tokens"),
                                                 Gauge("tgi_batch_max_total_tokens")),),
                  note="proxy: tokens the current batch may reach / token budget"),
        SeriesMap(S.SERIES_WAITING, (Gauge("tgi_queue_size"),)),
        SeriesMap(S.SERIES_RUNNING, (Gauge("tgi_batch_current_size"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate("tgi_request_input_length_sum"),)),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("tgi_request_generated_tokens_sum"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate("tgi_request_queue_duration_count"),),
                  note="requests that left the queue for a prefill: Δ queue histogram count / Δt"),
        SeriesMap(S.SERIES_PREFILL_BUSY, (CounterRate("tgi_batch_inference_duration_sum", (("method", "prefill"),)),),
                  note="Δ seconds in prefill batch steps / Δt (the router runs one batch at a time)"),
        SeriesMap(S.SERIES_DECODE_BUSY, (CounterRate("tgi_batch_inference_duration_sum", (("method", "decode"),)),),
                  note="Δ seconds in decode batch steps / Δt"),
    ),
    note="TTFT and decode are derived (validation + queue + prefill step; inference - prefill step); "
    "prefill/decode busy from the batch step histograms' sums; no preemption counter",
)

LLAMACPP = EngineAdapter(
    engine="llamacpp",
    prefixes=("llamacpp:",),
    maps=(
        SeriesMap(S.SERIES_ITL_S, (CounterRatio(CounterRate("llamacpp:tokens_predicted_seconds_total"),
                                                CounterRate("llamacpp:tokens_predicted_total")),),
                  note="Δ generation seconds / Δ generated tokens"),
        SeriesMap(S.SERIES_KV_USAGE, (Gauge("llamacpp:kv_cache_usage_ratio"),), note="older builds only"),
        SeriesMap(S.SERIES_WAITING, (Gauge("llamacpp:requests_deferred"),)),
        SeriesMap(S.SERIES_RUNNING, (Gauge("llamacpp:requests_processing"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate("llamacpp:prompt_tokens_total"),)),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("llamacpp:tokens_predicted_total"),)),
        SeriesMap(S.SERIES_PREFILL_BUSY, (CounterRate("llamacpp:prompt_seconds_total"),),
                  note="Δ prompt-processing seconds / Δt, summed over slots (can exceed 1 with --parallel)"),
        SeriesMap(S.SERIES_PREFILL_S_PER_TOKEN, (CounterRatio(CounterRate("llamacpp:prompt_seconds_total"),
                                                              CounterRate("llamacpp:prompt_tokens_total")),),
                  note="Δ prompt seconds / Δ prompt tokens (computed tokens; cache reuse excluded)"),
        SeriesMap(S.SERIES_DECODE_BUSY, (CounterRate("llamacpp:tokens_predicted_seconds_total"),),
                  note="Δ generation seconds / Δt, summed over slots"),
    ),
    note="no queue/prefill/TTFT/e2e histograms and no request counter (per-response timings.prompt_ms only); "
    "ITL = Δtokens_predicted_seconds / Δtokens_predicted; prefill busy = Δprompt_seconds / Δt; "
    "prefill s/token = Δprompt_seconds / Δprompt_tokens",
)

TRTLLM = EngineAdapter(
    engine="trtllm",
    prefixes=("trtllm_",),
    maps=(
        SeriesMap(S.SERIES_QUEUE_TIME_S, (Histogram("trtllm_request_queue_time_seconds"),)),
        SeriesMap(S.SERIES_PREFILL_TIME_S, (Histogram("trtllm_request_prefill_time_seconds"),)),
        SeriesMap(S.SERIES_DECODE_TIME_S, (Histogram("trtllm_request_decode_time_seconds"),)),
        SeriesMap(S.SERIES_TTFT_S, (Histogram("trtllm_time_to_first_token_seconds"),)),
        SeriesMap(S.SERIES_ITL_S, (Histogram("trtllm_time_per_output_token_seconds"),)),
        SeriesMap(S.SERIES_E2E_S, (Histogram("trtllm_e2e_request_latency_seconds"),)),
        SeriesMap(S.SERIES_KV_USAGE, (Gauge("trtllm_kv_cache_utilization"),)),
        SeriesMap(S.SERIES_WAITING, (Gauge("trtllm_num_requests_waiting"),)),
        SeriesMap(S.SERIES_RUNNING, (Gauge("trtllm_num_requests_running"),)),
        SeriesMap(SERIES_PAUSED, (Gauge("trtllm_num_paused_requests"),)),
        SeriesMap(S.SERIES_PROMPT_TOKENS_PER_S, (CounterRate("trtllm_prompt_tokens_total"),)),
        SeriesMap(S.SERIES_GENERATION_TOKENS_PER_S, (CounterRate("trtllm_generation_tokens_total"),)),
        SeriesMap(S.SERIES_REQUESTS_PER_S, (CounterRate("trtllm_time_to_first_token_seconds_count"),),
                  note="Δ TTFT histogram count / Δt"),
    ),
    note="paused requests are a gauge (num_paused), not a preemption counter",
)

_NV_SUCCESS = CounterRate("nv_inference_request_success")
TRITON = EngineAdapter(
    engine="triton",
    prefixes=("nv_trt_llm_", "nv_inference_"),
    maps=(
        SeriesMap(S.SERIES_QUEUE_TIME_S, (CounterRatio(CounterRate("nv_inference_queue_duration_us"), _NV_SUCCESS, 1e-6),),
                  note="Δ cumulative queue µs / Δ successful requests, per model"),
        SeriesMap(S.SERIES_E2E_S, (CounterRatio(CounterRate("nv_inference_request_duration_us"), _NV_SUCCESS, 1e-6),),
                  note="Δ cumulative request µs / Δ successful requests, per model"),
        SeriesMap(S.SERIES_TTFT_S, (Histogram("nv_inference_first_response_histogram_ms", scale=1e-3),),
                  note="only when Triton runs with the first-response histogram enabled"),
        SeriesMap(S.SERIES_KV_USAGE, (
            GaugeRatio(Gauge("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "used"),)),
                       Gauge("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "max"),))),
            Gauge("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "fraction"),)),
        ), note="used / max KV blocks"),
        SeriesMap(S.SERIES_WAITING, (Gauge("nv_trt_llm_request_metrics", (("request_type", "waiting"),)),
                                     Gauge("nv_inference_pending_request_count"))),
        SeriesMap(S.SERIES_RUNNING, (Gauge("nv_trt_llm_request_metrics", (("request_type", "scheduled"),)),)),
        SeriesMap(SERIES_PAUSED, (Gauge("nv_trt_llm_inflight_batcher_metrics",
                                        (("inflight_batcher_specific_metric", "paused_requests"),)),)),
    ),
    entity_labels=("model",),
    note="queue/e2e are per-request means of Triton's cumulative µs counters, kept apart per model "
    "(ensemble, preprocessing, tensorrt_llm, ...); no prefill/decode split, no token counters",
)

#: Every adapter, in detection priority order. Append new engines here.
ADAPTERS: tuple[EngineAdapter, ...] = (BUNDLED, VLLM, SGLANG, TGI, LLAMACPP, TRTLLM, TRITON)
ADAPTERS_BY_ENGINE: dict[str, EngineAdapter] = {a.engine: a for a in ADAPTERS}


def detect_engines(metric_names: Iterable[str]) -> list[str]:
    """Engines whose prefixes appear among the names, most names first (ties: table order)."""
    counts = {a.engine: 0 for a in ADAPTERS}
    for name in metric_names:
        for a in ADAPTERS:
            if name.startswith(a.prefixes):
                counts[a.engine] += 1
                break
    order = {a.engine: i for i, a in enumerate(ADAPTERS)}
    found = [e for e, c in counts.items() if c > 0]
    return sorted(found, key=lambda e: (-counts[e], order[e]))


def detect_engine(metric_names: Iterable[str]) -> str | None:
    """The engine that exposed these metric names, or None when none is recognised."""
    found = detect_engines(metric_names)
    return found[0] if found else None


@dataclass(frozen=True)
class Row:
    """One canonical value: series, entity, value (the unit the series name states)."""

    series: str
    entity: str
    value: float


def adapt(adapter: EngineAdapter, prev: Snapshot | None, cur: Snapshot, prefix: str = "",
          percentiles: Sequence[float] = PERCENTILES) -> list[Row]:
    """Canonical rows for one scrape pair (``prev`` None: gauges and cumulative values only)."""
    ctx = EvalContext(entity_labels=adapter.entity_labels, prefix=prefix)
    rows: list[Row] = []

    def ent(e: str) -> str:
        if prefix and e:
            return f"{prefix}/{e}"
        return prefix or e

    for m in adapter.maps:
        for src in m.sources:
            vals = src.evaluate(prev, cur, ctx)
            if not vals:
                continue
            for e, v in sorted(vals.items()):
                if math.isfinite(v):
                    rows.append(Row(m.series, ent(e), v))
            if isinstance(src, Histogram):
                for q, per in src.quantiles(prev, cur, ctx, percentiles).items():
                    for e, v in sorted(per.items()):
                        rows.append(Row(percentile_series(m.series, q), ent(e), v))
            break
    return rows


def promql_queries(adapter: EngineAdapter, window: str = "30s", by: str = "instance",
                   percentiles: Sequence[float] = PERCENTILES) -> dict[str, str]:
    """Canonical series → PromQL over a Prometheus server (one result per ``by`` value).

    Histogram-backed series also get ``<series>_pNN`` via ``histogram_quantile``.
    """
    out: dict[str, str] = {}
    for m in adapter.maps:
        out[m.series] = m.promql(window, by)
        hists = [s for s in m.sources if isinstance(s, Histogram)]
        if hists and len(hists) == len(m.sources):
            for q in percentiles:
                exprs = [h.promql_quantile(q, window, by) for h in hists]
                out[percentile_series(m.series, q)] = (
                    exprs[0] if len(exprs) == 1 else " or ".join(f"({e})" for e in exprs)
                )
    return out
