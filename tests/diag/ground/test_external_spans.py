"""Engine span adapters: vLLM, TGI and SGLang spans onto our stages."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.ground import external_spans as es
from diag.ground import stages

VLLM_ATTRS = {
    "gen_ai.request.id": "cmpl-1",
    "gen_ai.request.model": "meta-llama/Llama-3.1-8B-Instruct",
    "gen_ai.latency.time_to_first_token": 0.50,
    "gen_ai.latency.time_in_queue": 0.10,
    "gen_ai.latency.time_in_model_prefill": 0.30,
    "gen_ai.latency.time_in_model_decode": 1.00,
    "gen_ai.latency.time_in_model_inference": 1.30,
    "gen_ai.latency.e2e": 1.60,
    "gen_ai.usage.prompt_tokens": 1000,
    "gen_ai.usage.completion_tokens": 50,
}
TGI_ATTRS = {
    "parameters": "GenerateParameters { max_new_tokens: Some(20) }",
    "total_time": "1.502345ms",
    "validation_time": "850µs",
    "queue_time": "12ns",
    "inference_time": "640µs",
    "time_per_token": "32µs",
    "seed": "None",
}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("12.3ms", 0.0123), ("1.2s", 1.2), ("850µs", 850e-6), ("3.1µs", 3.1e-6), ("3.1μs", 3.1e-6),
        ("3.1us", 3.1e-6), ("12ns", 12e-9), ("0ns", 0.0), ("1.000000001s", 1.000000001), ("3600s", 3600.0),
        (" 5ms ", 0.005), (2.5, 2.5), (3, 3.0),
    ],
)
def test_rust_duration_parser(text, seconds):
    assert es.parse_rust_duration_s(text) == pytest.approx(seconds, rel=1e-12, abs=0)


@pytest.mark.parametrize("bad", [None, "", "ms", "12", "12 parsecs", "-1ms", "1.2.3s", "NaNs", True, float("nan"), -3.0, [1]])
def test_rust_duration_parser_rejects(bad):
    assert es.parse_rust_duration_s(bad) is None


def _rust_debug(ns: int) -> str:
    """Rust's Debug for Duration: the largest unit with a non-zero integer part, trimmed."""
    for unit, scale in (("s", 10**9), ("ms", 10**6), ("µs", 10**3)):
        if ns >= scale:
            whole, frac = divmod(ns, scale)
            digits = len(str(scale)) - 1
            f = str(frac).rjust(digits, "0").rstrip("0")
            return f"{whole}.{f}{unit}" if f else f"{whole}{unit}"
    return f"{ns}ns"


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**13))
def test_rust_duration_round_trip(ns):
    text = _rust_debug(ns)
    assert es.parse_rust_duration_s(text) == pytest.approx(ns / 1e9, rel=1e-12, abs=1e-18)
    vec = es._parse_duration_series(pd.Series([text], dtype=object))
    assert vec[0] == pytest.approx(ns / 1e9, rel=1e-12, abs=1e-18)


def test_detect_engine():
    assert es.detect_engine("llm_request", {}) == "vllm"
    semconv = {**VLLM_ATTRS, "gen_ai.operation.name": "chat"}
    assert es.detect_engine("chat meta-llama/Llama-3.1-8B-Instruct", semconv) == "vllm"
    assert es.detect_engine("generate_stream", TGI_ATTRS) == "tgi"
    assert es.detect_engine("chat_completions", TGI_ATTRS) == "tgi"
    assert es.detect_engine(" Req 3f2a9c1b", {"rid": "3f2a9c1b44"}) == "sglang"
    assert es.detect_engine("prefill_forward", {}) == "sglang"
    assert es.detect_engine("Bootstrap Room 0x0", {"bootstrap_room": "0x0"}) == "sglang"
    # ours, or ambiguous
    assert es.detect_engine(stages.SPAN_REQUEST, {stages.ATTR_SIDE: "server"}) is None
    assert es.detect_engine("tokenize", {}) is None
    assert es.detect_engine("chat gpt-4o", {"gen_ai.operation.name": "chat"}) is None  # a client span, no latencies
    assert es.detect_engine("GET /health", {}) is None


def test_adapt_vllm_llm_request():
    r = es.adapt_span("llm_request", VLLM_ATTRS, 1_000_000_000, 2_600_000_000)
    assert r is not None and r.engine == "vllm"
    assert r.stages_s == pytest.approx({stages.QUEUE: 0.10, stages.PREFILL: 0.30, stages.DECODE: 1.00})
    assert r.server_ttft_s == 0.50 and r.e2e_s == 1.60
    assert (r.input_tokens, r.output_tokens) == (1000, 50)
    assert r.lumped_stage == stages.LUMPED
    assert r.lumped_s == pytest.approx(0.10)  # 0.5 - 0.1 - 0.3
    # vLLM's TTFT starts after the chat template and tokenization and ends before the first
    # detokenize: the lumped part is what lies between, not tokenization
    assert "tokenization" in r.lumped_note and "outside" in r.lumped_note and "IPC" in r.lumped_note
    assert r.inference_s == 1.30 and r.model.startswith("meta-llama")
    assert math.isnan(r.cached_tokens)
    r = es.adapt_span("llm_request", {**VLLM_ATTRS, "gen_ai.usage.cached_tokens": 640}, 0, 1)
    assert r.cached_tokens == 640


def test_adapt_vllm_semconv_name_and_new_usage_keys():
    attrs = {k: v for k, v in VLLM_ATTRS.items() if not k.startswith("gen_ai.usage.")}
    attrs |= {"gen_ai.operation.name": "text_completion", "gen_ai.usage.input_tokens": 7, "gen_ai.usage.output_tokens": 3}
    r = es.adapt_span("text_completion meta-llama/Llama-3.1-8B-Instruct", attrs, 0, 1)
    assert r is not None and r.engine == "vllm"
    assert (r.input_tokens, r.output_tokens) == (7, 3)


def test_adapt_vllm_missing_and_inconsistent_fields():
    r = es.adapt_span("llm_request", {"gen_ai.latency.time_to_first_token": 0.2}, 0, 3_000_000_000)
    assert r is not None
    assert r.stages_s == {}
    assert math.isnan(r.lumped_s) and r.lumped_stage is None
    assert r.e2e_s == pytest.approx(3.0)  # from the span's own duration
    # engine-core and frontend clocks disagree: TTFT < queue + prefill -> nothing lumped, not negative
    r = es.adapt_span("llm_request", {**VLLM_ATTRS, "gen_ai.latency.time_to_first_token": 0.39}, 0, 1)
    assert r.lumped_s == 0.0
    # strings and bools are not numbers
    r = es.adapt_span("llm_request", {**VLLM_ATTRS, "gen_ai.latency.time_in_queue": "soon", "gen_ai.usage.prompt_tokens": True}, 0, 1)
    assert stages.QUEUE not in r.stages_s and math.isnan(r.input_tokens)


def test_adapt_tgi():
    r = es.adapt_span("generate", TGI_ATTRS, 0, 1)
    assert r is not None and r.engine == "tgi"
    assert r.e2e_s == pytest.approx(1.502345e-3)
    assert r.stages_s[stages.TOKENIZE] == pytest.approx(850e-6)
    assert r.stages_s[stages.QUEUE] == pytest.approx(12e-9)
    assert r.inference_s == pytest.approx(640e-6)
    assert r.output_tokens == 20  # 640µs / 32µs
    assert math.isnan(r.server_ttft_s)  # TGI does not split prefill from decode
    r = es.adapt_span("generate", {**TGI_ATTRS, "queue_time": "garbage"}, 0, 1)
    assert stages.QUEUE not in r.stages_s


def test_adapt_span_ignores_others():
    assert es.adapt_span("prefill_forward", {}, 0, 1) is None  # SGLang needs the trace
    assert es.adapt_span(stages.SPAN_REQUEST, {}, 0, 1) is None
    assert es.adapt_span("llm_request", None, 0, 1) is not None


def test_adapter_notes_cover_every_engine():
    notes = es.adapter_notes()
    assert set(notes) == {"vllm", "tgi", "sglang"}
    assert "lumped" in notes["vllm"] and "prefill" in notes["tgi"]


MS = 1_000_000


def _sglang_trace(trace_id: str, t0: int) -> list[dict]:
    """One SGLang request as its tracing package lays it out (times in ns)."""
    rows = [
        dict(span_id="b0", parent_span_id="", name="Bootstrap Room 0x0", start_ns=t0, end_ns=t0 + 900 * MS,
             attributes={"bootstrap_room": "0x0"}),
        dict(span_id="r0", parent_span_id="b0", name=" Req 5e1f0a2b", start_ns=t0, end_ns=t0 + 900 * MS,
             attributes={"rid": "5e1f0a2b77c1"}),
        dict(span_id="th0", parent_span_id="r0", name="Tokenizer (host:1a2b3c4d | pid:11)", start_ns=t0,
             end_ns=t0 + 20 * MS, attributes={"host_id": "1a2b3c4d", "pid": 11, "thread_label": "Tokenizer"}),
        dict(span_id="s1", parent_span_id="th0", name="tokenize", start_ns=t0, end_ns=t0 + 5 * MS, attributes={}),
        dict(span_id="s2", parent_span_id="th0", name="dispatch", start_ns=t0 + 5 * MS, end_ns=t0 + 7 * MS, attributes={}),
        dict(span_id="th1", parent_span_id="r0", name="Scheduler [TP 0] (host:1a2b3c4d | pid:12)",
             start_ns=t0 + 7 * MS, end_ns=t0 + 900 * MS,
             attributes={"host_id": "1a2b3c4d", "pid": 12, "thread_label": "Scheduler", "tp_rank": 0}),
        dict(span_id="s3", parent_span_id="th1", name="request_process", start_ns=t0 + 7 * MS, end_ns=t0 + 8 * MS, attributes={}),
        dict(span_id="s4", parent_span_id="th1", name="prefill_waiting", start_ns=t0 + 8 * MS, end_ns=t0 + 58 * MS, attributes={}),
        dict(span_id="s5", parent_span_id="th1", name="chunked_prefill", start_ns=t0 + 58 * MS, end_ns=t0 + 98 * MS, attributes={}),
        dict(span_id="s6", parent_span_id="th1", name="prefill_forward", start_ns=t0 + 98 * MS, end_ns=t0 + 138 * MS, attributes={}),
        dict(span_id="s7", parent_span_id="th1", name="decode_loop", start_ns=t0 + 138 * MS, end_ns=t0 + 898 * MS, attributes={}),
    ]
    for r in rows:
        r["trace_id"] = trace_id
        r["service"] = "sglang"
    return rows


def _span_table() -> pd.DataFrame:
    rows = [
        dict(trace_id="t-vllm", span_id="v1", parent_span_id="c1", name="llm_request", start_ns=10 * MS,
             end_ns=1610 * MS, service="vllm", attributes=VLLM_ATTRS),
        dict(trace_id="t-tgi", span_id="g1", parent_span_id="", name="generate_stream", start_ns=5 * MS,
             end_ns=7 * MS, service="tgi", attributes=TGI_ATTRS),
        # children of TGI's span carry no timing fields
        dict(trace_id="t-tgi", span_id="g2", parent_span_id="g1", name="queued", start_ns=5 * MS, end_ns=6 * MS,
             service="tgi", attributes={}),
        # our own spans give no external rows
        dict(trace_id="t-ours", span_id="o1", parent_span_id="", name=stages.SPAN_REQUEST, start_ns=0, end_ns=MS,
             service="ttft", attributes={stages.ATTR_SIDE: "server"}),
        dict(trace_id="t-ours", span_id="o2", parent_span_id="o1", name="tokenize", start_ns=0, end_ns=MS // 2,
             service="ttft", attributes={}),
    ] + _sglang_trace("t-sgl", 20 * MS)
    return pd.DataFrame(rows)


def test_adapt_spans_frame_all_engines():
    out = es.adapt_spans_frame(_span_table())
    assert list(out.columns) == list(es.REQUEST_COLUMNS + es.EXTRA_COLUMNS)
    assert list(out["engine"]) == ["tgi", "vllm", "sglang"]  # sorted by start_ns
    by = out.set_index("engine")
    v = by.loc["vllm"]
    assert v["trace_id"] == "t-vllm" and v["span_id"] == "v1"
    assert (v["queue_s"], v["prefill_s"], v["decode_s"]) == (0.10, 0.30, 1.00)
    assert v["lumped_s"] == pytest.approx(0.10) and np.isnan(v["tokenize_s"])
    assert v["server_ttft_s"] == 0.5 and v["input_tokens"] == 1000 and v["output_tokens"] == 50
    t = by.loc["tgi"]
    assert t["e2e_s"] == pytest.approx(1.502345e-3) and t["tokenize_s"] == pytest.approx(850e-6)
    assert t["output_tokens"] == 20 and np.isnan(t["prefill_s"]) and np.isnan(t["server_ttft_s"])
    s = by.loc["sglang"]
    assert s["trace_id"] == "t-sgl" and s["span_id"] == "r0"
    assert s["tokenize_s"] == pytest.approx(0.005)
    assert s["queue_s"] == pytest.approx(0.050)
    assert s["prefill_s"] == pytest.approx(0.080)  # chunked 40 ms + last chunk 40 ms
    assert s["decode_s"] == pytest.approx(0.760)
    assert s["server_ttft_s"] == pytest.approx(0.138)
    assert s["lumped_s"] == pytest.approx(0.138 - 0.005 - 0.050 - 0.080)  # dispatch + request_process
    assert s["e2e_s"] == pytest.approx(0.900)
    assert "dispatch" in s["lumped_note"]


def test_adapt_spans_frame_sglang_nested_chunk_not_double_counted():
    rows = _sglang_trace("t", 0)
    for r in rows:
        if r["name"] == "chunked_prefill":  # now inside prefill_forward
            r["parent_span_id"] = "s6"
            r["start_ns"], r["end_ns"] = 98 * MS, 118 * MS
    out = es.adapt_spans_frame(pd.DataFrame(rows))
    assert out.loc[0, "prefill_s"] == pytest.approx(0.040)


def test_adapt_spans_frame_capture_layout():
    """The capture loader's layout: known attributes as columns, the rest in ``extra``."""
    df = _span_table()
    attrs = df.pop("attributes")
    known = sorted({k for a in attrs for k in a if k.startswith("gen_ai.")})
    for k in known:
        df[k] = [a.get(k) for a in attrs]
    df["extra"] = [{k: v for k, v in a.items() if k not in known} or None for a in attrs]
    out = es.adapt_spans_frame(df)
    ref = es.adapt_spans_frame(_span_table())
    pd.testing.assert_frame_equal(out, ref)


def test_adapt_spans_frame_empty_and_unknown():
    empty = es.adapt_spans_frame(pd.DataFrame(columns=["trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns", "attributes"]))
    assert list(empty.columns) == list(es.REQUEST_COLUMNS + es.EXTRA_COLUMNS) and len(empty) == 0
    only_ours = _span_table().iloc[3:5]
    assert len(es.adapt_spans_frame(only_ours)) == 0


def test_adapt_spans_frame_matches_adapt_span():
    df = _span_table()
    out = es.adapt_spans_frame(df).set_index("engine")
    for eng, i in (("vllm", 0), ("tgi", 1)):
        r = es.adapt_span(df.loc[i, "name"], df.loc[i, "attributes"], df.loc[i, "start_ns"], df.loc[i, "end_ns"])
        row = out.loc[eng]
        for stage, val in r.stages_s.items():
            assert row[stages.stage_column(stage)] == pytest.approx(val)
        for col in ("server_ttft_s", "e2e_s", "lumped_s", "output_tokens"):
            a, b = getattr(r, col), row[col]
            assert (np.isnan(a) and np.isnan(b)) or a == pytest.approx(b)


def test_adapt_spans_frame_vectorised_at_scale():
    n = 20000
    df = pd.DataFrame({
        "trace_id": [f"{i:032x}" for i in range(n)],
        "span_id": [f"{i:016x}" for i in range(n)],
        "parent_span_id": "",
        "name": "llm_request",
        "start_ns": np.arange(n, dtype="int64") * MS,
        "end_ns": np.arange(n, dtype="int64") * MS + 1600 * MS,
        "service": "vllm",
        "attributes": [VLLM_ATTRS] * n,
    })
    out = es.adapt_spans_frame(df)
    assert len(out) == n
    assert np.allclose(out["lumped_s"], 0.1)


# --- the TTFT boundaries, as the engines' source sets them ----------------------------------------


def _otlp(trace_id: str, spans: list[tuple[str, str, int, int, dict]]) -> dict:
    def kv(k, v):
        if isinstance(v, bool):
            return {"key": k, "value": {"boolValue": v}}
        if isinstance(v, int):
            return {"key": k, "value": {"intValue": str(v)}}
        if isinstance(v, float):
            return {"key": k, "value": {"doubleValue": v}}
        return {"key": k, "value": {"stringValue": str(v)}}

    out = []
    for i, (name, service, start, end, attrs) in enumerate(spans):
        out.append({"resourceSpans": [{"resource": {"attributes": [kv("service.name", service)]},
                                       "scopeSpans": [{"scope": {"name": "t"}, "spans": [{
                                           "traceId": trace_id, "spanId": f"{i + 1:016x}", "parentSpanId": "",
                                           "name": name, "kind": 2, "startTimeUnixNano": str(start),
                                           "endTimeUnixNano": str(end),
                                           "attributes": [kv(k, v) for k, v in attrs.items()], "status": {}}]}]}]})
    return out


def test_vllm_client_gap_is_lumped_not_network(tmp_path):
    """A probe request joined with vLLM's llm_request: client TTFT 0.58 s, vLLM's 0.50 s. The
    0.08 s between holds the API server's tokenization and first detokenize, so it is not network."""
    from diag.ground.capture import CaptureWriter, load_capture
    from diag.ground.tables import build_tables

    t0 = 1_767_225_600 * 1_000_000_000
    tid = "0af7651916cd43dd8448eb211c80319c"
    client = {stages.ATTR_CLIENT_START_NS: t0, stages.ATTR_CLIENT_FIRST_CONTENT_NS: t0 + 580 * MS,
              stages.ATTR_CLIENT_LAST_NS: t0 + 1700 * MS}
    with CaptureWriter(tmp_path / "cap") as w:
        for doc in _otlp(tid, [(stages.SPAN_CLIENT_REQUEST, "probe", t0, t0 + 1700 * MS, client),
                               ("llm_request", "vllm", t0 + 50 * MS, t0 + 1650 * MS, VLLM_ATTRS)]):
            w.append_span_request(doc)
    t = build_tables(load_capture(tmp_path / "cap"))
    req = t.requests
    assert len(req) == 1 and req["engine"].iloc[0] == "vllm"
    row = req.iloc[0]
    assert row["client_ttft_s"] == pytest.approx(0.58) and row["server_ttft_s"] == pytest.approx(0.50)
    assert math.isnan(row["network_s"])
    assert row["lumped_s"] == pytest.approx(0.10 + 0.08)  # server-side remainder + the client-server gap
    assert bool(row["gap_includes_frontend"])
    assert "tokenization" in row["lumped_note"] and "network" in row["lumped_note"]
    # the decomposition still adds up to what the client saw
    assert row["queue_s"] + row["prefill_s"] + row["lumped_s"] == pytest.approx(row["client_ttft_s"])
    assert "not called network" in t.lumped_notes["vllm"]


def test_fold_client_gap_leaves_other_engines_network():
    req = pd.DataFrame({"engine": ["tgi", None, "vllm"], "network_s": [0.02, 0.03, np.nan],
                        "lumped_s": [np.nan, np.nan, 0.01], "lumped_note": ["", None, "x"]})
    out = es.fold_client_gap(req.copy())
    assert out["network_s"].iloc[0] == 0.02 and out["network_s"].iloc[1] == 0.03
    assert out["lumped_s"].iloc[2] == 0.01 and out["lumped_note"].iloc[2] == "x"  # no client side: nothing to move
    assert out["gap_includes_frontend"].tolist() == [False, False, True]


def test_sglang_root_ttft_is_preferred_over_the_scheduler_clock():
    rows = _sglang_trace("t1", 0)
    rows[1]["attributes"] = {"rid": "5e1f0a2b77c1", "gen_ai.latency.time_to_first_token": 0.145,
                             "gen_ai.latency.e2e": 0.9}
    out = es.adapt_spans_frame(pd.DataFrame(rows))
    assert out["server_ttft_s"].iloc[0] == pytest.approx(0.145)  # not 0.138, the last prefill slice's end
    without = es.adapt_spans_frame(pd.DataFrame(_sglang_trace("t2", 0)))
    assert without["server_ttft_s"].iloc[0] == pytest.approx(0.138)


def test_sglang_root_with_operation_name_is_not_vllm():
    attrs = {"rid": "5e1f0a2b77c1", "gen_ai.operation.name": "chat", "gen_ai.latency.time_to_first_token": 0.1,
             "gen_ai.latency.e2e": 0.9}
    assert es.detect_engine(" Req 5e1f0a2b", attrs) == "sglang"
    rows = _sglang_trace("t1", 0)
    rows[1]["attributes"] = attrs
    out = es.adapt_spans_frame(pd.DataFrame(rows))
    assert out["engine"].tolist() == ["sglang"]
    # vLLM's semconv span is still vLLM
    assert es.detect_engine("chat m", {**VLLM_ATTRS, "gen_ai.operation.name": "chat"}) == "vllm"


def test_notes_state_each_boundary():
    notes = es.adapter_notes()
    assert "after the chat template and tokenization" in notes["vllm"]
    assert "all chunks" in notes["sglang"] and "gen_ai.latency.time_to_first_token" in notes["sglang"]
