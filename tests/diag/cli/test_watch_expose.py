"""``ttft watch --expose``: the live verdict as Prometheus metrics, parsed back with
prometheus_client; a watched server that dies turns ``ttft_verdict{category="failures"}`` to 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diag.analysis import analyze_paths
from tui.expose import parse_expose
from diag.analysis.report.verdict_metrics import verdict_exposition, verdict_states

ROOT = Path(__file__).resolve().parents[3]
from support.engine_testutil import stop_process
from support.engine_testutil import free_port, ttft_serve
from support.rulectx import new_ttft_rule


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_the_exposition_carries_the_verdict_one_hot_its_findings_and_stage_shares() -> None:
    a = analyze_paths([ROOT / "samples" / "queue"])
    fams = _families(verdict_exposition(a.diagnosis, a.decomposition, 1_800_000_000.0).decode())
    states = {lab["category"]: v for lab, v in fams["ttft_verdict"]}
    assert set(states) == set(verdict_states())
    assert [c for c, v in states.items() if v == 1.0] == [a.diagnosis.verdict.category] == ["queue"]
    assert fams["ttft_verdict_confidence"][0][1] == pytest.approx(a.diagnosis.verdict.confidence)
    rules_seen = {lab["rule"] for lab, _ in fams["ttft_finding_confidence"]}
    assert {f.rule_id for f in a.diagnosis.findings} == rules_seen
    shares = {lab["stage"]: v for lab, v in fams["ttft_stage_share"]}
    assert shares["queue"] == pytest.approx(a.decomposition["stages"]["queue"]["share_of_ttft"])
    q = {lab["quantile"]: v for lab, v in fams["ttft_time_to_first_token_seconds"]}
    assert q["0.99"] == pytest.approx(a.decomposition["ttft_s"]["p99"])
    assert fams["ttft_verdict_timestamp_seconds"][0][1] == 1_800_000_000.0


def test_the_exposition_has_a_series_for_a_new_rule_s_category() -> None:
    """The states are the registry's when the exposition is built: a rule registered after this module
    was imported has its ``ttft_verdict`` and ``ttft_leading_candidate`` series."""
    a = analyze_paths([ROOT / "samples" / "queue"])
    with new_ttft_rule() as cat:
        fams = _families(verdict_exposition(a.diagnosis, a.decomposition, 1_800_000_000.0).decode())
    assert (cat, 0.0) in [(lab["category"], v) for lab, v in fams["ttft_verdict"]]
    assert (cat, 0.0) in [(lab["category"], v) for lab, v in fams["ttft_leading_candidate"]]


def test_expose_spec() -> None:
    assert parse_expose(":9464") == ("127.0.0.1", 9464)
    assert parse_expose("9464") == ("127.0.0.1", 9464)
    assert parse_expose("0.0.0.0:1") == ("0.0.0.0", 1)
    with pytest.raises(ValueError, match="expected \\[HOST:\\]PORT"):
        parse_expose("localhost")


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return _families(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def _state(fams: dict[str, list[tuple[dict[str, str], float]]] | None) -> str | None:
    if not fams:
        return None
    return next((lab["category"] for lab, v in fams["ttft_verdict"] if v == 1.0), None)


@pytest.mark.slow
def test_a_server_that_dies_turns_the_exposed_verdict_to_failures(tmp_path: Path) -> None:
    port, expose = free_port(), free_port()
    url = f"http://127.0.0.1:{expose}/metrics"
    with ttft_serve(port) as server:
        cmd = [sys.executable, "-m", "diag", "watch", f"http://127.0.0.1:{port}", "--duration", "40", "--probe-rate",
               "3", "--otlp-port", "-1", "--window", "20", "--expose", f":{expose}", "--expose-interval", "1",
               "-o", str(tmp_path / "cap")]
        watch = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 40
            fams = None
            while time.monotonic() < deadline:
                fams = _scrape(url)
                if fams and fams["ttft_window_requests"][0][1] >= 3 and _state(fams) not in (None, "no_data"):
                    break
                time.sleep(0.5)
            assert fams is not None and _state(fams) not in ("failures", "no_data", None), fams
            assert fams["ttft_time_to_first_token_seconds"]
            server.send_signal(signal.SIGKILL)
            server.wait(10)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and _state(fams) != "failures":
                time.sleep(0.5)
                fams = _scrape(url) or fams
            assert _state(fams) == "failures"
        finally:
            stop_process(watch)
