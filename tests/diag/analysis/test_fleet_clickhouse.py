"""A fleet's traces in ClickHouse (the real engine, embedded by chdb): replicas' captures loaded into
the Collector's ``otel_traces`` table give, from ``ttft analyze --from-clickhouse``, the verdicts
their capture files give and name the slow replica; the database's aggregates are the captures'
numbers; the receiver's path fills the same table; bad input is one line."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from collectors.otlp_receiver import OTLPReceiver
from diag.ground import stages
from diag.analysis import analyze_paths
from diag.ground.capture import SPANS_FILE
from diag.cli import main
from diag.ground.clickhouse import connect
from diag.ground.clickhouse_load import OtelTracesWriter, load_captures
from diag.ground.exit_codes import BAD_INPUT
from diag.analysis.fleet_traces import StoreQuery, analyze_store, read_store
from diag.analysis.report.jsondoc import SCHEMA_PATH

from support.clickhouse_fleet import FLEET, SLOW, simulate_fleet

SINCE = ["--since", "2d"]  # the simulator's spans start an hour ago


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict[str, Path]], str]:
    """The replicas' captures and a chdb directory holding all of their spans, loaded by the CLI."""
    base = tmp_path_factory.mktemp("fleet")
    dirs = simulate_fleet(base / "caps")
    url = f"chdb:{base / 'db'}"
    caps = [str(d) for sides in dirs.values() for d in sides.values()]
    assert main(["export", *caps, "--to-clickhouse", url]) == 0
    return dirs, url


def _verdict(paths: list[Path]) -> tuple[str, float]:
    d = analyze_paths(paths).diagnosis
    return d.verdict.category, d.verdict.confidence


def test_each_replica_gets_its_capture_verdict_and_the_slow_one_is_named(
        fleet: tuple[dict[str, dict[str, Path]], str], capsys: pytest.CaptureFixture[str]) -> None:
    dirs, url = fleet
    assert main(["analyze", "--from-clickhouse", url, *SINCE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))).validate(doc)
    got = {r["name"]: (r["verdict"]["category"], r["verdict"]["confidence"]) for r in doc["replicas"]}
    assert set(got) == set(FLEET)
    for name, sides in dirs.items():
        assert got[name] == _verdict([sides["client"], sides["server"]]), name
    assert got[SLOW][0] == "engine_overhead" and all(got[n][0] == "healthy" for n in FLEET if n != SLOW)
    assert doc["hot"] == SLOW and doc["by"] == "service.instance.id"
    store = doc["store"]
    assert store["replicas"][SLOW]["judged_requests"] == store["replicas"][SLOW]["requests"] == 60
    assert len(store["slowest"][SLOW]) == 10 and store["slowest"][SLOW][0]["ttft_s"] > 0.03


def test_the_database_aggregates_are_the_captures_numbers(fleet: tuple[dict[str, dict[str, Path]], str]) -> None:
    dirs, url = fleet
    read = read_store(StoreQuery(url, since_s=2 * 86400, window_s=3600))
    summary = read.summary()
    for name, sides in dirs.items():
        dec = analyze_paths([sides["client"], sides["server"]], run_rules=False).decomposition
        mine = summary["replicas"][name]
        assert mine["ok_requests"] == dec["requests"]
        for q in ("p50", "p95", "p99", "max", "mean"):
            assert mine["ttft_s"][q] == pytest.approx(dec["ttft_s"][q], rel=1e-9, abs=1e-12), (name, q)
        for st, d in dec["stages"].items():
            assert mine["stages"][st]["share_of_ttft"] == pytest.approx(d["share_of_ttft"], rel=1e-9), (name, st)
            assert mine["stages"][st]["p95"] == pytest.approx(d["p95"], rel=1e-9, abs=1e-12), (name, st)
        assert sum(w["requests"] for w in mine["windows"]) == mine["requests"]
    assert summary["fleet"]["requests"] == sum(summary["replicas"][n]["requests"] for n in FLEET)


def test_the_sample_bounds_what_comes_back_not_the_aggregates(fleet: tuple[dict[str, dict[str, Path]], str]) -> None:
    _, url = fleet
    read = read_store(StoreQuery(url, since_s=2 * 86400, sample=5, slowest=2))
    assert read.sampled == {n: 5 for n in FLEET} and read.totals[SLOW] == 60
    roots = read.spans[read.spans["name"] == stages.SPAN_REQUEST]
    assert roots.groupby("replica").size().to_dict() == {n: 5 for n in FLEET}
    assert len(read.slowest) == 2 * len(FLEET)
    # the engine steps come from the sampled requests' time on, not the whole window
    steps = read.spans[read.spans["name"] == stages.SPAN_ENGINE_STEP]
    first = roots.groupby("replica")["start_ns"].min()
    assert (steps["start_ns"].to_numpy() >= steps["replica"].map(first).to_numpy() - 5e9).all()
    f = analyze_store(read)
    assert {r.name for r in f.replicas} == set(FLEET)


def test_service_and_label_choose_what_is_read(fleet: tuple[dict[str, dict[str, Path]], str]) -> None:
    _, url = fleet
    # the engine's traces only: the probe's spans stay in them (a trace-level filter)
    read = read_store(StoreQuery(url, since_s=2 * 86400, service="engine"))
    assert set(read.spans["service"].astype(str)) == {"engine", "probe"}
    # by service: one "replica" per service name; the request's replica is its server's
    read = read_store(StoreQuery(url, since_s=2 * 86400, by="service.name"))
    assert set(read.totals) == {"engine"}


def test_the_receivers_path_fills_the_same_table(tmp_path: Path, fleet: tuple[dict[str, dict[str, Path]], str]) -> None:
    dirs, _ = fleet
    url = f"chdb:{tmp_path / 'db'}"
    conn = connect(url)
    try:
        writer = OtelTracesWriter(conn, batch_rows=1)
        with OTLPReceiver(writer.append_span_request, port=0) as receiver:
            host, port = receiver.start()  # started already: the address bound
            for side in ("client", "server"):
                for line in (dirs[SLOW][side] / SPANS_FILE).read_bytes().splitlines():
                    c = http.client.HTTPConnection(host, port, timeout=10)
                    c.request("POST", "/v1/traces", body=line, headers={"Content-Type": "application/json"})
                    assert c.getresponse().status == 200
                    c.close()
        writer.close()
        via_receiver = conn.query_df("SELECT count() AS n FROM otel_traces")["n"].iloc[0]
    finally:
        conn.close()
    f = analyze_store(read_store(StoreQuery(url, since_s=2 * 86400)))
    assert [r.name for r in f.replicas] == [SLOW] and f.hot == SLOW
    assert f.replicas[0].category == _verdict([dirs[SLOW]["client"], dirs[SLOW]["server"]])[0]
    # the same rows as the capture loader writes
    url2 = f"chdb:{tmp_path / 'db2'}"
    conn = connect(url2)
    try:
        n, warnings = load_captures(conn, [dirs[SLOW]["client"], dirs[SLOW]["server"]])
    finally:
        conn.close()
    assert n == via_receiver and not warnings


def test_vllm_request_spans_are_read_from_their_latency_attributes(tmp_path: Path) -> None:
    cap = tmp_path / "vllm"
    cap.mkdir()
    t0 = 1_800_000_000 * 10**9
    spans = []
    for i in range(20):
        start = t0 + i * 10**9
        attrs = {stages.VLLM_TTFT: 0.5, stages.VLLM_QUEUE: 0.3, stages.VLLM_PREFILL: 0.15, stages.VLLM_E2E: 1.5,
                 stages.VLLM_DECODE: 1.0, stages.VLLM_PROMPT_TOKENS: 1024, stages.VLLM_COMPLETION_TOKENS: 64}
        spans.append({"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": stages.VLLM_SPAN_REQUEST,
                      "kind": 2, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + int(1.5e9)),
                      "attributes": [{"key": k, "value": {"doubleValue": v} if isinstance(v, float) else
                                      {"intValue": str(v)}} for k, v in attrs.items()]})
    doc = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "vllm"}},
        {"key": "host.name", "value": {"stringValue": "gpu-node-7"}}]}, "scopeSpans": [{"spans": spans}]}]}
    (cap / SPANS_FILE).write_text(json.dumps(doc) + "\n", encoding="utf-8")
    url = f"chdb:{tmp_path / 'db'}"
    assert main(["export", str(cap), "--to-clickhouse", url]) == 0
    read = read_store(StoreQuery(url, since_s=1e9, until_ns=t0 + 100 * 10**9, by="host.name"))
    rep = read.summary()["replicas"]["gpu-node-7"]
    dec = analyze_paths([cap], run_rules=False).decomposition
    assert rep["ok_requests"] == dec["requests"] == 20
    for st in ("queue", "prefill", "lumped"):
        assert rep["stages"][st]["share_of_ttft"] == pytest.approx(dec["stages"][st]["share_of_ttft"]), st
    f = analyze_store(read)
    assert f.replicas[0].category == analyze_paths([cap]).diagnosis.verdict.category


def test_attribute_values_keep_their_types_through_the_table() -> None:
    from diag.ground.otel_traces import decode_value, encode_value

    cases = [({"intValue": "1700000000123456789"}, "1700000000123456789", 1700000000123456789),
             ({"doubleValue": 0.1}, "0.1", 0.1), ({"doubleValue": 1.0}, "1", 1),
             ({"doubleValue": 1e-7}, "1e-7", 1e-7), ({"doubleValue": 2.5e21}, "2.5e+21", 2.5e21),
             ({"boolValue": True}, "true", True), ({"boolValue": False}, "false", False),
             ({"arrayValue": {"values": [{"intValue": "1"}, {"intValue": "22"}]}}, "[1,22]", [1, 22]),
             ({"stringValue": "http_503"}, "http_503", "http_503")]
    for value, text, back in cases:
        assert encode_value(value) == text
        assert decode_value("some.key", text) == back
    # text that reads as a number stays text where the key holds text
    assert decode_value(stages.ATTR_REQUEST_ID, "17") == "17" and decode_value(stages.ATTR_SEGMENT, "64") == "64"
    assert np.isclose(decode_value("x", encode_value({"doubleValue": 0.30000000000000004})), 0.30000000000000004)


def test_bad_input_is_one_line(tmp_path: Path, fleet: tuple[dict[str, dict[str, Path]], str],
                               capsys: pytest.CaptureFixture[str]) -> None:
    _, url = fleet
    cases = [
        (["--from-clickhouse", "ftp://somewhere"], "not a ClickHouse URL"),
        (["--from-clickhouse", url, "--table", "nope", *SINCE], "no table default.nope"),
        (["--from-clickhouse", url, "--since", "1m"], "no request spans"),
        (["--from-clickhouse", url, "--since", "soon"], "bad duration"),
        (["--from-clickhouse", url, *SINCE, "--by", "k8s.pod.name"], "no span carries a replica label"),
        (["--from-clickhouse", url, "--table", "otel_traces; DROP TABLE x", *SINCE], "bad table name"),
        (["--from-clickhouse", "http://127.0.0.1:9", *SINCE], "unreachable"),
        (["--from-clickhouse", url, *SINCE, "--from-prometheus", "http://127.0.0.1:9"], "unreachable"),
        (["--from-clickhouse", url, str(tmp_path)], "not both"),
    ]
    for argv, want in cases:
        assert main(["analyze", *argv]) == BAD_INPUT, argv
        err = capsys.readouterr().err.strip()
        assert want in err and len(err.splitlines()) == 1, (argv, err)
    assert main(["export", str(tmp_path), "--to-clickhouse", url]) == BAD_INPUT
    assert "no spans.otlp.jsonl" in capsys.readouterr().err


def test_what_was_read_is_kept_as_captures_for_the_other_commands(
        tmp_path: Path, fleet: tuple[dict[str, dict[str, Path]], str], capsys: pytest.CaptureFixture[str]) -> None:
    dirs, url = fleet
    kept = tmp_path / "kept"
    assert main(["analyze", "--from-clickhouse", url, *SINCE, "-o", str(kept), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in kept.iterdir()) == sorted(FLEET)
    by_name = {r["name"]: r["verdict"]["category"] for r in doc["replicas"]}
    for name in FLEET:
        assert analyze_paths([kept / name]).diagnosis.verdict.category == by_name[name] == \
            _verdict([dirs[name]["client"], dirs[name]["server"]])[0]
    assert main(["report", str(kept / SLOW), "-o", str(tmp_path / "r.md")]) == 0
    assert main(["diff", str(kept / "replica-a"), str(kept / SLOW)]) == 0
    assert main(["export", str(kept / SLOW), "-o", str(tmp_path / "r.csv")]) == 0
    assert "queue" in capsys.readouterr().out


def test_series_join_each_replica_by_name(fleet: tuple[dict[str, dict[str, Path]], str]) -> None:
    """``--from-prometheus`` beside ``--from-clickhouse``: a replica gets the series rows whose
    instance is its name, the fleet all of them."""
    import pandas as pd

    _, url = fleet
    rows = [(1000.0 + k, "prometheus", stages.SERIES_WAITING, name, 3.0) for k in range(5) for name in (SLOW, "other")]
    series = pd.DataFrame(rows, columns=list(stages.SERIES_COLUMNS))
    f = analyze_store(read_store(StoreQuery(url, since_s=2 * 86400)), series=series)
    got = {r.name: set(r.analysis.tables.series["entity"]) for r in f.replicas}
    assert got[SLOW] == {SLOW} and got["replica-a"] == set()
    assert set(f.fleet.tables.series["entity"]) == {SLOW, "other"}
