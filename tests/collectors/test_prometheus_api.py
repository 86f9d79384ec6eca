"""collectors.prometheus_api: the Prometheus-API reader against a fake Prometheus server, one
entity per replica, and an unreachable server."""

from __future__ import annotations

import asyncio
import threading

import pytest

from collectors.prometheus_api import PrometheusAPIError, PrometheusAPIReader
from diag.ground import stages
from support.engine_testutil import free_port

S = stages


class _FakePrometheus:
    """A tiny aiohttp app that answers like the Prometheus HTTP API, in a thread."""

    def __init__(self) -> None:
        from aiohttp import web

        self.queries: list[str] = []

        async def names(request):
            return web.json_response({"status": "success", "data": ["up", "vllm:num_requests_waiting",
                                                                    "vllm:time_to_first_token_seconds_bucket"]})

        async def query_range(request):
            q = request.query["query"]
            self.queries.append(q)
            start, end, step = float(request.query["start"]), float(request.query["end"]), float(request.query["step"])
            if "request_decode_time" in q:
                return web.json_response({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
                                         status=400)
            result = []
            if "time_to_first_token" in q or "num_requests_waiting" in q:
                for inst, base in (("10.0.0.1:8000", 0.2), ("10.0.0.2:8000", 1.5)):
                    values, t = [], start
                    while t <= end + 1e-9:
                        values.append([t, "NaN" if t == start and inst.startswith("10.0.0.2") else str(base)])
                        t += step
                    result.append({"metric": {"instance": inst}, "values": values})
            return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

        app = web.Application()
        app.router.add_get("/api/v1/label/__name__/values", names)
        app.router.add_get("/api/v1/query_range", query_range)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        started = threading.Event()

        def serve():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        started.wait(5)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop)
        fut.result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_prometheus_api_reader_fleet():
    prom = _FakePrometheus()
    try:
        reader = PrometheusAPIReader(prom.url, window="1m")
        df = reader.read(1000.0, 1020.0, 10.0)
        assert reader.engine == "vllm"  # detected from /api/v1/label/__name__/values
        assert list(df.columns) == list(stages.SERIES_COLUMNS) and set(df["source"]) == {"prometheus"}
        ttft = df[df["series"] == S.SERIES_TTFT_S]
        assert set(ttft["entity"]) == {"10.0.0.1:8000", "10.0.0.2:8000"}  # one entity per replica
        assert len(ttft[ttft["entity"] == "10.0.0.1:8000"]) == 3
        assert len(ttft[ttft["entity"] == "10.0.0.2:8000"]) == 2  # the NaN point is dropped
        assert set(df["series"]) >= {S.SERIES_TTFT_S, "ttft_s_p99", S.SERIES_WAITING}
        assert reader.errors and reader.errors[0].startswith(S.SERIES_DECODE_TIME_S) and "parse error" in reader.errors[0]
        assert any("rate(vllm:time_to_first_token_seconds_sum[1m])" in q for q in prom.queries)
    finally:
        prom.close()


def test_prometheus_api_reader_unreachable():
    reader = PrometheusAPIReader(f"http://127.0.0.1:{free_port()}", engine="vllm", timeout_s=1)
    with pytest.raises(PrometheusAPIError, match="unreachable"):
        reader.read(0, 10, 5)
