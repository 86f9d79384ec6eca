"""rules.edges.loadgen when the client's lag samples under-count its stalls, and the engine's spans
measure the delay directly: the client-server gap over a loopback connection. Feature values from
the bundled matrix's loadgen draw (seed 61206, draw 26: a CPU hog in the probe's own process) whose
sampled first-token lag read 17% (< 20%) and whose gap then read as the network at 0.90."""

from __future__ import annotations

from rules import evidence
from rules.base import RuleContext
from rules.edges import loadgen
from rules.features import Feature, Features
from support.rulectx import rule_context

HOG = {"ttft_p50_s": 0.311, "ttft_p95_s": 0.515, "requests_n": 45.0, "client_first_token_lag_share": 0.17,
       "client_first_token_own_lag_share": 0.17, "client_first_token_starved_share": 0.0,
       "client_loop_stall_frac": 0.46, "client_loop_lag_p99_s": 0.204, "client_cpu_pct_p95": 4.1,
       "client_server_gap_p50_s": 0.289, "client_server_gap_frontend_frac": 0.0, "client_server_local": 1.0}


def _ctx(**over: float | None) -> RuleContext:
    feats = Features()
    for name, value in {**HOG, **over}.items():
        feats.add(Feature(name, value, "", value is not None))
    return rule_context("loadgen", feats, client_only=False)


def test_a_loopback_gap_the_loops_lag_covers_is_the_probe_reading_late() -> None:
    out = loadgen(_ctx())
    assert not isinstance(out, str) and out.confidence >= 0.8
    row = next(e for e in out.evidence if e.key == evidence.GAP_SHARE_LOCAL)
    assert row.crossed and abs(row.value - 0.289 / 0.311) < 1e-9


def test_a_remote_server_or_a_quiet_loop_leaves_the_gap_to_the_network() -> None:
    assert isinstance(loadgen(_ctx(client_server_local=0.0)), str)  # a real network can hold it
    assert isinstance(loadgen(_ctx(client_loop_lag_p99_s=0.01)), str)  # lag far under the gap: not the loop's
    assert isinstance(loadgen(_ctx(client_loop_stall_frac=0.05)), str)
    # vLLM: the engine's TTFT starts after its own front end, so the gap holds that work too
    assert isinstance(loadgen(_ctx(client_server_gap_frontend_frac=1.0)), str)


def test_a_pass_names_only_what_was_measured() -> None:
    # client spans read back from a trace store: the send schedule, none of the probe's loop health
    only_spans = {k: None for k in HOG if k.startswith("client_") and k != "client_server_gap_p50_s"}
    reason = loadgen(_ctx(**only_spans, client_send_lateness_p95_s=0.0))
    assert isinstance(reason, str) and reason.startswith("send schedule within bounds")
    assert "event-loop lag and CPU are not in this capture" in reason
    # the probe's own capture: every part checked
    quiet = loadgen(_ctx(client_first_token_lag_share=None, client_loop_stall_frac=0.01, client_loop_lag_p99_s=0.001,
                         client_server_local=0.0, client_send_lateness_p95_s=0.0))
    assert quiet == "the client kept up (event-loop lag, CPU, send schedule within bounds)"
