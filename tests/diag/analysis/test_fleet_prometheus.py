"""A real Prometheus server scraping three real ``ttft serve`` replicas, one of them held to one
running sequence (its requests queue): ``ttft scrape --from-prometheus`` reads back what the
engines exposed, and ``ttft analyze --from-prometheus --by instance`` names that replica hot,
with a queue verdict, from its own series.

Needs the ``prometheus`` binary (Debian package ``prometheus``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diag.ground import stages as S
from diag.analysis import analyze_paths
from support.engine_testutil import free_port

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PROMETHEUS is None, reason="needs the prometheus binary (apt-get install prometheus)")]
HOT = 2  # the replica index started with --max-running 1
LOAD = ["-c", "4", "-n", "20", "--output-tokens", "12", "--warmup", "1", "--no-capture"]


def _get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read().decode()


@contextlib.contextmanager
def _processes(cmds: list[list[str]], log_dir: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = []
    try:
        for i, cmd in enumerate(cmds):
            log = open(log_dir / f"proc{i}.log", "wb")
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _engine_totals(url: str) -> tuple[float, float]:
    """(requests with a first token, TTFT sum in s) from the engine's own /metrics."""
    count = total = 0.0
    for fam in text_string_to_metric_families(_get(url + "/metrics")):
        for s in fam.samples:
            if s.name == "ttft_engine:time_to_first_token_seconds_count":
                count += s.value
            elif s.name == "ttft_engine:time_to_first_token_seconds_sum":
                total += s.value
    return count, total


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("fleet")
    ports = [free_port() for _ in range(3)]
    prom_port = free_port()
    targets = [f"127.0.0.1:{p}" for p in ports]
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ttft\n"
        f"    static_configs:\n      - targets: {json.dumps(targets)}\n")
    serve = [[sys.executable, "-m", "diag", "serve", "--port", str(p), "--threads", "1"]
             + (["--max-running", "1"] if i == HOT else []) for i, p in enumerate(ports)]
    prom = [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}"]
    prom_url = f"http://127.0.0.1:{prom_port}"
    with _processes(serve + [prom], tmp):
        for p in ports:
            _wait(lambda p=p: "ok" in _get(f"http://127.0.0.1:{p}/health").lower(), 120, f"ttft serve on {p}")

        def all_up() -> bool:
            doc = json.loads(_get(prom_url + "/api/v1/query?query=up"))
            return sum(float(r["value"][1]) for r in doc["data"]["result"]) == 3

        _wait(all_up, 60, "Prometheus to scrape the three replicas")
        t0 = time.time()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        probes = [subprocess.Popen([sys.executable, "-m", "diag", "probe", f"http://{t}", *LOAD], cwd=ROOT, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for t in targets]
        for pr in probes:
            _, err = pr.communicate(timeout=240)
            assert pr.returncode == 0, err.decode()[-2000:]
        time.sleep(4.0)  # two scrapes past the last request, and the rate window's tail
        totals = {t: _engine_totals(f"http://{t}") for t in targets}
        duration = f"{time.time() - t0 + 10:.0f}"
        window = ["--window", "5s"]
        scrape = subprocess.run([sys.executable, "-m", "diag", "scrape", prom_url, "--from-prometheus", "--duration",
                                 duration, "--interval", "1", *window, "-o", str(tmp / "scraped")],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        analyze = subprocess.run([sys.executable, "-m", "diag", "analyze", "--from-prometheus", prom_url, "--duration",
                                  duration, "--step", "1", *window, "--json"],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        text = subprocess.run([sys.executable, "-m", "diag", "analyze", str(tmp / "scraped"), "--by", "instance"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return {"targets": targets, "totals": totals, "scrape": scrape, "analyze": analyze, "text": text,
            "capture": tmp / "scraped"}


def test_series_read_back_through_promql_match_what_the_engines_exposed(fleet: dict[str, Any]) -> None:
    assert fleet["scrape"].returncode == 0, fleet["scrape"].stderr
    series = analyze_paths([fleet["capture"]], run_rules=False).tables.series
    assert set(series["entity"].astype(str)) == set(fleet["targets"])
    for target in fleet["targets"]:
        rows = series[series["entity"].astype(str) == target]
        rate = rows[rows["series"] == S.SERIES_REQUESTS_PER_S].set_index("ts_s")["value"]
        ttft = rows[rows["series"] == S.SERIES_TTFT_S].set_index("ts_s")["value"]
        count, total_s = fleet["totals"][target]
        assert count >= 20
        # the rate sampled every second integrates back to the requests the engine counted
        assert rate.sum() * 1.0 == pytest.approx(count, rel=0.3), target
        # windowed mean TTFT, request-weighted, is the engine's own sum / count
        both = pd.concat([rate, ttft], axis=1, join="inner").dropna()
        weighted = (both.iloc[:, 0] * both.iloc[:, 1]).sum() / both.iloc[:, 0].sum()
        assert weighted == pytest.approx(total_s / count, rel=0.25), target


def test_per_replica_verdicts_name_the_replica_that_queues(fleet: dict[str, Any]) -> None:
    res = fleet["analyze"]
    assert res.returncode in (0, 1), res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"] == "fleet" and doc["by"] == "instance"
    by_name = {r["name"]: r for r in doc["replicas"]}
    assert set(by_name) == set(fleet["targets"])
    hot = fleet["targets"][HOT]
    assert doc["hot"] == hot
    assert by_name[hot]["verdict"]["category"] == "queue"
    names = [e["name"] for e in by_name[hot]["verdict"]["evidence"]]
    assert "queue share of TTFT (engine metrics)" in names
    for other in fleet["targets"]:
        if other != hot:
            assert by_name[other]["verdict"]["category"] != "queue", by_name[other]["verdict"]
            assert by_name[other]["ttft_p95_s"] < by_name[hot]["ttft_p95_s"]
    # the saved scrape gives the same split, as text, with the hot row marked
    out = fleet["text"].stdout
    assert fleet["text"].returncode in (0, 1), fleet["text"].stderr
    hot_row = next(line for line in out.splitlines() if line.startswith(hot))
    assert "queue" in hot_row and "<- hot" in hot_row
    assert f"hot replica: {hot}" in out
