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
