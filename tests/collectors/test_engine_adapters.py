"""Engine semantics read from their source (docs/engines.md): the new cache and prompt-work
signals, per-rank gauges combined by max, SGLang's frozen gauges, trtllm before 1.2 and its
/prometheus/metrics path, and the Dynamo front end vs worker split.

Expositions are rendered by ``prometheus_client`` (the exporter vLLM, SGLang and trtllm-serve
use) and parsed by its parser, two or three scrapes 5 s apart."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import import_module

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from collectors import prometheus_adapters as pa
from collectors.prometheus import PrometheusScraper, adapt_texts, metrics_url, parse_exposition
from diag.ground import stages as S
from diag.ground.external import ENGINES, llamacpp, sglang

T0 = 1_700_000_000.0


def _text(reg: CollectorRegistry) -> str:
    return generate_latest(reg).decode()


def _window(scrapes: list[str], engine: str | None = None) -> dict[tuple[str, str, float], float]:
    df = adapt_texts([(T0 + 5 * i, t) for i, t in enumerate(scrapes)], engine=engine)
    return {(r.series, r.entity, r.ts_s): r.value for r in df.itertuples()}


def _at(rows: dict[tuple[str, str, float], float], series: str, k: int, entity: str = "") -> float | None:
    return rows.get((series, entity, T0 + 5 * k))


# --- vLLM: prompt work, caches, why requests wait --------------------------------------------------


def _vllm_scrapes() -> list[str]:
    reg = CollectorRegistry()
    lab = ("model_name", "engine")
    lv = ("m", "0")
    by_source = Counter("vllm:prompt_tokens_by_source", "", lab + ("source",), registry=reg)
    cached = Counter("vllm:prompt_tokens_cached", "", lab, registry=reg)
    q = Counter("vllm:prefix_cache_queries", "", lab, registry=reg)
    h = Counter("vllm:prefix_cache_hits", "", lab, registry=reg)
    reason = Gauge("vllm:num_requests_waiting_by_reason", "", lab + ("reason",), registry=reg)
    it = Histogram("vllm:iteration_tokens_total", "", lab, buckets=[1, 8, 16, 32, 64, 128, 256, 512], registry=reg)
    kvc = Histogram("vllm:request_prefill_kv_computed_tokens", "", lab, buckets=[10, 100, 1000, 10000], registry=reg)
    for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        by_source.labels(*lv, src)
    cached.labels(*lv), q.labels(*lv), h.labels(*lv)
    out = [_text(reg)]
    # 5 s: 3000 prompt tokens computed, 6000 from the local cache, 1000 transferred
    by_source.labels(*lv, "local_compute").inc(3000)
    by_source.labels(*lv, "local_cache_hit").inc(6000)
    by_source.labels(*lv, "external_kv_transfer").inc(1000)
    cached.labels(*lv).inc(7000)
    q.labels(*lv).inc(20000)  # looked up more than once while waiting
    h.labels(*lv).inc(8000)
    reason.labels(*lv, "capacity").set(4)
    reason.labels(*lv, "deferred").set(1)
    for n in (100, 300):
        it.labels(*lv).observe(n)
    for n in (1000, 2000):
        kvc.labels(*lv).observe(n)
    out.append(_text(reg))
    return out


def test_vllm_prompt_work_and_cache_signals():
    rows = _window(_vllm_scrapes())
    assert _at(rows, S.SERIES_PROMPT_TOKENS_COMPUTED_PER_S, 1) == pytest.approx(3000 / 5)
    assert _at(rows, S.SERIES_PROMPT_TOKENS_CACHED_PER_S, 1) == pytest.approx(7000 / 5)  # local + external
    assert _at(rows, S.SERIES_PROMPT_TOKENS_TRANSFERRED_PER_S, 1) == pytest.approx(1000 / 5)
    # by source wins over prefix_cache_* (which counts a waiting request's lookups again)
    assert _at(rows, S.SERIES_PREFIX_CACHE_HIT_RATIO, 1) == pytest.approx(6000 / 10000)
    assert _at(rows, S.SERIES_WAITING_CAPACITY, 1) == 4 and _at(rows, S.SERIES_WAITING_DEFERRED, 1) == 1
    assert _at(rows, S.SERIES_ITERATION_TOKENS, 1) == pytest.approx(200)
    assert _at(rows, S.SERIES_PREFILL_COMPUTED_TOKENS, 1) == pytest.approx(1500)


def test_vllm_hit_ratio_falls_back_to_prefix_cache_tokens():
    scrapes = [t.replace("vllm:prompt_tokens_by_source", "vllm:x_by_source") for t in _vllm_scrapes()]
    rows = _window(scrapes)
    assert _at(rows, S.SERIES_PREFIX_CACHE_HIT_RATIO, 1) == pytest.approx(8000 / 20000)
    assert _at(rows, S.SERIES_PROMPT_TOKENS_COMPUTED_PER_S, 1) is None  # no by-source family: not guessed


# --- SGLang: ranks and frozen gauges ---------------------------------------------------------------

RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")


def _sglang_registry(dp: tuple[str, ...] = ("0",), tp: tuple[str, ...] = ("0", "1")):
    reg = CollectorRegistry()
    lab = ("model_name", "dp_rank") + RANKS
    g = {n: Gauge(f"sglang:{n}", "", lab, registry=reg) for n in ("token_usage", "num_queue_reqs", "num_running_reqs")}
    rt = Counter("sglang:realtime_tokens", "", lab + ("mode",), registry=reg)
    ret = Counter("sglang:num_retracted_requests", "", lab, registry=reg)
    gen = Counter("sglang:generation_tokens", "", ("model_name",), registry=reg)
    gen.labels("m")
    keys = [("m", d, t, "0", "0") for d in dp for t in tp]
    for k in keys:
        for mode in ("prefill_compute", "prefill_cache", "decode"):
            rt.labels(*k, mode)
        ret.labels(*k)
    return reg, g, rt, ret, gen, keys


def test_sglang_per_rank_gauges_take_the_max_not_the_sum():
    reg, g, rt, ret, gen, keys = _sglang_registry()
    for k in keys:  # every TP rank of one scheduler reports the same pool and queue
        g["token_usage"].labels(*k).set(0.6)
        g["num_queue_reqs"].labels(*k).set(7)
        ret.labels(*k).inc(3)
    first = _text(reg)
    for k in keys:
        rt.labels(*k, "prefill_compute").inc(400)
        rt.labels(*k, "prefill_cache").inc(100)
        ret.labels(*k).inc(2)
    rows = _window([first, _text(reg)])
    assert _at(rows, S.SERIES_KV_USAGE, 1) == pytest.approx(0.6)  # the sum would be 1.2
    assert _at(rows, S.SERIES_WAITING, 1) == 7
    assert _at(rows, S.SERIES_PREEMPTIONS, 1) == 5
    assert _at(rows, S.SERIES_PROMPT_TOKENS_COMPUTED_PER_S, 1) == pytest.approx(400 / 5)
    assert _at(rows, S.SERIES_PREFIX_CACHE_HIT_RATIO, 1) == pytest.approx(100 / 500)
    queries = pa.promql_queries(sglang.METRICS)
    assert queries[S.SERIES_KV_USAGE] == ("max by (instance) (sum by (instance, tp_rank, pp_rank, moe_ep_rank) "
                                          "(sglang:token_usage))")


def test_sglang_data_parallel_ranks_stay_apart():
    reg, g, *_rest, keys = _sglang_registry(dp=("0", "1"), tp=("0",))
    g["token_usage"].labels(*keys[0]).set(0.3)
    g["token_usage"].labels(*keys[1]).set(0.8)
    rows = _window([_text(reg)])
    assert _at(rows, S.SERIES_KV_USAGE, 0, "dp_rank=0") == pytest.approx(0.3)
    assert _at(rows, S.SERIES_KV_USAGE, 0, "dp_rank=1") == pytest.approx(0.8)


def test_sglang_frozen_gauges_are_stale_not_zero():
    reg, g, rt, ret, gen, keys = _sglang_registry(tp=("0",))
    k = keys[0]
    g["num_running_reqs"].labels(*k).set(5)
    g["token_usage"].labels(*k).set(0.4)
    scrapes = [_text(reg)]
    rt.labels(*k, "decode").inc(500)  # working: tokens advance, gauges set at the log interval
    gen.labels("m").inc(500)
    g["num_running_reqs"].labels(*k).set(3)
    scrapes.append(_text(reg))
    scrapes.append(_text(reg))  # idle: nothing advanced, the gauges kept their last values
    rows = _window(scrapes)
    assert _at(rows, S.SERIES_GAUGES_STALE, 1) == 0.0 and _at(rows, S.SERIES_RUNNING, 1) == 3
    assert _at(rows, S.SERIES_GAUGES_STALE, 2) == 1.0
    assert _at(rows, S.SERIES_RUNNING, 2) is None and _at(rows, S.SERIES_KV_USAGE, 2) is None
    g["num_running_reqs"].labels(*k).set(0)  # a gauge that moved is fresh even without tokens
    rows = _window(scrapes + [_text(reg)])
    assert _at(rows, S.SERIES_GAUGES_STALE, 3) == 0.0 and _at(rows, S.SERIES_RUNNING, 3) == 0


# --- llama.cpp -------------------------------------------------------------------------------------


def _llamacpp(prompt: float, cached: float, busy: float, deferred: int) -> str:
    lines = []
    for name, typ, v in (("prompt_tokens_total", "counter", prompt), ("prompt_tokens_cached_total", "counter", cached),
                         ("n_busy_slots_per_decode", "counter", busy), ("requests_deferred", "gauge", deferred)):
        lines += [f"# HELP llamacpp:{name} x", f"# TYPE llamacpp:{name} {typ}", f"llamacpp:{name} {v:g}"]
    return "\n".join(lines) + "\n"


def test_llamacpp_cached_prompt_tokens_and_busy_slots():
    rows = _window([_llamacpp(1000, 0, 1.0, 0), _llamacpp(2000, 4000, 2.5, 3)])
    assert _at(rows, S.SERIES_PROMPT_TOKENS_CACHED_PER_S, 1) == pytest.approx(4000 / 5)
    assert _at(rows, S.SERIES_PREFIX_CACHE_HIT_RATIO, 1) == pytest.approx(4000 / 5000)
    assert _at(rows, S.SERIES_BUSY_SLOTS_PER_DECODE, 1) == pytest.approx(2.5)  # an average, not a rate
    assert _at(rows, S.SERIES_WAITING, 1) == 3
    waiting = next(m for m in llamacpp.METRICS.maps if m.series == S.SERIES_WAITING)
    assert "HTTP thread pool" in waiting.note  # the blind spot is said where the series is made


# --- TensorRT-LLM ----------------------------------------------------------------------------------


def _trtllm_old_scrapes() -> list[str]:
    """trtllm-serve before 1.2: five metrics, no prefix (tensorrt_llm/metrics/collector.py @89fd9b74)."""
    reg = CollectorRegistry()
    lab = ("model_name", "engine_type")
    lv = ("undefined", "undefined")
    succ = Counter("request_success", "", lab + ("finished_reason",), registry=reg)
    hs = {n: Histogram(n, "", lab, buckets=[0.01, 0.1, 1.0, 10.0], registry=reg)
          for n in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "time_per_output_token_seconds",
                    "request_queue_time_seconds")}
    succ.labels(*lv, "stop")
    out = [_text(reg)]
    for v in (0.2, 0.4):
        hs["time_to_first_token_seconds"].labels(*lv).observe(v)
        hs["request_queue_time_seconds"].labels(*lv).observe(v / 4)
        hs["e2e_request_latency_seconds"].labels(*lv).observe(v * 10)
        hs["time_per_output_token_seconds"].labels(*lv).observe(0.02)
        succ.labels(*lv, "stop").inc()
    out.append(_text(reg))
    return out


def test_trtllm_before_1_2_unprefixed_names_are_read():
    old = _trtllm_old_scrapes()
    assert pa.detect_engine(parse_exposition(old[1], T0).names()) == "trtllm"
    rows = _window(old)
    assert _at(rows, S.SERIES_TTFT_S, 1) == pytest.approx(0.3)
    assert _at(rows, S.SERIES_QUEUE_TIME_S, 1) == pytest.approx(0.075)
    assert _at(rows, S.SERIES_E2E_S, 1) == pytest.approx(3.0)
    assert _at(rows, S.SERIES_ITL_S, 1) == pytest.approx(0.02)
    assert _at(rows, S.SERIES_REQUESTS_PER_S, 1) == pytest.approx(2 / 5)


def test_trtllm_cache_hit_rate_and_cached_tokens():
    reg = CollectorRegistry()
    hit = Gauge("trtllm_kv_cache_hit_rate", "", registry=reg)
    cached = Counter("trtllm_prompt_cached_tokens", "", registry=reg)
    first = _text(reg)
    hit.set(0.75)
    cached.inc(2500)
    rows = _window([first, _text(reg)])
    assert _at(rows, S.SERIES_PREFIX_CACHE_HIT_RATIO, 1) == pytest.approx(0.75)
    assert _at(rows, S.SERIES_PROMPT_TOKENS_CACHED_PER_S, 1) == pytest.approx(500)


class _TrtllmServe:
    """A local server shaped like trtllm-serve: JSON iteration stats at /metrics, Prometheus text
    at /prometheus/metrics (only when ``prometheus`` is True, as with return_perf_metrics)."""

    def __init__(self, prometheus: bool = True) -> None:
        texts = _trtllm_old_scrapes()
        self.paths: list[str] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                outer.paths.append(self.path)
                if self.path == "/metrics":
                    body, ctype = b'[{"iter": 12, "numActiveRequests": 2}]', "application/json"
                elif self.path == "/prometheus/metrics" and prometheus:
                    k = min(outer.paths.count(self.path), 2) - 1  # t0, then t5 from the second scrape on
                    body, ctype = texts[k].encode(), "text/plain; version=0.0.4"
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _serving(prometheus: bool, body: Callable[[_TrtllmServe], None]) -> None:
    srv = _TrtllmServe(prometheus)
    try:
        body(srv)
    finally:
        srv.close()


def test_trtllm_scrape_moves_from_json_metrics_to_prometheus_path():
    def check(srv: _TrtllmServe) -> None:
        s = PrometheusScraper(metrics_url(srv.base), timeout_s=2.0)
        s.scrape_once(T0)
        rows = s.scrape_once(T0 + 5)
        assert s.errors == 0 and s.engine == "trtllm"
        assert s.url == srv.base + "/prometheus/metrics" and "answered JSON" in s.stats()["url_note"]
        assert any(r[1] == S.SERIES_TTFT_S and r[3] == pytest.approx(0.3) for r in rows)
        assert srv.paths.count("/metrics") == 1  # it switched once and stayed

    _serving(True, check)


def test_trtllm_without_prometheus_text_says_how_to_turn_it_on():
    def check(srv: _TrtllmServe) -> None:
        s = PrometheusScraper(metrics_url(srv.base), timeout_s=2.0)
        assert s.scrape_once(T0) == [] and s.errors == 1
        assert "return_perf_metrics" in s.last_error and "\n" not in s.last_error

    _serving(False, check)


def test_json_exposition_is_a_clear_one_line_error():
    from collectors.prometheus import ExpositionError

    with pytest.raises(ExpositionError, match="JSON, not Prometheus text.*/prometheus/metrics"):
        parse_exposition('[{"iter": 3, "numActiveRequests": 1}]', T0)


def test_metrics_url_rule():
    assert metrics_url("http://h:8000") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/metrics") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/prometheus/metrics") == "http://h:8000/prometheus/metrics"


# --- NVIDIA Dynamo -------------------------------------------------------------------------------


def dynamo_scrapes() -> list[str]:
    """The front end's and one worker's texts at the same instants, read together."""
    reg = CollectorRegistry()
    F, W = "dynamo_frontend_", "dynamo_component_"
    ttft = Histogram(F + "time_to_first_token_seconds", "", ("model",), buckets=[0.05, 0.1, 0.5, 1], registry=reg)
    tok = Histogram(F + "tokenizer_latency_ms", "", ("operation",), buckets=[1, 5, 10, 50], registry=reg)
    queued = Gauge(F + "queued_requests", "", ("model",), registry=reg)
    inflight = Gauge(F + "inflight_requests", "", ("model",), registry=reg)
    pending = Gauge(F + "router_queue_pending_requests", "", ("worker_type",), registry=reg)
    hit = Gauge(F + "kv_hit_rate", "", ("model",), registry=reg)
    transit = Histogram(W + "network_transit_seconds", "", ("dynamo_component",), buckets=[0.001, 0.01, 0.1],
                        registry=reg)
    first = Histogram(W + "time_to_first_response_seconds", "", ("dynamo_component",), buckets=[0.05, 0.1, 0.5],
                      registry=reg)
    out = [_text(reg)]
    for v in (0.2, 0.3):
        ttft.labels("m").observe(v)
    tok.labels("tokenize").observe(8.0)
    tok.labels("tokenize").observe(12.0)
    tok.labels("detokenize").observe(0.5)
    transit.labels("backend").observe(0.004)
    transit.labels("backend").observe(0.006)
    first.labels("backend").observe(0.15)
    first.labels("backend").observe(0.17)
    queued.labels("m").set(3)
    inflight.labels("m").set(5)
    pending.labels("decode").set(2)
    hit.labels("m").set(0.4)
    out.append(_text(reg))
    return out


def test_dynamo_front_end_vs_worker_split():
    scrapes = dynamo_scrapes()
    assert pa.detect_engine(parse_exposition(scrapes[1], T0).names()) == "dynamo"
    rows = _window(scrapes)
    assert _at(rows, S.SERIES_TTFT_S, 1) == pytest.approx(0.25)
    assert _at(rows, S.SERIES_TOKENIZE_TIME_S, 1) == pytest.approx(0.010)  # ms -> s
    assert _at(rows, S.SERIES_DETOKENIZE_TIME_S, 1) == pytest.approx(0.0005)
    assert _at(rows, S.SERIES_TRANSIT_S, 1) == pytest.approx(0.005)
    assert _at(rows, S.SERIES_WORKER_TTFT_S, 1) == pytest.approx(0.16)
    # what the front end adds: TTFT - transit - the worker's own first response
    assert _at(rows, S.SERIES_FRONTEND_TIME_S, 1) == pytest.approx(0.25 - 0.005 - 0.16)
    assert _at(rows, S.SERIES_AWAITING_FIRST_TOKEN, 1) == 3 and _at(rows, S.SERIES_INFLIGHT, 1) == 5
    assert _at(rows, S.SERIES_WAITING, 1) == 2
    assert _at(rows, S.SERIES_PREFIX_CACHE_HIT_RATIO, 1) == pytest.approx(0.4)


# --- the registry ------------------------------------------------------------------------------------


def test_every_engine_table_of_the_ground_floor_is_registered():
    modules = [import_module(f"diag.ground.external.{name}") for name in ENGINES]
    tables = [getattr(m, attr) for m in modules for attr in ("METRICS", "TRITON_METRICS") if hasattr(m, attr)]
    assert tables and set(tables) == set(pa.ADAPTERS) and len(pa.ADAPTERS) == len(pa.ADAPTERS_BY_ENGINE)
