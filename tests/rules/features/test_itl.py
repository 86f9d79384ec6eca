"""rules.features.itl: inter-token latency from token times, else the engine's series."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from support.featcap import QUEUE_WINDOW, S, engine_series, make_requests, make_tables
from support.simcap import MS, Client, Engine, Phase, poisson, simulate, tables_of

from diag.ground import stages
from diag.ground.capture import load_capture
from diag.ground.tables import build_tables
from rules.features import compute_features


def test_itl_falls_back_to_theengine_series() -> None:
    req = make_requests([0.01] * 10)  # requests with TTFT but no token times (e.g. vLLM's llm_request span)
    fast = dict(QUEUE_WINDOW, **{"itl_s_p50": 0.01, S.SERIES_GENERATION_TOKENS_PER_S: 300.0})
    feats = compute_features(make_tables(req, series=engine_series([QUEUE_WINDOW, fast])))
    assert feats.get("itl_p50_s").source == "prometheus"
    assert feats.value("itl_p50_s") == pytest.approx((100 * 0.02 + 300 * 0.01) / 400)  # weighted by tokens
    assert feats.value("itl_p99_s") == pytest.approx(0.1)
    assert not feats.available("itl_p90_s") and "p50/p99" in feats.get("itl_p90_s").reason
    # no histogram percentiles (llama.cpp: Δ generation seconds / Δ tokens): the windowed mean
    means_only = [{S.SERIES_ITL_S: 0.25, S.SERIES_GENERATION_TOKENS_PER_S: 10.0}] * 3
    feats = compute_features(make_tables(req, series=engine_series(means_only)))
    assert feats.value("itl_p50_s") == pytest.approx(0.25)
    assert not feats.available("itl_p99_s")
    # without the series: the old reason
    assert "token emission times" in compute_features(make_tables(req)).get("itl_p50_s").reason


def test_itl_from_token_times_wins_over_series(tmp_path: Path) -> None:
    dirs = simulate(tmp_path, Engine(), [Phase("a", 20, 64, 8, conc=1)], Client())
    tables = tables_of(dirs)
    base = compute_features(tables)
    tables.series = engine_series([QUEUE_WINDOW] * 3, t0=1.0)
    feats = compute_features(tables)
    assert feats.get("itl_p50_s").source == base.get("itl_p50_s").source != "prometheus"
    assert feats.value("itl_p50_s") == pytest.approx(base.value("itl_p50_s"))


def _streams(stall_ms: dict[int, float], pause_at_ms: float | None = None, n: int = 6) -> dict:
    """``n`` streams of 40 tokens, 5 ms apart, started together (1 ms apart): server spans with token
    times. ``stall_ms``: stream -> a gap that long after its 20th token (the others go on);
    ``pause_at_ms``: every stream stops for 150 ms at that time (the whole engine paused)."""
    req = make_requests([0.01] * n, start_ns=[1.7e18 + i * 1e6 for i in range(n)])
    rows = []
    for i, (tid, start) in enumerate(zip(req["trace_id"], req["start_ns"])):
        times, t = [], start + 0.01 * 1e9
        for k in range(40):
            times.append(int(t))
            t += 5e6 + (stall_ms.get(i, 0.0) * 1e6 if k == 19 else 0.0)
            if pause_at_ms is not None and times[-1] < 1.7e18 + pause_at_ms * 1e6 <= t:
                t += 150e6
        rows.append({"trace_id": tid, "span_id": f"{i:016x}", "name": stages.SPAN_REQUEST, "start_ns": start,
                     "end_ns": times[-1], stages.ATTR_TOKEN_TIMES_NS: times})
    tables = make_tables(req)
    tables.spans = pd.DataFrame(rows)
    return tables


def test_a_stream_stopped_while_the_others_went_on_is_a_stall_a_paused_engine_is_not() -> None:
    """Preemption as the client sees it: two of six streams stop for 30 decode steps mid-answer while
    the other four keep streaming (feature ``stream_stall_frac``); the same gap in every stream at
    once is the engine pausing (a long prefill, a collection), not an eviction."""
    feats = compute_features(_streams({0: 150.0, 3: 150.0}))
    assert feats.value("stream_stall_frac") == pytest.approx(2 / 6)
    assert feats.value("stream_stall_steps_p50") == pytest.approx(31.0, rel=0.05)
    assert feats.value("stream_stall_n") == 6
    paused = compute_features(_streams({}, pause_at_ms=110.0))
    assert paused.value("itl_max_s") >= 0.15  # every stream did stop
    assert paused.value("stream_stall_frac") == 0.0 and not paused.available("stream_stall_steps_p50")
    # a gap under [features] stall_steps_min (20 decode steps) is jitter, not a stall
    assert compute_features(_streams({0: 60.0})).value("stream_stall_frac") == 0.0


def test_client_stalls_end_at_the_first_token_of_the_prompt_that_caused_them(tmp_path: Path) -> None:
    # a long prompt among short streams (prefill-first): each stall ends one step after its first token
    mix = simulate(tmp_path / "mix", Engine(prefill_s_per_token=0.1 * MS),
                   [Phase("mix", 60, [2048, 32, 32, 32], 64, conc=None, arrivals_s=poisson(60, 8))], Client())
    f = compute_features(tables_of(mix, ("client",)))
    n, frac, chance = (f.value(k) for k in ("itl_stall_gaps_n", "itl_stall_end_first_token_frac",
                                             "itl_stall_end_first_token_chance"))
    assert n >= 10 and frac >= 0.8 and frac - chance >= 0.25, (n, frac, chance)
    # the server's prefill windows known: judged from them, not from the client's first tokens
    g = compute_features(tables_of(mix))
    assert not g.available("itl_stall_end_first_token_frac")
    # real bundled-engine captures whose streams stall for other reasons: preempted for KV blocks, or
    # decoding through a long prompt's chunks; their stalls end at no first token in particular
    samples = Path(__file__).resolve().parents[3] / "samples"
    for name in ("kv_cache", "head_of_line"):
        h = compute_features(build_tables(load_capture(samples / name / "client")))
        assert h.value("itl_stall_gaps_n") >= 10, name
        assert h.value("itl_stall_end_first_token_frac") - h.value("itl_stall_end_first_token_chance") < 0.25, name
