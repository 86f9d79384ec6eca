"""collectors.probe.session: a session interrupted while it starts closes what it opened."""

from __future__ import annotations

import asyncio
import json

import pytest

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, ProbeSession, WorkloadSpec
from collectors.probe import eventloop


def test_ctrl_c_during_the_compatibility_check_closes_the_session_and_the_capture(server, tmp_path) -> None:
    """The first request hangs and the user presses Ctrl-C: the HTTP session is closed (no
    "Unclosed client session" at exit), the span threads stop and the capture's meta.json is written."""
    cfg = ProbeConfig(server.url("hang"), api="chat", load=LoadSpec(concurrency=1, requests=1),
                      workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse("3")), timeout_s=20,
                      output=tmp_path / "cap", wait_ready_s=0)
    session = ProbeSession(cfg)

    async def start_then_interrupt() -> None:
        task = asyncio.ensure_future(session.__aenter__())
        while session.client is None or session.client.session is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the compatibility request is now waiting on the server
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    eventloop.run(start_then_interrupt())
    assert session.client is None and session.sink is None
    meta = json.loads((tmp_path / "cap" / "meta.json").read_text())
    assert meta["probe"]["url"].startswith(cfg.url) and "client_health" in meta  # written by close()


def _idle_gaps_probe(server, tmp_path, name: str, **kw):
    """An open loop (4 req/s) at a server that closes connections idle 0.1 s, with the probe's
    keep-alive at 10 s: most requests go out on a connection the server is closing."""
    from collectors.probe import run_probe

    server.idle_close_s = 0.1
    cfg = ProbeConfig(server.url("idleclose"), api="completions",
                      load=LoadSpec(concurrency=2, rate_rps=4.0, requests=16, seed=3),
                      workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse("3")), timeout_s=5,
                      output=tmp_path / name, keepalive_s=10.0, **kw)
    return run_probe(cfg)


@pytest.mark.slow
def test_idle_closed_keepalive_connections_are_retried_not_failures(server, tmp_path) -> None:
    from diag.ground.capture import load_capture
    from diag.ground.tables import build_tables
    from rules import run_rules

    # the control: without the retry, the race is counted against the server
    raced = _idle_gaps_probe(server, tmp_path, "raced", retry_reused=False)
    assert raced.metrics["errors"]["server_disconnected"]["count"] >= 4
    d = run_rules(build_tables(load_capture(tmp_path / "raced")))
    assert d.verdict.category == "failures"
    server.reset()
    res = _idle_gaps_probe(server, tmp_path, "retried")
    assert res.metrics["requests"]["errors"] == 0 and res.metrics["requests"]["ok"] == 16
    retries = json.loads((tmp_path / "retried" / "meta.json").read_text())["client_health"]["connection_retries"]
    assert retries["retried"] >= 4 and retries["retried"] <= len(server.idle_closed_ns)  # setup requests may retry too
    assert retries["retried"] == sum(r.conn_retries for r in res.results) and "not as failures" in retries["note"]
    d = run_rules(build_tables(load_capture(tmp_path / "retried")))
    assert d.verdict.category != "failures" and d.features.value("error_rate") == 0
