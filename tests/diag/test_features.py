"""diag.features: the numbers the rules read, and the reasons when they cannot be computed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diag import stages
from diag.features import Feature, Features, _Coverage, _linear_fit, _merge_intervals, _segment_numbers, compute_features
from diag.tables import Tables, empty_request_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rules"))
from simcap import MS, Client, Engine, Phase, simulate, tables_of  # noqa: E402

NS = 1e9


def _tables(req: pd.DataFrame | None = None, steps: pd.DataFrame | None = None, series: pd.DataFrame | None = None,
            meta: dict | None = None) -> Tables:
    return Tables(
        requests=req if req is not None else empty_request_table(),
        steps=steps if steps is not None else pd.DataFrame(columns=["start_ns", "end_ns", "duration_s"]),
        cold_starts=pd.DataFrame(columns=["start_ns", "end_ns", "duration_s", "phase", "service"]),
        spans=pd.DataFrame(columns=["trace_id", "span_id", "name", "start_ns", "end_ns"]),
        series=series if series is not None else pd.DataFrame(columns=list(stages.SERIES_COLUMNS)),
        meta=meta or {},
    )


def _requests(ttft_s: list[float], **cols: list) -> pd.DataFrame:
    n = len(ttft_s)
    base = 1.7e18
    df = pd.DataFrame({
        "trace_id": [f"{i:032x}" for i in range(n)],
        "start_ns": [base + i * 1e8 for i in range(n)],
        "ttft_s": ttft_s, "server_ttft_s": ttft_s, "client_ttft_s": [np.nan] * n,
        "e2e_s": [t + 0.01 for t in ttft_s], "has_server": [True] * n, "has_client": [False] * n,
        "warmup": [False] * n, "error": [None] * n, "segment": [None] * n,
    })
    for k, v in cols.items():
        df[k] = v
    return df


def test_feature_accessors() -> None:
    f = Features()
    f.add(Feature("a", 1.5, "s", True))
    f.add(Feature("b", None, "s", False, "no data here"))
    assert f.value("a") == 1.5 and f.value("b", 7) == 7 and f.value("zzz") is None
    assert f.available("a") and not f.available("b")
    assert f.get("zzz").reason == "not computed for this capture"
    d = f.to_dict()
    assert d["b"] == {"value": None, "unit": "s", "available": False, "reason": "no data here"}


def test_empty_tables_explain_every_missing_feature() -> None:
    feats = compute_features(_tables())
    assert feats.value("requests_n") == 0
    for name, f in feats.items.items():
        if not f.available:
            assert f.reason, name
    assert "no completed requests" in feats.get("ttft_p95_s").reason


def test_percentiles_and_stage_shares() -> None:
    ttft = [0.010] * 95 + [0.100] * 5
    queue = [0.001] * 95 + [0.080] * 5
    prefill = [0.008] * 95 + [0.015] * 5
    feats = compute_features(_tables(_requests(ttft, queue_s=queue, prefill_s=prefill, tokenize_s=[0.001] * 100)))
    assert feats.value("ttft_p50_s") == pytest.approx(0.010)
    assert feats.value("queue_share_tail") == pytest.approx(0.8)
    assert feats.value("queue_share_median") == pytest.approx(0.1)
    assert feats.value("prefill_share_median") == pytest.approx(0.8)
    shares = feats.value("stage_shares_tail")
    assert sum(shares.values()) + feats.value("unattributed_share_tail") == pytest.approx(1.0)
    assert not feats.available("comm_share_tail")
    assert "comm" in feats.get("comm_share_tail").reason


def test_prompt_fit_on_requests_that_did_not_queue() -> None:
    tokens = [100, 200, 400, 800, 1600] * 4
    ttft = [0.002 + 0.0001 * t for t in tokens]
    queue = [0.0] * 20
    # two queued requests far off the line are left out of the fit
    tokens += [100, 100]
    ttft += [1.0, 1.0]
    queue += [0.99, 0.99]
    feats = compute_features(_tables(_requests(ttft, input_tokens=tokens, queue_s=queue)))
    assert feats.value("ttft_prompt_slope_ms_per_token") == pytest.approx(0.1, rel=1e-6)
    assert feats.value("ttft_prompt_intercept_ms") == pytest.approx(2.0, rel=1e-6)
    assert feats.value("ttft_prompt_r2") == pytest.approx(1.0)
    assert feats.value("ttft_prompt_fit_n") == 20


def test_prompt_fit_needs_varied_prompts() -> None:
    feats = compute_features(_tables(_requests([0.01] * 20, input_tokens=[64] * 20, queue_s=[0.0] * 20)))
    assert not feats.available("ttft_prompt_r2")
    assert "prompt-length sweep" in feats.get("ttft_prompt_r2").reason


def test_cold_start_outlier_is_excluded() -> None:
    ttft = [2.0] + [0.01 + 0.001 * (i % 3) for i in range(49)]
    feats = compute_features(_tables(_requests(ttft, input_tokens=[64] * 50)))
    assert feats.value("cold_start_outliers_n") == 1
    assert feats.value("cold_start_outlier_ttft_s") == 2.0
    assert feats.value("ttft_p99_s") < 0.02
    assert feats.value("requests_n") == 49


def test_inflight_knee_and_decode_speed() -> None:
    # concurrency sweep labels: TTFT flat to 4, then jumps; decode speed holds
    levels = [1, 2, 4, 8, 16]
    ttft = {1: 0.01, 2: 0.011, 4: 0.012, 8: 0.05, 16: 0.2}
    rows = [(c, ttft[c]) for c in levels for _ in range(5)]
    req = _requests([t for _, t in rows], segment=[f"concurrency={c}" for c, _ in rows], tpot_s=[0.004] * len(rows))
    feats = compute_features(_tables(req))
    assert feats.get("ttft_by_inflight").source == "segments"
    assert feats.value("concurrency_knee") == 4
    assert feats.value("concurrency_flat_levels") == 2
    assert feats.value("ttft_knee_jump_ratio") == pytest.approx(0.2 / 0.012)
    assert feats.value("ttft_concurrency_ratio") == pytest.approx(20)
    assert feats.value("decode_speed_hold_ratio") == pytest.approx(1.0)


def test_device_busy_prefers_nvml_and_falls_back_to_steps() -> None:
    req = _requests([0.01] * 10)
    t0 = req["start_ns"].min()
    steps = pd.DataFrame({"start_ns": [t0, t0 + 2e8], "end_ns": [t0 + 1e8, t0 + 3e8]})
    steps["duration_s"] = (steps["end_ns"] - steps["start_ns"]) / NS
    feats = compute_features(_tables(req, steps))
    assert feats.get("device_busy_frac").source == "engine_steps"
    assert feats.value("device_busy_frac") == pytest.approx(2e8 / 9.2e8, rel=1e-3)  # wall: first request .. last request end
    nvml = pd.DataFrame({"ts_s": [1, 2, 1, 2], "source": "nvml", "series": stages.SERIES_GPU_UTIL_PCT,
                         "entity": ["gpu0", "gpu0", "gpu1", "gpu1"], "value": [100, 80, 20, 0]})
    feats = compute_features(_tables(req, steps, nvml))
    assert feats.get("device_busy_frac").source == "nvml"
    assert feats.value("device_busy_frac") == pytest.approx(0.5)


def test_kv_from_prometheus_series_and_reasons_without() -> None:
    req = _requests([0.01] * 10)
    s = pd.DataFrame({"ts_s": range(10), "source": "prometheus", "series": stages.SERIES_KV_USAGE, "entity": "",
                      "value": [0.5] * 8 + [0.95, 0.99]})
    feats = compute_features(_tables(req, series=s))
    assert feats.value("kv_usage_max") == pytest.approx(0.99)
    assert feats.value("kv_time_above_high_frac") == pytest.approx(0.2)
    assert feats.get("kv_usage_p95").source == "prometheus"
    feats = compute_features(_tables(req))
    assert "kv_usage_ratio" in feats.get("kv_usage_p95").reason


def test_client_health_from_probe_meta() -> None:
    meta = {"client_health": {"loop_lag_p99_s": 0.03, "cpu_pct_mean": 40.0, "cpu_pct_p90": 97.0, "saturated": True,
                              "thresholds": {"loop_lag_p99_s": 0.02}}}
    feats = compute_features(_tables(_requests([0.01] * 5), meta=meta))
    assert feats.value("client_loop_lag_p99_s") == 0.03
    assert feats.value("client_cpu_pct_p95") == 97.0
    assert feats.value("client_saturated_flag") == 1.0


def test_cpu_profile_shares_from_pyspy_summary() -> None:
    meta = {"pyspy": {"shares": {"idle": 0.5, "tokenize": 0.25}, "busy_shares": {"tokenize": 0.5, "forward": 0.5}}}
    feats = compute_features(_tables(_requests([0.01] * 5), meta=meta))
    assert feats.value("cpu_profile_shares") == {"tokenize": 0.5, "forward": 0.5}


def test_slo_checks() -> None:
    feats = compute_features(_tables(_requests([0.01] * 99 + [1.0])), slo={"ttft_p50": 0.02, "ttft_max": 0.5})
    checks = feats.value("slo_checks")
    assert checks["ttft_p50"]["met"] is True
    assert checks["ttft_max"]["met"] is False


def test_segment_numbers() -> None:
    seg = pd.Series(["prompt=512", "concurrency=8", "tp=2 c=4", None, "warm"])
    out = _segment_numbers(seg)
    assert out.loc[0, "prompt"] == 512 and out.loc[1, "conc"] == 8
    assert out.loc[2, "tp"] == 2 and out.loc[2, "conc"] == 4
    assert out.loc[3].isna().all() and out.loc[4].isna().all()


def test_linear_fit() -> None:
    x = np.array([1.0, 2, 3, 4])
    slope, intercept, r2 = _linear_fit(x, 3 * x + 1)
    assert (slope, intercept, r2) == pytest.approx((3, 1, 1))


intervals = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)), min_size=0, max_size=30)


@settings(max_examples=150, deadline=None)
@given(intervals, st.integers(0, 1300), st.integers(0, 1300))
def test_coverage_matches_brute_force(iv: list[tuple[int, int]], a: int, b: int) -> None:
    a, b = min(a, b), max(a, b)
    s = np.array([x for x, _ in iv], dtype="float64")
    e = np.array([x + d for x, d in iv], dtype="float64")
    grid = np.zeros(1300, dtype=bool)
    for x, d in iv:
        grid[x:x + d] = True
    expect = float(grid[a:b].sum())
    cov = _Coverage(s, e)
    assert cov.between(np.array([a]), np.array([b]))[0] == pytest.approx(expect)
    ms, me = _merge_intervals(s, e)
    assert np.all(ms[1:] > me[:-1]) if ms.size > 1 else True
    assert cov.total == pytest.approx(float(grid.sum()))


def test_features_of_a_simulated_capture(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(kv_tokens=3 * 96), [Phase(f"concurrency={c}", 20, 64, 32, conc=c) for c in (1, 2, 4, 8)],
                    Client(net_s=1 * MS))
    feats = compute_features(tables_of(dirs))
    assert feats.value("kv_usage_max") <= 1.0 and feats.value("kv_usage_p95") > 0.9
    assert feats.value("client_server_gap_p50_s") == pytest.approx(2 * MS, rel=0.2)
    assert feats.value("sides_n")["joined"] == 80
    assert feats.value("itl_p50_s") > 0
    assert 0 < feats.value("device_busy_frac") <= 1
    assert feats.get("itl_interference_ratio").source.startswith("engine steps")
    # client only: same TTFTs, no server features, and each says why
    fc = compute_features(tables_of(dirs, ("client",)))
    assert fc.value("client_only") == 1.0
    assert fc.value("ttft_p50_s") == pytest.approx(feats.value("ttft_p50_s"))
    assert "client-only" in fc.get("queue_share_tail").reason
    assert fc.get("itl_interference_ratio").source is None or "black box" in fc.get("itl_interference_ratio").source


def test_window_filters_requests_steps_and_series(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(), [Phase("a", 20, 64, 8, conc=1), Phase("b", 20, 64, 8, conc=1)], Client())
    tables = tables_of(dirs)
    req = tables.requests.sort_values("start_ns")
    cut = int(req["start_ns"].iloc[10])
    feats = compute_features(tables, window_ns=(int(req["start_ns"].min()), cut))
    assert feats.value("requests_n") == 10


# --- engine metrics: the series fallback when no request has a TTFT ---------------------------


def _engine_series(windows: list[dict[str, float]], dt_s: float = 5.0, t0: float = 1000.0, entity: str = "",
                   first: dict[str, float] | None = None) -> pd.DataFrame:
    """Canonical /metrics rows: a first scrape (gauges only) at ``t0``, then one scrape pair per window."""
    rows = [(t0, "prometheus", name, entity, v) for name, v in (first or {stages.SERIES_WAITING: 0.0}).items()]
    for k, w in enumerate(windows, start=1):
        rows += [(t0 + k * dt_s, "prometheus", name, entity, v) for name, v in w.items()]
    return pd.DataFrame(rows, columns=list(stages.SERIES_COLUMNS))


S = stages
QUEUE_WINDOW = {S.SERIES_REQUESTS_PER_S: 2.0, S.SERIES_TTFT_S: 1.0, S.SERIES_QUEUE_TIME_S: 0.8,
                S.SERIES_PREFILL_TIME_S: 0.15, "ttft_s_p50": 0.9, "ttft_s_p95": 2.0, "ttft_s_p99": 2.5,
                "queue_time_s_p95": 1.8, S.SERIES_ITL_S: 0.03, "itl_s_p50": 0.02, "itl_s_p99": 0.1,
                S.SERIES_GENERATION_TOKENS_PER_S: 100.0, S.SERIES_WAITING: 6.0}


def test_series_fallback_without_requests() -> None:
    feats = compute_features(_tables(series=_engine_series([QUEUE_WINDOW] * 4)))
    assert feats.value("series_only") == 1.0
    assert feats.value("metrics_windows_n") == 4
    assert feats.value("requests_n") == pytest.approx(4 * 2.0 * 5.0)  # requests_per_s x window length
    assert feats.get("requests_n").source == "prometheus"
    assert feats.value("ttft_p50_s") == pytest.approx(0.9) and feats.value("ttft_p95_s") == pytest.approx(2.0)
    assert feats.value("ttft_p99_s") == pytest.approx(2.5) and feats.value("ttft_mean_s") == pytest.approx(1.0)
    assert feats.value("queue_share_tail") == pytest.approx(0.8) == feats.value("queue_share_median")
    assert feats.value("prefill_share_tail") == pytest.approx(0.15)
    assert feats.value("stage_shares_tail") == pytest.approx({"queue": 0.8, "prefill": 0.15})
    assert feats.value("unattributed_share_tail") == pytest.approx(0.05)
    assert feats.value("stage_tail_mean_s")["queue"] == pytest.approx(0.8)
    for name in ("ttft_p95_s", "queue_share_tail", "prefill_share_tail", "stage_shares_tail"):
        assert feats.get(name).source == "prometheus", name
    assert feats.value("metrics_queue_time_p95_s") == pytest.approx(1.8)
    assert feats.get("waiting_seqs_p95").source == "prometheus" and feats.value("waiting_seqs_max") == 6
    # stages the metrics do not give keep saying why
    assert not feats.available("tokenize_share_tail") and feats.get("tokenize_share_tail").reason


def test_series_means_are_weighted_by_requests_per_window() -> None:
    a = {S.SERIES_REQUESTS_PER_S: 3.0, S.SERIES_TTFT_S: 1.0, S.SERIES_QUEUE_TIME_S: 0.0}
    b = {S.SERIES_REQUESTS_PER_S: 1.0, S.SERIES_TTFT_S: 3.0, S.SERIES_QUEUE_TIME_S: 2.0}
    feats = compute_features(_tables(series=_engine_series([a, b], dt_s=10.0)))
    assert feats.value("requests_n") == pytest.approx(40)
    assert feats.value("metrics_ttft_mean_s") == pytest.approx((3 * 1.0 + 1 * 3.0) / 4)
    assert feats.value("metrics_queue_time_mean_s") == pytest.approx(0.5)
    assert feats.value("queue_share_tail") == pytest.approx(0.5 / 1.5)
    # without a request count every window weighs the same, and requests_n says why it is unknown
    for w in (a, b):
        del w[S.SERIES_REQUESTS_PER_S]
    feats = compute_features(_tables(series=_engine_series([a, b])))
    assert feats.value("metrics_ttft_mean_s") == pytest.approx(2.0)
    assert not feats.available("requests_n") and "request count" in feats.get("requests_n").reason
    # TTFT derived from means only (no buckets, e.g. TGI): percentiles of the window means
    assert feats.value("ttft_p50_s") == pytest.approx(2.0) and feats.get("ttft_p50_s").source == "prometheus"


def test_requests_with_ttft_keep_preferring_spans() -> None:
    ttft = [0.010] * 95 + [0.100] * 5
    req = _requests(ttft, queue_s=[0.001] * 95 + [0.080] * 5, prefill_s=[0.008] * 95 + [0.015] * 5)
    feats = compute_features(_tables(req, series=_engine_series([QUEUE_WINDOW] * 4)))
    assert feats.value("series_only") == 0.0
    assert feats.value("requests_n") == 100 and feats.get("requests_n").source is None
    assert feats.value("ttft_p50_s") == pytest.approx(0.010) and feats.get("ttft_p50_s").source is None
    assert feats.value("queue_share_tail") == pytest.approx(0.8) and feats.get("queue_share_tail").source is None
    assert feats.value("prefill_share_median") == pytest.approx(0.8)
    # the engine's own numbers are still there, under their own names
    assert feats.value("metrics_queue_share") == pytest.approx(0.8)
    assert feats.value("metrics_requests_n") == pytest.approx(40)


def test_no_series_only_when_all_failed_or_only_one_scrape() -> None:
    req = _requests([np.nan] * 5, error=["http_503"] * 5)
    feats = compute_features(_tables(req, series=_engine_series([QUEUE_WINDOW] * 3)))
    assert feats.value("series_only") == 0.0 and not feats.available("ttft_p95_s")
    first_only = _engine_series([], first={S.SERIES_WAITING: 3.0, S.SERIES_KV_USAGE: 0.5})
    feats = compute_features(_tables(series=first_only))
    assert feats.value("series_only") == 0.0 and feats.value("metrics_windows_n") == 0


def test_itl_falls_back_to_the_engine_series() -> None:
    req = _requests([0.01] * 10)  # requests with TTFT but no token times (e.g. vLLM's llm_request span)
    fast = dict(QUEUE_WINDOW, **{"itl_s_p50": 0.01, S.SERIES_GENERATION_TOKENS_PER_S: 300.0})
    feats = compute_features(_tables(req, series=_engine_series([QUEUE_WINDOW, fast])))
    assert feats.get("itl_p50_s").source == "prometheus"
    assert feats.value("itl_p50_s") == pytest.approx((100 * 0.02 + 300 * 0.01) / 400)  # weighted by tokens
    assert feats.value("itl_p99_s") == pytest.approx(0.1)
    assert not feats.available("itl_p90_s") and "p50/p99" in feats.get("itl_p90_s").reason
    # no histogram percentiles (llama.cpp: Δ generation seconds / Δ tokens): the windowed mean
    means_only = [{S.SERIES_ITL_S: 0.25, S.SERIES_GENERATION_TOKENS_PER_S: 10.0}] * 3
    feats = compute_features(_tables(req, series=_engine_series(means_only)))
    assert feats.value("itl_p50_s") == pytest.approx(0.25)
    assert not feats.available("itl_p99_s")
    # without the series: the old reason
    assert "token emission times" in compute_features(_tables(req)).get("itl_p50_s").reason


def test_itl_from_token_times_wins_over_series(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(), [Phase("a", 20, 64, 8, conc=1)], Client())
    tables = tables_of(dirs)
    base = compute_features(tables)
    tables.series = _engine_series([QUEUE_WINDOW] * 3, t0=1.0)
    feats = compute_features(tables)
    assert feats.get("itl_p50_s").source == base.get("itl_p50_s").source != "prometheus"
    assert feats.value("itl_p50_s") == pytest.approx(base.value("itl_p50_s"))


def test_prefill_busy_from_engine_counters() -> None:
    w1 = {S.SERIES_PREFILL_BUSY: 0.9, S.SERIES_PREFILL_S_PER_TOKEN: 0.002, S.SERIES_PROMPT_TOKENS_PER_S: 450.0,
          S.SERIES_DECODE_BUSY: 0.2}
    w2 = {S.SERIES_PREFILL_BUSY: 0.5, S.SERIES_PREFILL_S_PER_TOKEN: 0.001, S.SERIES_PROMPT_TOKENS_PER_S: 500.0,
          S.SERIES_DECODE_BUSY: 0.4}
    feats = compute_features(_tables(series=_engine_series([w1, w2])))
    assert feats.value("series_only") == 1.0
    assert feats.value("prefill_busy_ratio") == pytest.approx(0.7)
    assert feats.value("decode_busy_ratio") == pytest.approx(0.3)
    # Σ seconds / Σ tokens: weighted by the prompt tokens of each window
    assert feats.value("prefill_s_per_token") == pytest.approx((450 * 0.002 + 500 * 0.001) / 950)
    assert not feats.available("ttft_p95_s") and "no TTFT histogram" in feats.get("ttft_p95_s").reason
    assert "prefill_busy_ratio" in compute_features(_tables()).get("prefill_busy_ratio").reason


def test_busy_seconds_summed_over_slots_count_as_always_busy_not_more() -> None:
    """llama.cpp with --parallel 4: four slots prefilling in one batched forward add 4 s/s, and a
    prompt's seconds land in the window where it finished (3.6 there, 0 around it)."""
    late = [{S.SERIES_PREFILL_BUSY: 0.0, S.SERIES_DECODE_BUSY: 0.2}, {S.SERIES_PREFILL_BUSY: 3.6, S.SERIES_DECODE_BUSY: 0.2},
            {S.SERIES_PREFILL_BUSY: 0.0, S.SERIES_DECODE_BUSY: 0.2}]
    feats = compute_features(_tables(series=_engine_series(late)))
    assert feats.value("prefill_busy_ratio") == pytest.approx(1.0)  # the run's mean 1.2, clipped; not 0.33 per window
    assert "clipped" in feats.get("prefill_busy_ratio").source
    assert feats.value("decode_busy_ratio") == pytest.approx(0.2)
    assert "clipped" not in (feats.get("decode_busy_ratio").source or "")
    spread = [{S.SERIES_PREFILL_BUSY: 0.0}, {S.SERIES_PREFILL_BUSY: 1.5}, {S.SERIES_PREFILL_BUSY: 0.0}]
    assert compute_features(_tables(series=_engine_series(spread))).value("prefill_busy_ratio") == pytest.approx(0.5)
