"""Prometheus scraper and per-engine adapters: fixtures of each engine, two scrapes 5 s apart."""

from __future__ import annotations

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from collectors import prometheus_adapters as pa
from collectors.base import SeriesCollector
from collectors.prometheus import (
    ExpositionError,
    PrometheusScraper,
    adapt_texts,
    parse_exposition,
)
from diag.ground import stages
from diag.ground.external import llamacpp, tgi, trtllm, vllm
from support.engine_testutil import free_port

FIX = Path(__file__).parent / "fixtures"
T0, T5 = 1_700_000_000.0, 1_700_000_005.0


def texts(name: str) -> list[tuple[float, str]]:
    return [(T0, (FIX / f"{name}.t0.prom").read_text()), (T5, (FIX / f"{name}.t5.prom").read_text())]


def window(name: str, engine: str | None = None) -> dict[tuple[str, str], float]:
    df = adapt_texts(texts(name), engine=engine)
    assert list(df.columns) == list(stages.SERIES_COLUMNS)
    assert set(df["source"]) == {"prometheus"}
    last = df[df["ts_s"] == T5]
    return {(r.series, r.entity): r.value for r in last.itertuples()}


# --- detection --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("fixture", "engine"),
    [("vllm", "vllm"), ("vllm_legacy", "vllm"), ("bundled", "bundled"), ("sglang", "sglang"), ("tgi", "tgi"),
     ("llamacpp", "llamacpp"), ("trtllm", "trtllm"), ("triton", "triton")],
)
def test_detect_engine_from_names(fixture, engine):
    snap = parse_exposition((FIX / f"{fixture}.t5.prom").read_text(), T5)
    assert pa.detect_engine(snap.names()) == engine


def test_detect_engine_unknown_and_mixed():
    assert pa.detect_engine(["python_gc_objects_collected_total", "process_cpu_seconds_total"]) is None
    assert pa.detect_engines(["vllm:a", "vllm:b", "nv_gpu_utilization", "dynamo_frontend_x"]) == ["vllm", "dynamo"]
    assert pa.detect_engines(["sglang:a", "vllm:b", "sglang:c"]) == ["sglang", "vllm"]


# --- each mapping -----------------------------------------------------------------------------

S = stages
VLLM_EXPECTED = {
    S.SERIES_QUEUE_TIME_S: 0.05, S.SERIES_PREFILL_TIME_S: 0.12, S.SERIES_DECODE_TIME_S: 2.0,
    S.SERIES_TTFT_S: 0.28, S.SERIES_ITL_S: 0.02, S.SERIES_E2E_S: 2.3, S.SERIES_KV_USAGE: 0.42,
    S.SERIES_WAITING: 3, S.SERIES_RUNNING: 8, S.SERIES_PREEMPTIONS: 5, pa.SERIES_PREEMPTIONS_PER_S: 0.6,
    S.SERIES_PROMPT_TOKENS_PER_S: 1000, S.SERIES_GENERATION_TOKENS_PER_S: 200,
    S.SERIES_REQUESTS_PER_S: 10 / 5,  # 10 TTFT observations in the 5 s window
    # windowed percentiles from bucket deltas: 8 obs in (0.1, 0.25], 2 in (0.5, 0.75]
    "ttft_s_p50": 0.1 + 0.15 * 5 / 8, "ttft_s_p95": 0.5 + 0.25 * 1.5 / 2, "ttft_s_p99": 0.5 + 0.25 * 1.9 / 2,
}
EXPECTED: dict[str, dict[str, float]] = {
    "vllm": VLLM_EXPECTED,
    "vllm_legacy": VLLM_EXPECTED,
    "bundled": VLLM_EXPECTED,
    "sglang": {
        S.SERIES_QUEUE_TIME_S: 0.08, S.SERIES_PREFILL_TIME_S: 0.15, S.SERIES_TTFT_S: 0.3, S.SERIES_ITL_S: 0.015,
        S.SERIES_E2E_S: 3.3, S.SERIES_DECODE_TIME_S: 3.0, S.SERIES_KV_USAGE: 0.65, S.SERIES_WAITING: 12,
        S.SERIES_RUNNING: 30, S.SERIES_PREEMPTIONS: 4, S.SERIES_PROMPT_TOKENS_PER_S: 4000,
        S.SERIES_GENERATION_TOKENS_PER_S: 600, S.SERIES_REQUESTS_PER_S: 2.0,
    },
    "tgi": {
        S.SERIES_QUEUE_TIME_S: 0.05, S.SERIES_PREFILL_TIME_S: 0.1, S.SERIES_DECODE_TIME_S: 2.0,
        S.SERIES_TTFT_S: 0.002 + 0.05 + 0.1, S.SERIES_ITL_S: 0.02, S.SERIES_E2E_S: 2.2, S.SERIES_KV_USAGE: 0.3,
        S.SERIES_WAITING: 4, S.SERIES_RUNNING: 16, S.SERIES_PROMPT_TOKENS_PER_S: 1000,
        S.SERIES_GENERATION_TOKENS_PER_S: 200, S.SERIES_REQUESTS_PER_S: 2.0,
        # Δ seconds in prefill / decode batch steps over the 5 s window
        S.SERIES_PREFILL_BUSY: 1.0 / 5, S.SERIES_DECODE_BUSY: 10.0 / 5,
    },
    "llamacpp": {
        S.SERIES_ITL_S: 0.02, S.SERIES_WAITING: 5, S.SERIES_RUNNING: 2, S.SERIES_PROMPT_TOKENS_PER_S: 1000,
        S.SERIES_GENERATION_TOKENS_PER_S: 200,
        # prompt seconds 1 -> 6 and prompt tokens 1000 -> 6000 over 5 s; generation seconds 4 -> 24
        S.SERIES_PREFILL_BUSY: 5.0 / 5, S.SERIES_PREFILL_S_PER_TOKEN: 5.0 / 5000, S.SERIES_DECODE_BUSY: 20.0 / 5,
    },
    "trtllm": {
        S.SERIES_QUEUE_TIME_S: 0.01, S.SERIES_PREFILL_TIME_S: 0.07, S.SERIES_DECODE_TIME_S: 1.5,
        S.SERIES_TTFT_S: 0.09, S.SERIES_ITL_S: 0.012, S.SERIES_E2E_S: 1.6, S.SERIES_KV_USAGE: 0.55,
        S.SERIES_WAITING: 2, S.SERIES_RUNNING: 6, pa.SERIES_PAUSED: 1, S.SERIES_PROMPT_TOKENS_PER_S: 500,
        S.SERIES_GENERATION_TOKENS_PER_S: 300, S.SERIES_REQUESTS_PER_S: 2.0,
    },
}


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_engine_mapping(fixture):
    got = window(fixture)
    for series, value in EXPECTED[fixture].items():
        assert got.get((series, "")) == pytest.approx(value, rel=1e-9), series


def test_triton_per_model_entities():
    got = window("triton")
    # Δ cumulative µs / Δ successful requests, kept apart per model
    assert got[(S.SERIES_QUEUE_TIME_S, "model=tensorrt_llm")] == pytest.approx(0.05)
    assert got[(S.SERIES_QUEUE_TIME_S, "model=ensemble")] == pytest.approx(1e-4)
    assert got[(S.SERIES_E2E_S, "model=tensorrt_llm")] == pytest.approx(2.0)
    assert got[(S.SERIES_KV_USAGE, "")] == pytest.approx(3120 / 6240)
    assert got[(S.SERIES_WAITING, "")] == 3  # request_type="waiting" wins over pending_request_count
    assert got[(S.SERIES_RUNNING, "")] == 7
    assert got[(pa.SERIES_PAUSED, "")] == 0


def test_renamed_vllm_metrics_new_name_wins():
    legacy = (FIX / "vllm_legacy.t5.prom").read_text()
    assert "vllm:gpu_cache_usage_perc" in legacy and "vllm:kv_cache_usage_perc" not in legacy
    assert "vllm:time_per_output_token_seconds_bucket" in legacy
    both = legacy + "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.9\n"
    df = adapt_texts([(T5, both)])
    assert df.loc[df["series"] == S.SERIES_KV_USAGE, "value"].tolist() == [0.9]


def test_first_scrape_has_gauges_only():
    df = adapt_texts(texts("vllm")[:1])
    assert set(df["series"]) == {S.SERIES_KV_USAGE, S.SERIES_WAITING, S.SERIES_RUNNING, S.SERIES_PREEMPTIONS}


# --- rates, resets and windowed percentiles -----------------------------------------------------


def test_counter_reset_and_new_label_sets():
    a = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine=\"0\"} 1000\n"
    b = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine=\"0\"} 300\n"  # restarted
    df = adapt_texts([(0.0, a), (2.0, b)])
    assert df.loc[df["series"] == S.SERIES_PROMPT_TOKENS_PER_S, "value"].tolist() == [150.0]
    # a histogram whose first observation came after the previous scrape counts from zero
    h = ("# TYPE vllm:time_to_first_token_seconds histogram\n"
         'vllm:time_to_first_token_seconds_bucket{le="0.5"} 3\nvllm:time_to_first_token_seconds_bucket{le="+Inf"} 4\n'
         "vllm:time_to_first_token_seconds_sum 2.0\nvllm:time_to_first_token_seconds_count 4\n")
    df = adapt_texts([(0.0, a), (1.0, a + h)])
    assert df.loc[df["series"] == S.SERIES_TTFT_S, "value"].tolist() == [0.5]
    assert df.loc[df["series"] == "ttft_s_p99", "value"].tolist() == [0.5]  # rank in +Inf -> highest finite bound


def test_tgi_counters_without_total_suffix():
    """metrics-exporter-prometheus writes counters without _total; the parser adds it."""
    snap = parse_exposition((FIX / "tgi.t5.prom").read_text(), T5)
    assert snap.get("tgi_request_count") and snap.get("tgi_request_count_total")


def test_bucket_quantile():
    b = [(0.1, 0.0), (0.25, 8.0), (0.5, 8.0), (0.75, 10.0), (float("inf"), 10.0)]
    assert pa.bucket_quantile(0.5, b) == pytest.approx(0.19375)
    assert pa.bucket_quantile(0.0, b) == pytest.approx(0.1)
    assert pa.bucket_quantile(1.0, b) == pytest.approx(0.75)
    assert pa.bucket_quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) != pa.bucket_quantile(0.5, b)  # NaN: empty
    assert pa.bucket_quantile(0.9, [(1.0, 1.0), (float("inf"), 10.0)]) == 1.0
    assert pa.bucket_quantile(0.5, []) != 0.0
    assert pa.percentile_series("ttft_s", 0.99) == "ttft_s_p99"
    assert pa.percentile_series("itl_s", 0.999) == "itl_s_p99_9"


def test_entities_kept_apart_only_when_they_differ():
    two = ("# TYPE vllm:num_requests_waiting gauge\n"
           'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
           'vllm:num_requests_waiting{engine="1",model_name="m"} 5\n')
    df = adapt_texts([(0.0, two)], entity="replica-a")
    got = dict(zip(df["entity"], df["value"]))
    assert got == {"replica-a/engine=0": 2.0, "replica-a/engine=1": 5.0}
    one = '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
    assert adapt_texts([(0.0, one)])["entity"].tolist() == [""]


# --- malformed text, dead endpoint, the background thread --------------------------------------------


def test_malformed_exposition_one_line_error():
    bad = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\" 2\nok 1\n"
    with pytest.raises(ExpositionError) as ei:
        parse_exposition(bad)
    msg = str(ei.value)
    assert "\n" not in msg and "line 2" in msg


def test_scraper_survives_malformed_text_and_keeps_the_window():
    t0, t5 = (t for _, t in texts("vllm"))
    answers = iter([t0, "vllm:num_requests_waiting{{{ nonsense\n", t5])
    s = PrometheusScraper("http://fake/metrics", fetch=lambda url, timeout: next(answers))
    assert s.scrape_once(now_s=T0)
    assert s.scrape_once(now_s=T0 + 2.5) == []
    assert s.errors == 1 and "malformed" in s.last_error and "\n" not in s.last_error
    rows = s.scrape_once(now_s=T5)
    got = {(r[1], r[2]): r[3] for r in rows}
    assert got[(S.SERIES_PROMPT_TOKENS_PER_S, "")] == pytest.approx(1000)  # t0 -> t5 after the bad one
    assert s.stats()["engine"] == "vllm" and s.consecutive_errors == 0


def test_dead_endpoint_is_counted_not_raised():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    s = PrometheusScraper(url, interval_s=0.02, timeout_s=0.5)
    assert s.scrape_once() == []
    assert s.errors == 1 and "unreachable" in s.last_error
    s.start()
    time.sleep(0.15)
    s.stop()
    assert s.errors >= 3 and len(s.collect()) == 0
    assert s.stats()["consecutive_errors"] == s.errors


def test_unknown_exposition_is_an_error():
    s = PrometheusScraper("http://fake/metrics", fetch=lambda u, t: "process_cpu_seconds_total 1.5\n")
    assert s.scrape_once() == [] and "no known engine" in s.last_error


class _MetricsServer:
    """A local /metrics endpoint that serves t0 then t5 (then t5 again)."""

    def __init__(self, name: str) -> None:
        bodies = [t.encode() for _, t in texts(name)]
        self.hits = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                body = bodies[min(outer.hits, 1)]
                outer.hits += 1
                if self.path != "/metrics":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_scraper_thread_against_http_endpoint():
    srv = _MetricsServer("sglang")
    try:
        s = PrometheusScraper(srv.url, interval_s=0.05, timeout_s=1.0)
        s.start()
        deadline = time.time() + 3
        while time.time() < deadline and not (s.collect()["series"] == S.SERIES_TTFT_S).any():
            time.sleep(0.02)
        s.stop()
        df = s.collect()
        assert s.engine == "sglang" and s.errors == 0
        assert (df["series"] == S.SERIES_TTFT_S).any() and (df["series"] == S.SERIES_KV_USAGE).any()
        assert df["ts_s"].is_monotonic_increasing
        bad = PrometheusScraper(srv.url.replace("/metrics", "/nope"))
        assert bad.scrape_once() == [] and "HTTP 404" in bad.last_error
    finally:
        srv.close()


def test_scraper_is_a_series_collector_start_collect_stop():
    srv = _MetricsServer("vllm")
    try:
        s = PrometheusScraper(srv.url, interval_s=0.05, timeout_s=1.0)
        assert isinstance(s, SeriesCollector)
        assert s.collect().empty and tuple(s.collect().columns) == S.SERIES_COLUMNS
        s.start()
        deadline = time.time() + 3
        while time.time() < deadline and srv.hits < 3:
            time.sleep(0.02)
        during = s.collect()  # while the thread scrapes
        s.stop()
        s.stop()  # idempotent
        df = s.collect()
        assert s.engine == "vllm" and s.errors == 0 and len(during) > 0
        assert tuple(df.columns) == S.SERIES_COLUMNS and set(df.source) == {"prometheus"}
        assert df.iloc[: len(during)].equals(during) and s.collect().equals(df)  # every row so far
    finally:
        srv.close()


def test_scrape_command_writes_capture(tmp_path):
    from diag.ground.capture import load_capture
    from diag.cli.commands import scrape

    srv = _MetricsServer("vllm")
    try:
        parser = argparse.ArgumentParser()
        scrape.add_parser(parser.add_subparsers())
        args = parser.parse_args(["scrape", srv.url, "--interval", "0.05", "--duration", "0.4", "-o", str(tmp_path / "c")])
        assert scrape.run(args) == 0
    finally:
        srv.close()
    cap = load_capture(tmp_path / "c")
    assert set(cap.series["source"]) == {"prometheus"}
    assert (cap.series["series"] == S.SERIES_TTFT_S).any()
    assert cap.meta["prometheus_scrape"]["engine"] == "vllm"
    # a dead endpoint: exit 2 (nothing to judge) and a note in meta, no traceback
    args = parser.parse_args(["scrape", f"http://127.0.0.1:{free_port()}/metrics", "--interval", "0.05",
                              "--duration", "0.15", "-o", str(tmp_path / "d")])
    assert scrape.run(args) == 2


# --- PromQL and the Prometheus HTTP API --------------------------------------------------------


def test_promql_built_from_the_tables():
    q = pa.promql_queries(vllm.METRICS, window="30s")
    assert q[S.SERIES_QUEUE_TIME_S] == (
        "sum by (instance) (rate(vllm:request_queue_time_seconds_sum[30s])) / "
        "sum by (instance) (rate(vllm:request_queue_time_seconds_count[30s]))"
    )
    assert q["ttft_s_p99"] == (
        "histogram_quantile(0.99, sum by (instance, le) (rate(vllm:time_to_first_token_seconds_bucket[30s])))"
    )
    assert q[S.SERIES_KV_USAGE] == "(sum by (instance) (vllm:kv_cache_usage_perc)) or (sum by (instance) (vllm:gpu_cache_usage_perc))"
    assert q[S.SERIES_PROMPT_TOKENS_PER_S] == "sum by (instance) (rate(vllm:prompt_tokens_total[30s]))"
    assert "vllm:time_per_output_token_seconds_bucket" in q["itl_s_p50"]
    t = pa.promql_queries(trtllm.TRITON_METRICS)
    assert t[S.SERIES_QUEUE_TIME_S] == (
        "(sum by (instance) (rate(nv_inference_queue_duration_us[30s])) / "
        "sum by (instance) (rate(nv_inference_request_success[30s]))) * 1e-06"
    )
    assert 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used"}' in t[S.SERIES_KV_USAGE]
    g = pa.promql_queries(tgi.METRICS)
    assert g[S.SERIES_DECODE_TIME_S].startswith("(sum by (instance) (rate(tgi_request_inference_duration_sum[30s]))")
    assert ' - (' in g[S.SERIES_DECODE_TIME_S]
    assert "tgi_request_count" not in " ".join(g.values())
    assert q[S.SERIES_REQUESTS_PER_S] == "sum by (instance) (rate(vllm:time_to_first_token_seconds_count[30s]))"
    lc = pa.promql_queries(llamacpp.METRICS)
    assert lc[S.SERIES_PREFILL_BUSY] == "sum by (instance) (rate(llamacpp:prompt_seconds_total[30s]))"
    assert lc[S.SERIES_PREFILL_S_PER_TOKEN] == (
        "sum by (instance) (rate(llamacpp:prompt_seconds_total[30s])) / "
        "sum by (instance) (rate(llamacpp:prompt_tokens_total[30s]))"
    )
    assert g[S.SERIES_PREFILL_BUSY] == 'sum by (instance) (rate(tgi_batch_inference_duration_sum{method="prefill"}[30s]))'
    # every engine's table renders
    for adapter in pa.ADAPTERS:
        assert all(pa.promql_queries(adapter).values())
