"""Request, step and cold-start tables; client/server join; stage decomposition."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from collectors.spans import setup_tracing
from diag.ground import stages
from diag.analysis import analyze_paths
from diag.ground.capture import load_capture
from diag.cli import main
from diag.ground.tables import build_tables, stage_decomposition

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def _server_request(sink, t0, *, traceparent=None, queue_ms=5, prefill_ms=20, comm_ms=0, tokens=4, itl_ms=10):
    req = sink.start_request("s", model="tiny", traceparent=traceparent, start_ns=t0,
                             attributes={stages.GEN_AI_USAGE_INPUT_TOKENS: 100})
    t = t0
    req.record_stage("tokenize", t, t + 1 * MS); t += 1 * MS
    req.record_stage("queue", t, t + queue_ms * MS); t += queue_ms * MS
    req.record_stage("prefill", t, t + prefill_ms * MS)
    if comm_ms:
        req.record_stage("comm", t + 2 * MS, t + 2 * MS + comm_ms * MS)
    t += prefill_ms * MS
    req.record_stage("sample", t, t + 1 * MS); t += 1 * MS
    req.record_stage("detokenize", t, t + 1 * MS); t += 1 * MS
    for k in range(tokens):
        req.add_token_time(t + k * itl_ms * MS)
    req.set_attributes({stages.GEN_AI_USAGE_OUTPUT_TOKENS: tokens})
    end = t + (tokens - 1) * itl_ms * MS
    req.end(end_ns=end)
    return req, t, end


def test_server_request_table_and_decomposition(capture_dir):
    sink = setup_tracing("engine", capture_dir=capture_dir)
    for i in range(10):
        _server_request(sink, T0 + i * 100 * MS, comm_ms=4)
    sink.record_step(T0, T0 + 3 * MS, {stages.ATTR_STEP_PREFILL_TOKENS: 100, stages.ATTR_STEP_DECODE_SEQS: 2,
                                       stages.ATTR_STEP_KV_USAGE: 0.5})
    sink.record_cold_start(T0 - 10**9, T0, "load")
    sink.shutdown()
    t = build_tables(load_capture(capture_dir))
    r = t.requests
    assert len(r) == 10 and r["has_server"].all() and not r["has_client"].any()
    assert r["server_ttft_s"].iloc[0] == pytest.approx(0.028)
    assert r["prefill_s"].iloc[0] == pytest.approx(0.016)  # exclusive of the 4 ms comm
    assert r["comm_s"].iloc[0] == pytest.approx(0.004)
    assert r["itl_p50_s"].iloc[0] == pytest.approx(0.010)
    assert r["tpot_s"].iloc[0] == pytest.approx(0.010)
    dec = stage_decomposition(r)
    shares = {k: v["share_of_ttft"] for k, v in dec["stages"].items()}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert list(dec["stages"]) == ["tokenize", "queue", "prefill", "comm", "sample", "detokenize"]
    assert t.steps["prefill_tokens"].iloc[0] == 100 and t.steps["kv_usage_ratio"].iloc[0] == 0.5
    assert t.cold_starts["duration_s"].iloc[0] == pytest.approx(1.0)


def test_disaggregated_requests_split_queue_by_side_and_count_the_transfer(capture_dir):
    """A --pd request: prefill-side queue, prefill, sample, kv_transfer, decode-side queue, detokenize."""
    sink = setup_tracing("engine", capture_dir=capture_dir)
    for i in range(4):
        t0 = T0 + i * 100 * MS
        req = sink.start_request("s", model="tiny", start_ns=t0, attributes={stages.ATTR_PD_DISAGGREGATED: True})
        t = t0
        for name, ms, attrs in (("queue", 2, {stages.ATTR_PD_SIDE: "prefill"}), ("prefill", 10, None),
                                ("sample", 1, None), ("kv_transfer", 6, {stages.ATTR_PD_KV_BYTES: 2048 * 64}),
                                ("queue", 3, {stages.ATTR_PD_SIDE: "decode"}), ("detokenize", 1, None)):
            req.record_stage(name, t, t + ms * MS, attrs)
            t += ms * MS
        req.add_token_time(t)
        req.set_attributes({stages.ATTR_PD_KV_BYTES: 2048 * 64, stages.ATTR_PD_DECODE_QUEUE_S: 0.003,
                            stages.ATTR_PD_ADMISSION_WAIT_S: 0.0025, stages.ATTR_PD_PREFILL_TTFT_S: 0.013,
                            stages.ATTR_PD_DECODE_TTFT_S: 0.010})
        req.end(end_ns=t)
    sink.record_step(T0, T0 + 10 * MS, {stages.ATTR_STEP_PREFILL_TOKENS: 64, stages.ATTR_STEP_PD_SIDE: "prefill"})
    sink.record_step(T0 + 20 * MS, T0 + 22 * MS, {stages.ATTR_STEP_DECODE_SEQS: 1, stages.ATTR_STEP_PD_SIDE: "decode"})
    sink.shutdown()
    t = build_tables(load_capture(capture_dir))
    r = t.requests.iloc[0]
    assert r["server_ttft_s"] == pytest.approx(0.023)
    assert r["queue_s"] == pytest.approx(0.005) and r["kv_transfer_s"] == pytest.approx(0.006)
    assert r["pd_decode_queue_s"] == pytest.approx(0.003) and r["pd_admission_wait_s"] == pytest.approx(0.0025)
    assert r["pd_kv_bytes"] == 2048 * 64 and r["pd_prefill_ttft_s"] + r["pd_decode_ttft_s"] == pytest.approx(0.023)
    parts = sum(r[stages.stage_column(s)] for s in stages.TTFT_STAGES if r[stages.stage_column(s)] == r[stages.stage_column(s)])
    assert parts == pytest.approx(r["server_ttft_s"])
    dec = stage_decomposition(t.requests)
    assert list(dec["stages"]) == ["queue", "prefill", "sample", "kv_transfer", "detokenize"]
    assert sum(v["share_of_ttft"] for v in dec["stages"].values()) == pytest.approx(1.0)
    assert list(t.steps["pd_side"]) == ["prefill", "decode"]


def test_lora_requests_carry_their_adapter_slot_wait_and_load(capture_dir):
    """A request for an adapter: its slot wait (inside queue) and its adapter's load (inside prefill)."""
    sink = setup_tracing("engine", capture_dir=capture_dir)
    for i, (name, wait_ms, load_ms) in enumerate((("a", 0, 2), ("b", 30, 2), (None, 0, 0))):
        attrs = {stages.ATTR_LORA_NAME: name, stages.ATTR_LORA_WAIT_S: wait_ms / 1e3,
                 stages.ATTR_LORA_LOAD_S: load_ms / 1e3} if name else {}
        req = sink.start_request("s", model="tiny", start_ns=T0 + i * 100 * MS, attributes=attrs)
        req.record_stage("queue", T0 + i * 100 * MS, T0 + i * 100 * MS + (wait_ms + 1) * MS)
        req.end(end_ns=T0 + i * 100 * MS + 50 * MS)
    sink.record_step(T0, T0 + 4 * MS, {stages.ATTR_STEP_PREFILL_TOKENS: 32, stages.ATTR_STEP_WAITING_LORA: 1,
                                       stages.ATTR_STEP_LORAS: 1, stages.ATTR_STEP_LORA_LOAD_S: 0.002})
    sink.shutdown()
    t = build_tables(load_capture(capture_dir))
    r = t.requests.set_index("start_ns")
    assert list(r["lora_name"].iloc[:2]) == ["a", "b"] and r["lora_name"].isna().iloc[2]
    assert list(r["lora_wait_s"].fillna(-1)) == [0.0, pytest.approx(0.03), -1]
    assert r["lora_load_s"].iloc[1] == pytest.approx(0.002) and r["queue_s"].iloc[1] == pytest.approx(0.031)
    step = t.steps.iloc[0]
    assert (step["waiting_lora_seqs"], step["loras"], step["lora_load_s"]) == (1, 1, pytest.approx(0.002))


def _joined(tmp_path, skew_ms=0):
    client = setup_tracing("probe", capture_dir=tmp_path / "cli")
    server = setup_tracing("engine", capture_dir=tmp_path / "srv")
    for i in range(6):
        t0 = T0 + i * 200 * MS
        c = client.start_request(f"c{i}", side="client", start_ns=t0)
        s_start = t0 + 3 * MS + skew_ms * MS
        _, first, end = _server_request(server, s_start, traceparent=c.traceparent())
        c.set_attributes({stages.ATTR_CLIENT_START_NS: t0, stages.ATTR_CLIENT_SENT_NS: t0 + 1 * MS,
                          stages.ATTR_CLIENT_FIRST_CONTENT_NS: first - skew_ms * MS + 4 * MS})
        c.add_token_time(first - skew_ms * MS + 4 * MS)
        c.end(end_ns=end - skew_ms * MS + 5 * MS)
    client.shutdown()
    server.shutdown()
    return [tmp_path / "cli", tmp_path / "srv"]


def test_client_and_server_join_by_trace_id_with_network_gap(tmp_path):
    a = analyze_paths(_joined(tmp_path), run_rules=False)
    r = a.tables.requests
    assert len(r) == 6 and (r["has_client"] & r["has_server"]).all()
    assert r["network_s"].iloc[0] == pytest.approx(0.007)  # 3 ms before + 4 ms after the server
    assert r["ttft_s"].iloc[0] == pytest.approx(r["client_ttft_s"].iloc[0])
    assert "network" in a.decomposition["stages"]
    assert a.tables.clock_offsets  # estimated, not assumed zero
    assert not any("clock skew" in w for w in a.warnings)


def test_clock_skew_is_estimated_and_corrected(tmp_path):
    a = analyze_paths(_joined(tmp_path, skew_ms=-500), run_rules=False)  # server clock 0.5 s behind
    offset = next(iter(a.tables.clock_offsets.values()))
    assert offset == pytest.approx(-0.5, abs=0.01)
    assert any("clock skew" in w for w in a.warnings)
    r = a.tables.requests
    assert (r["server_start_ns"] >= r["client_start_ns"]).all()
    assert r["network_s"].iloc[0] == pytest.approx(0.007)


def test_client_only_capture(tmp_path):
    paths = _joined(tmp_path)
    a = analyze_paths([paths[0]], run_rules=False)
    r = a.tables.requests
    assert r["has_client"].all() and not r["has_server"].any()
    assert r["client_ttft_s"].notna().all()
    assert a.decomposition["stages"] == {}


def test_ttft_analyze_prints_decomposition_and_json(tmp_path, capsys):
    paths = _joined(tmp_path)
    assert main(["analyze", str(paths[0]), str(paths[1])]) == 0
    out = capsys.readouterr().out
    for st in ("tokenize", "queue", "prefill", "sample", "detokenize", "network"):
        assert st in out
    assert main(["analyze", str(paths[1]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["stages"]) >= {"tokenize", "queue", "prefill"}
    assert doc["stages"]["prefill"]["count"] == 6


def test_ttft_analyze_bad_input_is_one_line(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing" in err


def test_python_dash_m_diag_help():
    out = subprocess.run([sys.executable, "-m", "diag", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "analyze" in out.stdout


def _window_tables(shuffled: bool = False):
    import pandas as pd

    from diag.ground.tables import Tables

    s = 1_000_000_000
    requests = pd.DataFrame({"start_ns": [1 * s, 2 * s, 3 * s, 4 * s], "ttft_s": [0.1, 0.2, 0.3, 0.4]})
    # a long step under way when the window [2 s, 4 s) opens, one inside, one ending at its start, one after
    steps = pd.DataFrame({"start_ns": [0, int(0.5 * s), int(2.5 * s), 4 * s],
                          "end_ns": [2 * s, int(2.2 * s), int(2.8 * s), 5 * s]})
    series = pd.DataFrame({"ts_s": [1.0, 2.0, 3.9, 4.0], "value": [1.0, 2.0, 3.0, 4.0]})
    if shuffled:
        requests, steps, series = (df.iloc[::-1] for df in (requests, steps, series))
    empty = pd.DataFrame()
    return Tables(requests=requests, steps=steps, cold_starts=empty, spans=empty, series=series), (2 * s, 4 * s)


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_window_keeps_requests_that_start_in_it_and_steps_that_overlap_it(shuffled):
    tables, window = _window_tables(shuffled)
    w = tables.window(window)
    assert sorted(w.requests["ttft_s"]) == [0.2, 0.3]
    # the step from 0.5 s to 2.2 s was under way when the window opened; the one ending at 2 s was not
    assert sorted(w.steps["start_ns"]) == [500_000_000, 2_500_000_000]
    assert sorted(w.series["value"]) == [2.0, 3.0]
    assert tables.window(None) is tables


def test_the_rules_and_the_tui_cut_a_window_the_same_way():
    """The TUI cuts its window with Tables.window (tui.adapters, tui.app, tui.expose); the rules'
    features must see the same requests and steps."""
    from rules.features.context import FeatureContext

    tables, window = _window_tables()
    params = {}
    ctx = FeatureContext(tables, window, None, params)
    tui = tables.window(window)
    assert list(ctx.steps["start_ns"]) == list(tui.steps["start_ns"])
    assert list(ctx.req_all["ttft_s"]) == list(tui.requests["ttft_s"])
