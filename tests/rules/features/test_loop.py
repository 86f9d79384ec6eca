"""The loop theme: time inside the engine with no step running, measured on a hand-built timeline
whose answer is known to the nanosecond."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from diag.ground import stages
from rules.features import Features, compute_features
from support.featcap import make_requests, make_tables

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def _features(reqs: list[tuple[str, int, int, int]], steps: list[tuple[int, int]], spans: list[dict],
              output_tokens: float) -> Features:
    """The features of a hand-built timeline: requests (trace id, enter, first token, end; ns), the
    engine's steps (start, end; ns), the request spans, each request ``output_tokens`` long."""
    req = make_requests([(f - a) / 1e9 for _, a, f, _ in reqs],
                        server_end_ns=[float(e) for *_, e in reqs], first_token_ns=[float(f) for _, _, f, _ in reqs],
                        output_tokens=[output_tokens] * len(reqs))
    req["trace_id"] = [r[0] for r in reqs]
    req["start_ns"] = [float(r[1]) for r in reqs]
    st = pd.DataFrame({"start_ns": [s for s, _ in steps], "end_ns": [e for _, e in steps]})
    st["duration_s"] = (st["end_ns"] - st["start_ns"]) / 1e9
    st["service"] = "ttft-engine"
    return compute_features(dataclasses.replace(make_tables(req, st), spans=pd.DataFrame(spans)))


def _timeline(gap_ms: float, step_ms: float = 10.0, n_req: int = 4, steps_per_req: int = 5,
              output_tokens: int | None = None):
    """``n_req`` requests one after another, each entering the engine ``gap_ms`` before its first
    step and running ``steps_per_req`` steps separated by ``gap_ms``; first token at its first step's end."""
    reqs, steps, spans = [], [], []
    t = T0
    for i in range(n_req):
        tid = f"{i:032x}"
        enter = t
        first = None
        for k in range(steps_per_req):
            s = t + int(gap_ms * MS)
            e = s + int(step_ms * MS)
            steps.append((s, e))
            first = e if first is None else first
            t = e
        spans.append({"trace_id": tid, "span_id": f"{i:016x}", "name": stages.QUEUE, "start_ns": enter,
                      "end_ns": enter + int(gap_ms * MS)})
        reqs.append((tid, enter, first, t))
    return _features(reqs, steps, spans, float(output_tokens or steps_per_req))


def test_gaps_between_steps_while_requests_wait_are_the_idle_share() -> None:
    f = _timeline(gap_ms=20.0, step_ms=10.0)
    # every step is preceded by a 20 ms gap with a request inside, but the time before the first step
    # does not count (the engine may still be starting): 19 gaps of 20 ms against 20 steps of 10 ms
    assert f.value("loop_idle_share") == pytest.approx(380 / 580, rel=1e-6)
    assert f.value("loop_gap_p50_s") == pytest.approx(0.020, rel=1e-6)
    # a first token comes 20 ms (idle) + 10 ms (its step) after the request entered; the first
    # request's 20 ms come before the first step and do not count: 60 ms of 120
    assert f.value("loop_idle_share_of_ttft") == pytest.approx(0.5, rel=1e-6)
    assert f.value("loop_idle_share_of_ttft_tail") == pytest.approx(0.5, rel=1e-6)
    assert f.value("loop_gaps_n") == 19


def test_a_tight_loop_is_nearly_never_idle() -> None:
    f = _timeline(gap_ms=0.2, step_ms=10.0)
    assert f.value("loop_idle_share") < 0.05
    assert f.value("loop_idle_share_of_ttft") < 0.05


def test_without_queue_spans_the_features_say_why() -> None:
    f = _timeline(gap_ms=20.0)
    tables = make_tables(make_requests([0.03] * 4))
    g = compute_features(tables)
    assert not g.available("loop_idle_share")
    assert "engine-step spans" in g.get("loop_idle_share").reason
    assert f.available("loop_idle_share")


def test_steps_missing_from_the_trace_are_not_read_as_an_idle_loop() -> None:
    # every request says it emitted 20 tokens, yet 4 steps overlap each one's decode: 4 of 19
    f = _timeline(gap_ms=20.0, output_tokens=20)
    assert not f.available("loop_idle_share")
    assert "21%" in f.get("loop_idle_share").reason
    assert _timeline(gap_ms=20.0, output_tokens=5).available("loop_idle_share")  # one token per step: all traced


def _handed_off(handoff_ms: float, gap_ms: float = 0.2, step_ms: float = 10.0, n_req: int = 4):
    """Disaggregated prefill/decode, one request at a time: queue, one prefill step, then
    ``handoff_ms`` with no step anywhere (``kv_transfer`` for 3/4 of it, the decode side's
    ``queue`` span for the rest), its first token when it comes back, then 4 decode steps."""
    reqs, steps, spans = [], [], []
    t = T0
    for i in range(n_req):
        tid = f"{i:032x}"
        enter = t
        s = t + int(gap_ms * MS)
        steps.append((s, s + int(step_ms * MS)))
        off = s + int(step_ms * MS)
        mid, back = off + int(0.75 * handoff_ms * MS), off + int(handoff_ms * MS)
        spans += [{"trace_id": tid, "name": stages.QUEUE, "start_ns": enter, "end_ns": s, stages.ATTR_PD_SIDE: None},
                  {"trace_id": tid, "name": stages.KV_TRANSFER, "start_ns": off, "end_ns": mid,
                   stages.ATTR_PD_SIDE: None},
                  {"trace_id": tid, "name": stages.QUEUE, "start_ns": mid, "end_ns": back,
                   stages.ATTR_PD_SIDE: stages.PD_SIDE_DECODE}]
        t = back
        for _ in range(4):
            s = t + int(gap_ms * MS)
            steps.append((s, s + int(step_ms * MS)))
            t = s + int(step_ms * MS)
        reqs.append((tid, enter, back, t))
    return _features(reqs, steps, spans, 5.0)


def test_a_request_handed_to_the_decode_side_is_not_waiting_for_this_loop() -> None:
    """A 40 ms KV transfer and decode-side admission with no step running is the link's and the
    decode side's wait (pd_transfer), not a loop idling while requests wait inside it."""
    f = _handed_off(handoff_ms=40.0)
    assert f.value("loop_idle_share_of_ttft") < 0.05
    assert f.value("loop_idle_share") < 0.05
    assert f.value("loop_gap_p50_s") == pytest.approx(0.0002, rel=0.01)  # only the part after it came back
