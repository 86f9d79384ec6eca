"""Series-only captures: no request has a TTFT, so the rules read the engine's /metrics series
(queue/prefill/TTFT means, windowed percentiles, request counts, prefill busy seconds), with
lowered confidence and the reason stated; captures with per-request spans keep preferring them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from diag.ground import stages as S
from diag.ground.request_table import empty_request_table
from diag.ground.tables import Tables
from rules import NO_DATA, evidence, run_rules
from rules.runner import SERIES_ONLY_NOTE
from support.simcap import MS, Client, Engine, Phase, simulate, tables_of


def _series(windows: list[dict[str, float]], dt_s: float = 5.0, t0: float = 1000.0) -> pd.DataFrame:
    rows = [(t0, "prometheus", S.SERIES_WAITING, "", 0.0)]
    for k, w in enumerate(windows, start=1):
        rows += [(t0 + k * dt_s, "prometheus", name, "", v) for name, v in w.items()]
    return pd.DataFrame(rows, columns=list(S.SERIES_COLUMNS))


def _tables(series: pd.DataFrame, req: pd.DataFrame | None = None) -> Tables:
    return Tables(requests=req if req is not None else empty_request_table(),
                  steps=pd.DataFrame(columns=["start_ns", "end_ns", "duration_s"]),
                  cold_starts=pd.DataFrame(columns=["start_ns", "end_ns", "duration_s", "phase", "service"]),
                  spans=pd.DataFrame(columns=["trace_id", "span_id", "name", "start_ns", "end_ns"]),
                  series=series, meta={})


QUEUE = {S.SERIES_REQUESTS_PER_S: 4.0, S.SERIES_TTFT_S: 2.0, S.SERIES_QUEUE_TIME_S: 1.8, S.SERIES_PREFILL_TIME_S: 0.15,
         "ttft_s_p50": 1.9, "ttft_s_p95": 3.0, "queue_time_s_p95": 2.8, S.SERIES_WAITING: 12.0,
         S.SERIES_KV_USAGE: 0.4, S.SERIES_PREEMPTIONS: 0.0, "itl_s_p50": 0.02, S.SERIES_GENERATION_TOKENS_PER_S: 200.0}
PREFILL = {S.SERIES_REQUESTS_PER_S: 0.4, S.SERIES_TTFT_S: 1.3, S.SERIES_QUEUE_TIME_S: 0.05, S.SERIES_PREFILL_TIME_S: 1.15,
           S.SERIES_WAITING: 0.0, "itl_s_p50": 0.05, S.SERIES_GENERATION_TOKENS_PER_S: 20.0}
BUSY = {S.SERIES_PREFILL_BUSY: 0.9, S.SERIES_PREFILL_S_PER_TOKEN: 0.0011, S.SERIES_PROMPT_TOKENS_PER_S: 800.0,
        S.SERIES_DECODE_BUSY: 0.3, S.SERIES_ITL_S: 0.2, S.SERIES_GENERATION_TOKENS_PER_S: 10.0, S.SERIES_WAITING: 2.0}


def _scale_one(tmp_path: Path) -> str:
    f = tmp_path / "rules.toml"
    f.write_text("[general]\nseries_only_scale = 1.0\n")
    return str(f)


def test_queue_verdict_from_metrics_alone(tmp_path: Path) -> None:
    t = _tables(_series([QUEUE] * 8))
    d = run_rules(t)
    v = d.verdict
    assert v.category == "queue"
    names = [e.key for e in v.evidence]
    assert names[0] == evidence.QUEUE_SHARE_METRICS and v.evidence[0].value == pytest.approx(0.9)
    assert evidence.WAITING_P95 in names and evidence.QUEUE_TIME_METRICS_MEAN in names
    assert SERIES_ONLY_NOTE in v.note and any(SERIES_ONLY_NOTE in n for n in d.notes)
    assert v.explained_s == pytest.approx(0.9 * 3.0)  # share x TTFT p95 from ttft_s_p95
    # the confidence is the same finding's, scaled by general.series_only_scale
    unscaled = run_rules(t, rules_file=_scale_one(tmp_path)).verdict
    assert v.confidence == pytest.approx(unscaled.confidence * 0.85, abs=2e-3)
    assert SERIES_ONLY_NOTE in unscaled.note  # still said, even unscaled


def test_prefill_verdict_from_the_stage_share_in_metrics() -> None:
    d = run_rules(_tables(_series([PREFILL] * 7)))
    v = d.leading  # 14 requests, metrics alone: prefill leads, under the verdict floor
    assert (d.verdict.category, v.category) == ("inconclusive", "prefill_compute")
    assert v.evidence[0].key == evidence.PREFILL_SHARE_METRICS
    assert "engine metrics" in v.title
    assert SERIES_ONLY_NOTE in v.note
    # 0.4 req/s x 5 s x 7 windows = 14 requests < min_requests: confidence shrinks with the count too
    assert d.features.value("requests_n") == 14
    assert v.confidence < 0.5


def test_prefill_verdict_from_busy_seconds_without_ttft() -> None:
    d = run_rules(_tables(_series([BUSY] * 12)))
    v = d.leading  # busy seconds alone say prefill, not how much of TTFT: under the verdict floor
    assert (d.verdict.category, v.category) == ("inconclusive", "prefill_compute")
    assert v.evidence[0].key == evidence.PREFILL_BUSY_RATIO and v.evidence[0].threshold is not None
    assert any(e.key == evidence.WAITING_MAX for e in v.evidence)
    assert v.explained_s is None and "unknown" in v.note and SERIES_ONLY_NOTE in v.note
    skipped = {s.rule_id: s.reason for s in d.skipped}
    assert "queue" in skipped and "decode" in skipped  # no TTFT from a llama.cpp-like engine: said, not passed
    # few windows and no request counter: confidence shrinks with the windows
    few = run_rules(_tables(_series([BUSY] * 3))).leading
    assert few.category == "prefill_compute" and few.confidence < v.confidence


def test_idle_prompt_counters_do_not_blame_prefill() -> None:
    d = run_rules(_tables(_series([dict(BUSY, **{S.SERIES_PREFILL_BUSY: 0.2})] * 12)))
    assert d.verdict.category == "healthy"
    assert SERIES_ONLY_NOTE in d.verdict.note
    passed = {p.rule_id: p.reason for p in d.passed}
    assert "processing prompts" in passed["prefill_compute"]


def test_kv_pressure_from_metrics_alone() -> None:
    kv = dict(QUEUE, **{S.SERIES_KV_USAGE: 0.99})
    d = run_rules(_tables(_series([kv] * 4 + [dict(kv, **{S.SERIES_PREEMPTIONS: 7.0})] * 4)))
    assert d.verdict.category == "kv_cache"
    assert {evidence.KV_USAGE_P95, evidence.PREEMPTIONS} <= {e.key for e in d.verdict.evidence}
    queue = next(f for f in d.findings if f.category == "queue")
    assert "kv_cache" in queue.demoted_by


def test_no_data_without_a_scrape_pair_and_failures_when_all_failed() -> None:
    one = pd.DataFrame([(1000.0, "prometheus", S.SERIES_WAITING, "", 3.0)], columns=list(S.SERIES_COLUMNS))
    assert run_rules(_tables(one)).verdict.category == NO_DATA
    req = empty_request_table()
    failed = pd.DataFrame({"trace_id": ["a", "b"], "start_ns": [1.0, 2.0], "ttft_s": [float("nan")] * 2,
                           "error": ["http_503", "http_503"], "warmup": [False, False], "has_server": [True, True],
                           "has_client": [False, False]})
    req = pd.concat([req, failed], ignore_index=True) if len(req.columns) else failed
    d = run_rules(_tables(_series([QUEUE] * 4), req))
    # every request failed: the failures are the verdict, whatever the series say
    assert d.verdict.category == "failures" and "100% of requests failed (http_503 x2)" in d.verdict.title


def test_spans_keep_their_verdict_over_contrary_metrics(tmp_path: Path) -> None:
    """Per-request spans that show prefill win over /metrics that would say queue."""
    dirs = simulate(tmp_path, Engine(prefill_s_per_token=0.2 * MS),
                    [Phase(f"prompt={p}", 5, p, 8, conc=1) for p in (256, 512, 1024, 2048, 4096)], Client())
    tables = tables_of(dirs)
    base = run_rules(tables)
    tables.series = pd.concat([tables.series, _series([QUEUE] * 8)], ignore_index=True) if len(tables.series) \
        else _series([QUEUE] * 8)
    d = run_rules(tables)
    assert base.verdict.category == d.verdict.category == "prefill_compute"
    assert d.features.value("series_only") == 0.0
    assert d.verdict.confidence == pytest.approx(base.verdict.confidence)
    assert SERIES_ONLY_NOTE not in (d.verdict.note or "")
    assert d.features.get("queue_share_tail").source is None and d.features.value("queue_share_tail") < 0.3


def test_requests_waiting_for_capacity_are_not_kv_pressure_alone() -> None:
    """vLLM's num_requests_waiting_by_reason{reason="capacity"} counts every waiting request not
    deferred, whichever limit holds it (max_num_seqs, the token budget or KV blocks): alone it
    names no kv_cache; the queue finding shows it as context. Deferred waiting is queue too."""
    base = {k: v for k, v in QUEUE.items() if k != S.SERIES_KV_USAGE}
    d = run_rules(_tables(_series([{**base, S.SERIES_WAITING_CAPACITY: 11.0}] * 8)))
    assert d.verdict.category == "queue", d.verdict.title
    assert not any(f.category == "kv_cache" for f in d.findings)
    row = next(e for e in d.verdict.evidence if e.key == evidence.WAITING_FOR_CAPACITY)
    assert row.value == pytest.approx(11.0 / 12.0) and row.threshold is None
    assert d.features.value("waiting_for_capacity_share") == pytest.approx(11.0 / 12.0)
    deferred = run_rules(_tables(_series([{**base, S.SERIES_WAITING_CAPACITY: 0.0, S.SERIES_WAITING_DEFERRED: 11.0}] * 8)))
    assert deferred.verdict.category == "queue"
    # with the KV pool full and preemptions, kv_cache comes from those; the capacity gauge is context there
    kv = run_rules(_tables(_series([{**base, S.SERIES_WAITING_CAPACITY: 11.0, S.SERIES_KV_USAGE: 0.99,
                                    S.SERIES_PREEMPTIONS: 6.0}] * 8))).verdict
    assert kv.category == "kv_cache", kv.title
    names = [e.key for e in kv.evidence]
    assert evidence.KV_USAGE_P95 in names and evidence.WAITING_FOR_CAPACITY in names
