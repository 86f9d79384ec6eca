"""Disaggregated prefill/decode (``--pd``): a decode worker process with its own model copy, KV cache
and step loop gets each request's KV by send/recv; the same tokens as the colocated engine; spans,
metrics, waits on the decode side, a slow link, and a shutdown that leaves no process behind."""

from __future__ import annotations

import json
import sys
import time
import urllib.request

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diag.ground import stages
from diag.bundled_engine import SamplingParams, SyncEventStream, build_engine, parse_injections
from diag.bundled_engine.config import EngineConfig
from support.engine_testutil import LAUNCH, finished_spans, serve_process, spans_by_request

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=6, temperature=0.9, seed=11, ignore_eos=True)
PROMPTS = ([5, 6, 7, 8, 9, 10], list(range(300, 400)), list(range(40, 90)))
KV_BYTES_PER_TOKEN = 2048  # tiny: 2 x 4 layers x 2 kv heads x 32 dims x 4 bytes


def test_pd_is_refused_with_tp_or_pp_and_its_knobs_need_it():
    with pytest.raises(ValueError, match="--pd with --tp 2: the bundled engine does not combine"):
        EngineConfig(pd=True, tp=2).validate()
    with pytest.raises(ValueError, match="--pd with --pp 2"):
        EngineConfig(pd=True, pp=2).validate()
    with pytest.raises(ValueError, match="need --pd"):
        EngineConfig(pd_decode_kv_blocks=4).validate()
    with pytest.raises(ValueError, match="need --pd"):
        EngineConfig(faults=parse_injections(["kv_transfer_ms_per_mb=5"])).validate()
    with pytest.raises(ValueError, match="must be >= 1"):
        EngineConfig(pd=True, pd_decode_kv_blocks=0).validate()
    # the decode worker's cache bounds the context served
    assert EngineConfig(pd=True, pd_decode_kv_blocks=8, max_context=512).context_tokens(2048) == 128


@pytest.fixture(scope="module")
def pd_engine():
    eng = build_engine(model="tiny", pd=True, trace_memory=True, max_running=8)
    yield eng
    eng.shutdown()


def _tokens(engine, prompt, params=GREEDY) -> list[int]:
    return [e.token_id for e in engine.generate(prompt, params)[1] if e.token_id is not None]


def _new_spans(engine, before: set[int]):
    return [s for s in finished_spans(engine) if s.context.span_id not in before]


def _metrics(engine) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(engine.metrics.exposition()[0].decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))] = s.value
    return out


def test_pd_output_equals_the_colocated_engines_greedy_and_seeded(pd_engine):
    ref = build_engine(model="tiny", warmup=False)
    try:
        want = [_tokens(ref, p) for p in PROMPTS]
        want_seeded = [_tokens(ref, p, SEEDED) for p in PROMPTS]
    finally:
        ref.shutdown()
    assert [_tokens(pd_engine, p) for p in PROMPTS] == want
    # the sampler's generator state crosses with the KV: a seeded stream continues on the decode side
    assert [_tokens(pd_engine, p, SEEDED) for p in PROMPTS] == want_seeded
    streams = []
    for p in PROMPTS:  # together: prefilled in one step, decoded in one batch
        s = SyncEventStream()
        pd_engine.submit(s.push, GREEDY, prompt_ids=p)
        streams.append(s)
    assert [[e.token_id for e in s if e.token_id is not None] for s in streams] == want


def test_pd_spans_each_request_prefill_transfer_decode_queue_and_they_add_up(pd_engine):
    before = {s.context.span_id for s in finished_spans(pd_engine)}
    for p in PROMPTS:
        pd_engine.generate(p, GREEDY)
    spans = _new_spans(pd_engine, before)
    reqs = spans_by_request(spans)
    assert len(reqs) == len(PROMPTS)
    for by in reqs.values():
        root = by[stages.SPAN_REQUEST][0]
        a = root.attributes
        n = a[stages.GEN_AI_USAGE_INPUT_TOKENS]
        queues = {q.attributes[stages.ATTR_PD_SIDE]: q for q in by[stages.QUEUE]}
        (sample,), (xfer,), (detok,) = by[stages.SAMPLE], by[stages.KV_TRANSFER], by[stages.DETOKENIZE]
        assert set(queues) == {stages.PD_SIDE_PREFILL, stages.PD_SIDE_DECODE} and by[stages.PREFILL]
        # request order: prefill queue, prefill, sample, transfer, decode-side queue, first detokenize
        assert queues["prefill"].end_time <= by[stages.PREFILL][0].start_time
        assert sample.end_time == xfer.start_time and xfer.end_time == queues["decode"].start_time
        assert queues["decode"].end_time <= detok.start_time
        assert a[stages.ATTR_PD_DISAGGREGATED] is True
        assert a[stages.ATTR_PD_KV_BYTES] == xfer.attributes[stages.ATTR_PD_KV_BYTES] == n * KV_BYTES_PER_TOKEN
        assert a[stages.ATTR_PD_KV_TRANSFER_S] == pytest.approx((xfer.end_time - xfer.start_time) / 1e9)
        assert a[stages.ATTR_PD_DECODE_QUEUE_S] == pytest.approx(
            (queues["decode"].end_time - queues["decode"].start_time) / 1e9)
        assert 0 <= a[stages.ATTR_PD_ADMISSION_WAIT_S] <= a[stages.ATTR_PD_DECODE_QUEUE_S]
        ttft_s = (a[stages.ATTR_FIRST_TOKEN_NS] - root.start_time) / 1e9
        assert a[stages.ATTR_PD_PREFILL_TTFT_S] + a[stages.ATTR_PD_DECODE_TTFT_S] == pytest.approx(ttft_s, abs=1e-6)
        parts_s = sum(s.end_time - s.start_time for name in stages.TTFT_STAGES for s in by.get(name, ())) / 1e9
        assert parts_s <= ttft_s and ttft_s - parts_s < 0.002 + 0.05 * ttft_s  # the stage columns add up
        assert a[stages.GEN_AI_USAGE_OUTPUT_TOKENS] == GREEDY.max_tokens and stages.DECODE in by
    steps = [s for s in spans if s.name == stages.SPAN_ENGINE_STEP]
    sides = {s.attributes[stages.ATTR_STEP_PD_SIDE] for s in steps}
    assert sides == {stages.PD_SIDE_PREFILL, stages.PD_SIDE_DECODE}
    for s in steps:  # the two loops never mix: prefill steps prefill, decode steps decode
        a = s.attributes
        if a[stages.ATTR_STEP_PD_SIDE] == stages.PD_SIDE_PREFILL:
            assert a[stages.ATTR_STEP_DECODE_SEQS] == 0 and a[stages.ATTR_STEP_PREFILL_TOKENS] > 0
        else:
            assert a[stages.ATTR_STEP_PREFILL_TOKENS] == 0 and a[stages.ATTR_STEP_DECODE_SEQS] > 0


def test_pd_metrics_show_transfer_time_bytes_and_each_sides_ttft(pd_engine):
    m0 = _metrics(pd_engine)
    n = 64
    for i in range(3):
        pd_engine.generate(list(range(100 + i, 100 + i + n)), GREEDY)
    m1 = _metrics(pd_engine)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return m1.get(key, 0.0) - m0.get(key, 0.0)

    pre = "ttft_engine:"
    assert delta(pre + "kv_transfer_time_seconds_count") == 3 and delta(pre + "kv_transfer_time_seconds_sum") > 0
    assert delta(pre + "kv_transfer_bytes_sum") == 3 * n * KV_BYTES_PER_TOKEN
    for role in ("prefill", "decode"):
        assert delta(pre + "time_to_first_token_seconds_count", role=role) == 3
    prefill_s = delta(pre + "time_to_first_token_seconds_sum", role="prefill")
    decode_s = delta(pre + "time_to_first_token_seconds_sum", role="decode")
    # each instance's own TTFT is low next to the other's work: the decode side's holds the transfer
    assert prefill_s > 0 and decode_s >= delta(pre + "kv_transfer_time_seconds_sum")
    assert delta(pre + "request_success_total", role="decode", finished_reason="length") == 3
    assert delta(pre + "inter_token_latency_seconds_count", role="decode") == 3 * (GREEDY.max_tokens - 1)
    assert m1[(pre + "kv_cache_total_blocks", (("role", "decode"),))] == pd_engine.config.pd_decode_blocks()
    assert m1[(pre + "num_requests_running", (("role", "decode"),))] == 0


def test_a_client_that_leaves_frees_its_blocks_on_the_decode_side(pd_engine):
    s = SyncEventStream()
    res = pd_engine.submit(s.push, SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True),
                           prompt_ids=list(range(10, 70)))
    assert s.get(30).token_id is not None  # decoding on the decode worker now
    pd_engine.abort(res.request_id, "disconnect")
    events = list(s)
    assert events[-1].finish_reason == "abort" and events[-1].error == "disconnect"
    deadline = time.monotonic() + 10
    while pd_engine.pd.state[:3] != (0, 0, pd_engine.config.pd_decode_blocks()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pd_engine.pd.state[:3] == (0, 0, pd_engine.config.pd_decode_blocks())
    assert pd_engine.pd.num_in_flight() == 0


def test_a_response_format_is_refused_under_pd(pd_engine):
    from diag.bundled_engine.grammar_schema import grammar_source
    from diag.bundled_engine.scheduler_types import RequestRejected

    with pytest.raises(RequestRejected, match="not supported with --pd"):
        pd_engine.submit(lambda ev: None, GREEDY, prompt_ids=[1, 2, 3],
                         grammar=grammar_source({"type": "json_object"}))


@pytest.mark.slow
def test_an_injected_transfer_latency_shows_in_kv_transfer_and_ttft_not_prefill():
    faults = parse_injections(["kv_transfer_latency_ms=60", "kv_transfer_ms_per_mb=100"])
    eng = build_engine(model="tiny", pd=True, trace_memory=True, faults=faults)
    try:
        for n in (64, 500):
            eng.generate(list(range(10, 10 + n)), GREEDY)
        reqs = spans_by_request(finished_spans(eng))
    finally:
        eng.shutdown()
    got = {}
    for by in reqs.values():
        a = by[stages.SPAN_REQUEST][0].attributes
        mib = a[stages.ATTR_PD_KV_BYTES] / 2**20
        xfer_s = a[stages.ATTR_PD_KV_TRANSFER_S]
        prefill_s = sum(s.end_time - s.start_time for s in by[stages.PREFILL]) / 1e9
        ttft_s = (a[stages.ATTR_FIRST_TOKEN_NS] - by[stages.SPAN_REQUEST][0].start_time) / 1e9
        assert xfer_s >= 0.060 + 0.100 * mib  # the injected wait, on the sending side
        assert ttft_s >= prefill_s + xfer_s and prefill_s < 0.060 + 0.100 * mib  # in TTFT, not in prefill
        got[a[stages.GEN_AI_USAGE_INPUT_TOKENS]] = xfer_s
    assert got[500] - got[64] >= 0.100 * (500 - 64) * KV_BYTES_PER_TOKEN / 2**20 * 0.9  # per MiB


@pytest.mark.slow
def test_a_small_decode_pool_makes_requests_wait_on_the_decode_side_while_prefill_idles():
    # 64 + 40 tokens take 7 blocks of 16; the decode worker holds 8: one request at a time there
    eng = build_engine(model="tiny", pd=True, trace_memory=True, pd_decode_kv_blocks=8)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    try:
        streams = []
        for i in range(3):
            s = SyncEventStream()
            eng.submit(s.push, params, prompt_ids=list(range(20 + i, 84 + i)))
            streams.append(s)
        for s in streams:
            assert list(s)[-1].finish_reason == "length"
        spans = finished_spans(eng)
    finally:
        eng.shutdown()
    waits = []
    for by in spans_by_request(spans).values():
        a = by[stages.SPAN_REQUEST][0].attributes
        (q,) = [q for q in by[stages.QUEUE] if q.attributes[stages.ATTR_PD_SIDE] == stages.PD_SIDE_DECODE]
        waits.append((a[stages.ATTR_PD_ADMISSION_WAIT_S], q.start_time, q.end_time))
    waits.sort()
    # the second waits for the first's 39 decode steps, the third for both
    assert waits[0][0] < 0.05 and waits[1][0] > 0.03 and waits[2][0] > waits[1][0]
    steps = [s for s in spans if s.name == stages.SPAN_ENGINE_STEP]
    prefill_steps = [s for s in steps if s.attributes[stages.ATTR_STEP_PD_SIDE] == stages.PD_SIDE_PREFILL]
    # while the third waits on the decode side, the prefill side has nothing to do
    _, start, end = waits[2]
    assert not [s for s in prefill_steps if s.end_time > start and s.start_time < end]
    decode_steps = [s for s in steps if s.attributes[stages.ATTR_STEP_PD_SIDE] == stages.PD_SIDE_DECODE]
    assert max(s.attributes[stages.ATTR_STEP_WAITING_KV] for s in decode_steps) == 2
    assert max(s.attributes[stages.ATTR_STEP_RUNNING] for s in decode_steps) <= 1


@pytest.mark.slow
def test_ttft_serve_pd_serves_records_and_leaves_no_process_behind(tmp_path):
    from diag.ground.capture import load_capture
    from diag.ground.tables import build_tables

    cap = tmp_path / "cap"
    cmd = [sys.executable, "-c", LAUNCH, "serve", "--port", "0", "--pd", "--pd-decode-kv-blocks", "64",
           "--capture", str(cap)]
    with serve_process(cmd) as (proc, line):
        assert line.startswith("ttft serve: listening on http://127.0.0.1:") and line.endswith(", pd)\n"), line
        url = line.split()[4]
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(
            {"prompt": "hello there", "max_tokens": 5, "ignore_eos": True}).encode(),
            headers={"Content-Type": "application/json"})
        body = json.loads(urllib.request.urlopen(req, timeout=30).read())
        assert body["usage"]["completion_tokens"] == 5
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())
        assert health["pd_decode_kv_total_blocks"] == 64
        children = psutil.Process(proc.pid).children(recursive=True)
        assert health["pd_decode_pid"] in {c.pid for c in children}
    assert proc.returncode == 0
    # the decode worker is joined before serve exits; multiprocessing's resource tracker ends on its own
    # once serve's pipe to it closes: give it a moment, then nothing may be left
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [c for c in alive if c.status() != psutil.STATUS_ZOMBIE], alive
    t = build_tables(load_capture(cap))
    row = t.requests.iloc[0]
    assert row["kv_transfer_s"] > 0 and row["pd_decode_queue_s"] >= 0 and row["pd_kv_bytes"] > 0
    assert set(t.steps["pd_side"]) == {"prefill", "decode"}
