"""Loading captures: round trips, and every kind of bad input gives a warning or one line."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.spans import setup_tracing
from diag.ground import stages
from diag.ground.capture import SPANS_FILE, CaptureError, CaptureWriter, load_capture


def _write(capture_dir, n=3):
    sink = setup_tracing("svc", capture_dir=capture_dir)
    for i in range(n):
        r = sink.start_request(f"r{i}")
        t0 = time.time_ns()
        r.record_stage("queue", t0, t0 + 1_000_000)
        r.add_token_time(t0 + 2_000_000)
        r.end()
    sink.shutdown()
    return capture_dir


def test_series_round_trip_parquet_and_csv(capture_dir):
    w = CaptureWriter(capture_dir)
    frame = pd.DataFrame({"ts_s": [1.0, 2.0], "source": "nvml", "series": stages.SERIES_GPU_UTIL_PCT,
                          "entity": "gpu0", "value": [10.0, 90.0]})
    w.write_series("nvml", frame)
    frame.assign(source="prometheus", series=stages.SERIES_KV_USAGE).to_csv(capture_dir / "series" / "prom.csv", index=False)
    w.close()
    cap = load_capture(capture_dir)
    assert sorted(cap.series["series"].unique()) == sorted([stages.SERIES_GPU_UTIL_PCT, stages.SERIES_KV_USAGE])
    assert cap.series["value"].sum() == 200.0


def test_truncated_last_line_warns_and_keeps_the_rest(capture_dir):
    _write(capture_dir)
    path = capture_dir / SPANS_FILE
    good = path.read_text()
    path.write_text(good + good.splitlines()[0][:50])  # a half-written line, no newline
    cap = load_capture(capture_dir)
    assert len(cap.spans) == 6
    assert any("truncated last line" in w and SPANS_FILE in w for w in cap.warnings)


def test_corrupt_line_names_file_and_line(capture_dir):
    _write(capture_dir)
    path = capture_dir / SPANS_FILE
    lines = path.read_text().splitlines()
    lines.insert(0, "{not json")
    lines.insert(1, json.dumps({"hello": "world"}))
    path.write_text("\n".join(lines) + "\n")
    cap = load_capture(capture_dir)
    assert len(cap.spans) == 6
    assert any(f"{SPANS_FILE}:1:" in w for w in cap.warnings)
    assert any(f"{SPANS_FILE}:2:" in w and "not an OTLP" in w for w in cap.warnings)


def test_duplicate_span_ids_are_dropped_with_a_warning(capture_dir):
    _write(capture_dir)
    path = capture_dir / SPANS_FILE
    path.write_text(path.read_text() * 2)
    cap = load_capture(capture_dir)
    assert len(cap.spans) == 6
    assert any("duplicate span ids" in w for w in cap.warnings)


def test_unknown_attributes_are_kept_in_extra(capture_dir):
    sink = setup_tracing(capture_dir=capture_dir)
    r = sink.start_request("x", attributes={"vendor.thing": "v", "vendor.n": 3})
    r.end()
    sink.shutdown()
    cap = load_capture(capture_dir)
    extra = cap.spans["extra"].dropna().iloc[0]
    assert extra == {"vendor.thing": "v", "vendor.n": 3}


def test_not_a_capture_and_missing_path_are_one_line_errors(tmp_path):
    with pytest.raises(CaptureError, match="no such capture"):
        load_capture(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CaptureError, match="not a capture") as exc:
        load_capture(tmp_path / "empty")
    assert "\n" not in str(exc.value)


def test_empty_capture_loads_with_a_warning(capture_dir):
    CaptureWriter(capture_dir).close()
    cap = load_capture(capture_dir)
    assert cap.spans.empty and any("no spans" in w for w in cap.warnings)


def test_bad_meta_json_is_a_warning(capture_dir):
    _write(capture_dir)
    (capture_dir / "meta.json").write_text("[1, 2")
    cap = load_capture(capture_dir)
    assert len(cap.spans) == 6 and any("meta.json" in w for w in cap.warnings)


def _compact(doc):
    """Compact JSON, as the writers produce it: it takes the Arrow fast path."""
    return json.dumps(doc, separators=(",", ":"))


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
_json = st.recursive(_json_leaf, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c, max_size=4)), max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_and_corrupted_captures_raise_only_capture_error(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("fuzz")
    sample_span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "queue", "startTimeUnixNano": "1", "endTimeUnixNano": "5",
                   "attributes": [{"key": "ttft.request.id", "value": {"stringValue": "r"}}]}
    base = _compact({"resourceSpans": [{"scopeSpans": [{"spans": [sample_span]}]}]})
    kind = data.draw(st.sampled_from(["random_json", "mutated", "bytes", "shapes"]))
    if kind == "random_json":
        text = "\n".join(_compact(x) for x in data.draw(st.lists(_json, max_size=5)))
    elif kind == "mutated":
        pos = data.draw(st.integers(0, len(base)))
        junk = data.draw(st.text(max_size=5))
        text = base[:pos] + junk + base[pos + len(junk):]
    elif kind == "shapes":
        span = dict(sample_span)
        key = data.draw(st.sampled_from(sorted(span)))
        span[key] = data.draw(_json)
        text = _compact({"resourceSpans": [{"resource": data.draw(_json), "scopeSpans": [{"spans": [span]}]}]})
        if data.draw(st.booleans()):
            text = text + "\n" + base
    else:
        (d / SPANS_FILE).write_bytes(data.draw(st.binary(max_size=200)))
        text = None
    if text is not None:
        (d / SPANS_FILE).write_text(text)
    if data.draw(st.booleans()):
        (d / "meta.json").write_text(data.draw(st.text(max_size=30)))
    try:
        cap = load_capture(d)
    except CaptureError as exc:
        assert "\n" not in str(exc)
        return
    from diag.ground.tables import build_tables, stage_decomposition

    stage_decomposition(build_tables(cap).requests)


@pytest.mark.parametrize("block_bytes", [None, 1 << 14], ids=["one-block", "streamed-blocks"])
def test_arrow_fast_path_and_line_reader_agree(capture_dir, monkeypatch, block_bytes):
    import diag.ground.capture_arrow as ca

    if block_bytes:
        monkeypatch.setattr(ca, "_BLOCK_BYTES", block_bytes)
    sink = setup_tracing("svc", capture_dir=capture_dir, export_interval_s=0.001)
    for i in range(20):
        if i == 10:
            sink.force_flush()  # more lines, and attributes the first block has not seen
        r = sink.start_request(f"r{i}", attributes={stages.GEN_AI_USAGE_INPUT_TOKENS: i, "vendor.x": [1.5, 2.5],
                                                    stages.ATTR_WARMUP: i == 0, stages.ATTR_SEGMENT: f"prompt={i}"})
        t0 = time.time_ns()
        r.record_stage("queue", t0, t0 + 1_000_000)
        r.add_token_time(t0 + 2_000_000)
        r.add_token_time(t0 + 3_000_000)
        if i >= 10:
            r.set_attributes({stages.ATTR_PREEMPTIONS: i})
        r.end(error="timeout" if i == 3 else None)
    sink.shutdown()
    fast = load_capture(capture_dir).spans
    assert ca.read_spans_arrow(capture_dir / SPANS_FILE, frozenset(), ()) is not None  # the fast path was taken
    monkeypatch.setattr(ca, "read_spans_arrow", lambda *a, **k: None)
    slow = load_capture(capture_dir).spans
    key = ["trace_id", "span_id"]
    fast = fast.sort_values(key).reset_index(drop=True)
    slow = slow.sort_values(key).reset_index(drop=True)
    assert set(fast.columns) == set(slow.columns)
    for col in ("trace_id", "span_id", "parent_span_id", "name", "service", "start_ns", "end_ns", "status_code", "kind"):
        assert fast[col].astype(str).tolist() == slow[col].astype(str).tolist(), col
    for col in (stages.GEN_AI_USAGE_INPUT_TOKENS, stages.ATTR_WARMUP, stages.ATTR_SEGMENT, stages.ATTR_ERROR,
                stages.ATTR_PREEMPTIONS):
        assert fast[col].tolist() == slow[col].tolist(), col
    tt_fast = [list(x) if x is not None else None for x in fast[stages.ATTR_TOKEN_TIMES_NS]]
    tt_slow = [list(x) if x is not None else None for x in slow[stages.ATTR_TOKEN_TIMES_NS]]
    assert tt_fast == tt_slow
    assert fast["extra"].dropna().tolist() == slow["extra"].dropna().tolist() == [{"vendor.x": [1.5, 2.5]}] * 20


def test_gzipped_spans_file_loads_the_same(capture_dir):
    import gzip

    _write(capture_dir, n=4)
    plain = load_capture(capture_dir).spans
    raw = (capture_dir / SPANS_FILE).read_bytes()
    (capture_dir / SPANS_FILE).unlink()
    (capture_dir / (SPANS_FILE + ".gz")).write_bytes(gzip.compress(raw))
    packed = load_capture(capture_dir)
    assert packed.warnings == []
    assert sorted(packed.spans["span_id"].astype(str)) == sorted(plain["span_id"].astype(str))
    (capture_dir / (SPANS_FILE + ".gz")).write_bytes(gzip.compress(raw)[:-20])  # cut short
    cut = load_capture(capture_dir)
    assert any("truncated" in w for w in cut.warnings)


def test_append_series_keeps_earlier_rows(capture_dir):
    w = CaptureWriter(capture_dir)
    one = pd.DataFrame({"ts_s": [1.0], "source": "client", "series": stages.SERIES_LOOP_LAG_S, "entity": "", "value": [0.1]})
    w.append_series("client", one)
    w.append_series("client", one.assign(ts_s=2.0, value=0.2))
    w.close()
    cap = load_capture(capture_dir)
    assert cap.series["value"].tolist() == [0.1, 0.2]
