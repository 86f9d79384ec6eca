"""The probe's event loop: uvloop when installed, the stdlib loop on request."""

from __future__ import annotations

import asyncio

import pytest

from collectors.probe import eventloop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_is_the_default_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv(eventloop.ENV_VAR, raising=False)
    assert eventloop.loop_name() == "uvloop"
    assert eventloop.run(_loop_module()).startswith("uvloop")


def test_the_stdlib_loop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV_VAR, "asyncio")
    assert eventloop.loop_name() == "asyncio"
    assert eventloop.run(_loop_module()).startswith("asyncio")
