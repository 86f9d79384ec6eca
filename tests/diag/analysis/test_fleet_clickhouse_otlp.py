"""A real fleet into ClickHouse: three ``ttft serve`` replicas (the bundled engine, one admitting a
single sequence at a time) and a ``ttft probe`` against each export their spans over OTLP to one
``ttft receive --to-clickhouse chdb:PATH``, while each also writes its own capture. ``ttft analyze
--from-clickhouse`` then gives every replica the verdict ``ttft analyze SERVER CLIENT`` gives its
captures, and names the slow one.

The probes run one after another (the replicas all up, exporting at once): on a small machine
three probes at once starve each other's event loops, and a starved probe is a verdict only its
capture can give (its loop health does not travel over OTLP; ``docs/fleet.md``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from diag.cli import main

from support.engine_testutil import ROOT, stop_process

REPLICAS = ("replica-a", "replica-b", "replica-c")
SLOW = "replica-b"
#: the slow replica's fault: one sequence at a time, so the probe's four streams queue
SLOW_FLAGS = ("--max-running", "1")
PROBE = ("-c", "4", "-n", "24", "--input-tokens", "32", "--output-tokens", "24", "--seed", "1", "--no-progress")


def _start(cmd: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``python -m diag CMD`` from the repository root; (the process, its first stdout line)."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME"):
        full_env.pop(key, None)
    proc = subprocess.Popen([sys.executable, "-m", "diag", *cmd], cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, tuple[Path, Path]], str]]:
    """(the chdb URL, replica -> (server capture, probe capture), the receiver's last words)."""
    base = tmp_path_factory.mktemp("otlp-fleet")
    url = f"chdb:{base / 'db'}"
    caps = {name: (base / f"srv-{name}", base / f"cli-{name}") for name in REPLICAS}
    with ExitStack() as stack:
        recv, line = _start(["receive", "--port", "0", "--no-grpc", "--to-clickhouse", url])
        stack.callback(stop_process, recv)
        found = re.search(r"(http://[\d.]+:\d+)/v1/traces", line)
        assert found, line
        otlp = found.group(1)
        servers = {}
        for name in REPLICAS:
            flags = list(SLOW_FLAGS) if name == SLOW else []
            proc, line = _start(["serve", "--port", "0", "--threads", "1", "--otlp", otlp,
                                 "--capture", str(caps[name][0]), *flags],
                                env={"OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={name}"})
            stack.callback(stop_process, proc)
            found = re.search(r"listening on (http://\S+)", line)
            assert found, (name, line, proc.stderr.read() if proc.poll() is not None else "")
            servers[name] = (proc, found.group(1))
        for name, (_, served) in servers.items():
            assert main(["probe", served, *PROBE, "--otlp", otlp, "-o", str(caps[name][1])]) == 0, name
        for proc, _ in servers.values():  # SIGINT: each engine flushes its capture and its OTLP export
            assert stop_process(proc) == 0
        assert stop_process(recv) == 0
        said = recv.stderr.read() if recv.stderr else ""
        yield url, caps, said


def _verdict(doc: dict) -> tuple[str, float]:
    return doc["verdict"]["category"], doc["verdict"]["confidence"]


@pytest.mark.slow
def test_each_replica_gets_its_captures_verdict_and_the_slow_one_is_named(
        fleet: tuple[str, dict[str, tuple[Path, Path]], str], capsys: pytest.CaptureFixture[str]) -> None:
    url, caps, said = fleet
    assert re.search(r"\d+ spans in \d+ requests, 0 rejected, 0 spans dropped", said), said
    assert main(["analyze", "--from-clickhouse", url, "--since", "1h", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    store = {r["name"]: r for r in doc["replicas"]}
    assert set(store) == set(REPLICAS) and doc["by"] == "service.instance.id"
    for name, (server, client) in caps.items():
        assert main(["analyze", str(server), str(client), "--json"]) == 0
        own = json.loads(capsys.readouterr().out)
        got, want = _verdict(store[name]), _verdict(own)
        assert got[0] == want[0] and got[1] == pytest.approx(want[1], abs=0.02), (name, got, want)
        # the same requests, on both sides of the wire (the probe's client spans went through OTLP too)
        assert store[name]["requests"] == own["requests"] and store[name]["client_ttft_s"]["p50"] is not None
        assert store[name]["ttft_s"]["p50"] == pytest.approx(own["ttft_s"]["p50"], rel=1e-6)
        assert set(store[name]["stages"]) == set(own["stages"])
        for st, figures in own["stages"].items():
            assert store[name]["stages"][st] == pytest.approx(figures, rel=1e-6, abs=1e-9), (name, st)
    assert doc["hot"] == SLOW and _verdict(store[SLOW])[0] == "queue"
    assert all(_verdict(store[n])[0] == "healthy" for n in REPLICAS if n != SLOW)
    # what does not travel over OTLP is said, not assumed: the probe's loop health
    passed = {p["rule_id"]: p["reason"] for p in store[SLOW]["passed"]}
    assert "not in this capture" in passed["loadgen"]
