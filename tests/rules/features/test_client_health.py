"""rules.features.client and the ``loadgen`` rule: the load generator's health. The client's lag
counts only where it could inflate a measured TTFT (stalls under way at the requests' sends and
first tokens, as a share of their TTFT), and the finding says whether the stalls were the
client's own or the machine's; a capture without per-request timing reads the probe's meta.

These cases build the tables by hand (requests with client timing, the probe's health series);
the loadgen scenario of the real-process matrix (tests/diag/analysis/scenarios/test_scenario_matrix.py) and ``ttft
diagnose`` against a one-at-a-time engine (tests/diag/analysis/diagnose/test_diagnose_real.py) run it for real.
"""

from __future__ import annotations

import pandas as pd
import pytest
from support.featcap import make_requests, make_tables

from diag.ground import stages
from diag.analysis.report.text import format_diagnosis
from rules import evidence, run_rules
from rules.features import compute_features

def test_client_health_from_probe_meta() -> None:
    meta = {"client_health": {"loop_lag_p99_s": 0.03, "cpu_pct_mean": 40.0, "cpu_pct_p90": 97.0, "saturated": True,
                              "thresholds": {"loop_lag_p99_s": 0.02}}}
    feats = compute_features(make_tables(make_requests([0.01] * 5), meta=meta))
    assert feats.value("client_loop_lag_p99_s") == 0.03
    assert feats.value("client_cpu_pct_p95") == 97.0
    assert feats.value("client_saturated_flag") == 1.0


N, TTFT_S, GAP_S = 24, 0.5, 1.0
T0 = 1.7e9


def _requests() -> pd.DataFrame:
    start = [T0 + i * (TTFT_S + GAP_S) for i in range(N)]
    req = make_requests([TTFT_S] * N, has_client=[True] * N, has_server=[False] * N,
                        client_ttft_s=[TTFT_S] * N, server_ttft_s=[None] * N,
                        segment=["concurrency=1"] * N)
    req["start_ns"] = [s * 1e9 for s in start]
    req["client_start_ns"] = req["start_ns"]
    req["client_first_content_ns"] = [(s + TTFT_S) * 1e9 for s in start]
    return req


def _series(stall_at: str, lag_s: float = 0.25, starved: bool = False) -> pd.DataFrame:
    """The probe's health series: 50 ms samples, a ``lag_s`` stall at each first token
    (``stall_at="first"``) or in each gap between requests (``"between"``)."""
    rows = []
    for i in range(N):
        start = T0 + i * (TTFT_S + GAP_S)
        end = start + TTFT_S + (0.0 if stall_at == "first" else GAP_S / 2 + lag_s)
        t = start - GAP_S / 2
        while t < start + TTFT_S + GAP_S - 0.05:
            t += 0.05
            if end - lag_s - 0.05 < t < end + 0.05:
                continue
            rows.append((t, 0.0005, 0.0))
        rows.append((end, lag_s, lag_s * 0.9 if starved else 0.0))
    rows.sort()
    frames = [pd.DataFrame({"ts_s": [r[0] for r in rows], "source": "client", "series": name, "entity": "",
                            "value": [r[k] for r in rows]})
              for name, k in ((stages.SERIES_LOOP_LAG_S, 1), (stages.SERIES_LOOP_STARVED_S, 2))]
    return pd.concat(frames, ignore_index=True)


def _tables(stall_at: str, starved: bool = False):  # noqa: ANN202
    return make_tables(_requests(), series=_series(stall_at, starved=starved), meta={"kind": "probe"})


def test_stalls_between_requests_are_not_the_load_generator() -> None:
    t = _tables("between")
    f = compute_features(t)
    assert f.value("client_first_token_lag_share") < 0.01
    assert f.value("client_loop_stall_frac") < 0.05  # while requests waited, not the run's ~17%
    d = run_rules(t)
    assert not any(x.category == "loadgen" for x in d.findings), format_diagnosis(d)
    why = next(p.reason for p in d.passed if p.rule_id == "loadgen")
    assert "sends and first tokens could add 0%" in why


def test_the_clients_own_stalls_at_first_tokens_are_the_load_generator() -> None:
    d = run_rules(_tables("first"))
    v = d.verdict
    assert v.category == "loadgen" and v.confidence >= 0.7, format_diagnosis(d)
    assert v.title.startswith("The load generator was the bottleneck")
    row = next(e for e in v.evidence if e.key == evidence.CLIENT_FIRST_TOKEN_LAG)
    assert row.crossed and row.value == pytest.approx(0.5, abs=0.01)  # 0.25 s of each 0.5 s TTFT
    assert next(e for e in v.evidence if e.key == evidence.CLIENT_OWN_PART).value == pytest.approx(0.5, abs=0.01)


def test_stalls_the_machine_caused_are_said_to_be_the_machines() -> None:
    d = run_rules(_tables("first", starved=True))
    v = d.verdict
    assert v.category == "loadgen", format_diagnosis(d)
    assert v.title.startswith("The machine starved the load generator") and "not the client's own work" in v.title
    assert next(e for e in v.evidence if e.key == evidence.CLIENT_MACHINE_PART).value == pytest.approx(0.45, abs=0.01)
    assert any("another machine" in c for c in v.next_checks)


def test_a_capture_without_per_request_timing_reads_the_probes_own_summary() -> None:
    meta = {"client_health": {"loop_stall_frac": 0.5, "loop_lag_p99_s": 0.2, "cpu_pct_p90": 30.0, "saturated": True}}
    d = run_rules(make_tables(make_requests([TTFT_S] * N), meta=meta))
    assert d.features.value("client_first_token_lag_share") is None
    assert d.verdict.category == "loadgen", format_diagnosis(d)
    assert any(e.key == evidence.CLIENT_LOOP_STALLED and e.crossed for e in d.verdict.evidence)
