"""What the probe writes into a capture, read back through diag.ground.capture / diag.ground.tables."""

from __future__ import annotations

import json

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe
from collectors.probe.health import runq_wait_s
from diag.ground import stages
from diag.ground.capture import load_capture
from diag.ground.tables import build_tables


def _run(server, tmp_path, mode="ok", **kw):
    cfg = ProbeConfig(server.url(mode), api="chat", load=LoadSpec(concurrency=2, requests=4, warmup_requests=1),
                      workload=WorkloadSpec(LengthSpec.parse("24"), LengthSpec.parse("3")), timeout_s=5,
                      output=tmp_path / "cap", **kw)
    return run_probe(cfg), tmp_path / "cap"


def test_client_spans_load_back_with_ttft(server, tmp_path):
    res, cap_dir = _run(server, tmp_path)
    cap = load_capture(cap_dir)
    assert not cap.warnings
    tables = build_tables(cap)
    req = tables.requests
    calib = req["segment"] == "calibrate"  # the two length-calibration requests (warm-up)
    assert calib.sum() == 2 and req.loc[calib, "warmup"].all()
    compat = req["segment"] == "compat"  # the compatibility check's one request (warm-up)
    assert compat.sum() == 1 and req.loc[compat, "warmup"].all()
    req = req.loc[~calib & ~compat]
    assert len(req) == 5 and req["has_client"].all() and not req["has_server"].any()
    by_id = {r.trace_id: r for r in res.results}
    for _, row in req.iterrows():
        r = by_id[row["trace_id"]]
        assert abs(row["client_ttft_s"] - r.ttft_s) < 1e-6
        assert row["output_tokens"] == 3 and row["input_tokens"] == 17
    assert req["warmup"].sum() == 1
    spans = cap.spans
    root = spans.loc[(spans["name"] == stages.SPAN_CLIENT_REQUEST) & (spans[stages.ATTR_SEGMENT] != "calibrate")]
    assert (root[stages.ATTR_SIDE] == "client").all()
    for key in (stages.ATTR_CLIENT_CONNECTED_NS, stages.ATTR_CLIENT_SENT_NS, stages.ATTR_CLIENT_HEADERS_NS,
                stages.ATTR_CLIENT_FIRST_EVENT_NS, stages.ATTR_CLIENT_LAST_NS, stages.ATTR_CLIENT_SLOT_WAIT_S,
                stages.ATTR_CLIENT_SCHEDULED_NS, stages.ATTR_TOKEN_TIMES_NS):
        assert root[key].notna().all(), key
    assert (root[stages.ATTR_CLIENT_USAGE_SOURCE] == "server").all()
    assert stages.ATTR_PROMPT_TEXT not in spans.columns  # never recorded unless asked


def test_meta_and_client_health_series(server, tmp_path):
    _, cap_dir = _run(server, tmp_path)
    meta = json.loads((cap_dir / "meta.json").read_text())
    assert meta["kind"] == "probe"
    assert meta["probe"]["api"] == "chat" and meta["probe"]["model"] == "fake-model"
    assert meta["probe"]["load"]["concurrency"] == 2 and meta["probe"]["workload"]["input_tokens"] == "fixed:24"
    assert meta["probe"]["event_loop"] in ("uvloop", "asyncio")  # which loop timed the requests
    assert "role-only" in meta["ttft_boundary"]["client_note"]
    assert meta["ttft_boundary"]["client"] == stages.CLIENT_BOUNDARY.to_dict()
    assert meta["token_counts"]["source"] == "server"
    assert meta["output_lengths"]["honoured"] is True and meta["output_lengths"]["exact_requested"] is True
    h = meta["client_health"]
    assert set(h) >= {"loop_lag_p99_s", "cpu_pct_max", "saturated", "reason", "first_token", "machine_starved"}
    assert h["first_token"]["requests"] == 4 and h["processes"] == 1  # the lag judged at the 4 requests' TTFT
    assert meta["probe_results"]["overall"]["requests"]["total"] == 4
    series = load_capture(cap_dir).series
    client = series.loc[series["source"] == "client"]
    expected = {stages.SERIES_LOOP_LAG_S, stages.SERIES_CLIENT_CPU_PCT}
    if runq_wait_s() is not None:  # Linux: the machine's part of each lag sample
        expected.add(stages.SERIES_LOOP_STARVED_S)
    assert set(client["series"]) == expected


def test_errors_land_on_spans(server, tmp_path):
    _, cap_dir = _run(server, tmp_path, mode="http503")
    req = build_tables(load_capture(cap_dir)).requests
    assert (req["error"] == "http_5xx").all() and req["client_ttft_s"].isna().all()
    spans = load_capture(cap_dir).spans
    assert (spans[stages.ATTR_CLIENT_HTTP_STATUS] == 503).all()


def test_record_prompts_on_request(server, tmp_path):
    _, cap_dir = _run(server, tmp_path, record_prompts=True)
    spans = load_capture(cap_dir).spans
    assert spans[stages.ATTR_PROMPT_TEXT].notna().all()
