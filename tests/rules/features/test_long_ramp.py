"""rules.features.concurrency.long_ramp and the rules' reading of it (kv_cache, queue): ttft
diagnose's long ramp (segments ``long=N``) against the short ramp, client only, on timelines
of a closed loop against a server that admits a fixed number of requests at a time (a slot
heap: a waiting request starts when a running one ends) or shares its compute (no limit): how
many streams decode at once tells them apart."""

from __future__ import annotations

import heapq

from support.featcap import make_requests, make_tables

from rules import evidence, run_rules
from rules.features import compute_features

STEP_S = 0.004  # one decode step
OUT = 32  # output tokens


def _closed_loop(c: int, limit: int | None, prefill_s: float, t0_s: float, per_client: int = 4,
                 shared: float = 0.0, out: int = OUT, serial_s: float = 0.0) -> list[tuple[float, float, float]]:
    """(start s, TTFT s, e2e s) of ``c`` clients sending ``per_client`` requests each, one after
    another, to a server admitting ``limit`` at a time (None: all; then ``shared`` x prefill more
    per other request in flight: compute shared, not a queue). ``serial_s``: a stage before the
    engine (a tokenizer thread) that takes each prompt that long, one prompt at a time."""
    slots = [t0_s] * (limit or c)
    sends = [(t0_s + 0.001 * i, i, 0) for i in range(c)]
    heapq.heapify(sends)
    rows = []
    stage_free = t0_s
    while sends:
        s, client, k = heapq.heappop(sends)
        ready = s
        if serial_s:
            ready = stage_free = max(s, stage_free) + serial_s
        free = heapq.heappop(slots)
        admit = max(ready, free)
        pre = prefill_s * (1 + shared * (c - 1))
        end = admit + pre + out * STEP_S
        heapq.heappush(slots, end)
        rows.append((s, admit - s + pre, end - s))
        if k + 1 < per_client:
            heapq.heappush(sends, (end, client, k + 1))
    return rows


def _tables(short_limit: int | None, long_limit: int | None, shared: float = 0.0,  # noqa: ANN202
            short_levels: tuple[int, ...] = (1, 2, 4, 8), serial_s_per_token: float = 0.0,
            long_out: int | None = None, ladder: tuple[int, ...] = (), long_levels: tuple[int, ...] = (1, 2, 3, 4, 6)):
    """The short ramp (64-token prompts), the long ramp (256) and, with ``long_out``, the longout
    follow-up (the long prompt at 8 in flight, 2 rounds, ``long_out``-token answers); ``ladder``:
    rungs at 1 in flight first (segments ``prompt=N``, prefill as the ramps')."""
    rows, t = [], 1000.0
    steps = [("prompt", (1,), None, 0.010 * n / 64, n, OUT) for n in ladder]
    steps += [("concurrency", short_levels, short_limit, 0.010, 64, OUT),
              ("long", long_levels, long_limit, 0.030, 256, OUT)]
    if long_out:
        steps.append(("longout", (8,), long_limit, 0.030, 256, long_out))
    for label, levels, limit, prefill, tokens, out in steps:
        for c in levels:
            for s, ttft, e2e in _closed_loop(c, limit, prefill, t, shared=shared, out=out,
                                             serial_s=serial_s_per_token * tokens,
                                             per_client=2 if label == "longout" else 4):
                value = out if label == "longout" else tokens if label == "prompt" else c
                rows.append((s, ttft, e2e, f"{label}={value}", tokens, out))
            t = max(r[0] + r[2] for r in rows) + 1.0
    start, ttft, e2e, seg, tok, outs = map(list, zip(*rows))
    n = len(rows)
    req = make_requests(ttft, start_ns=[x * 1e9 for x in start], e2e_s=e2e, segment=seg, input_tokens=tok,
                        output_tokens=outs, itl_p50_s=[STEP_S] * n, tpot_s=[STEP_S] * n,
                        has_client=[True] * n, has_server=[False] * n, client_ttft_s=ttft)
    return make_tables(req)


def test_fewer_requests_admitted_the_more_tokens_each_holds_is_a_kv_limit() -> None:
    # 8 short requests run at once, 2 long ones: a budget in tokens
    tables = _tables(short_limit=None, long_limit=2)
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") == 2 and feats.value("long_ramp_short_decode_cap") is None
    assert feats.value("long_ramp_short_flat") == 1 and feats.value("long_ramp_knee_ratio") > 3.5  # ~8 / 2
    assert abs(feats.value("long_ramp_token_ratio") - (256 + OUT) / (64 + OUT)) < 1e-9
    assert feats.value("requests_n") == sum(4 * c for c in (1, 2, 4, 8))  # the experiment is not TTFT statistics
    d = run_rules(tables)
    kv = next(f for f in d.findings if f.category == "kv_cache")
    assert kv.black_box and "Fewer requests are admitted the more tokens each holds" in kv.title
    assert d.named == "kv_cache"  # what the rules name; from the client alone, maybe under the verdict floor


def test_a_short_ramp_that_decoded_more_at_once_than_the_long_cap_is_enough() -> None:
    # the short ramp stopped at 4 (all 4 decoding together), the long one decodes 3 at most to 6
    tables = _tables(short_limit=None, long_limit=3, short_levels=(1, 2, 3, 4))
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") == 3 and feats.value("long_ramp_short_flat") == 1
    kv = next(f for f in run_rules(tables).findings if f.category == "kv_cache")
    assert any("a lower bound" in e.meaning for e in kv.evidence)


def test_an_uncapped_short_ramp_counts_as_much_past_the_threshold_as_short_of_it() -> None:
    """The short ramp never capped: how far the cap moved is a lower bound either way. Reaching 6 in
    flight against a long cap of 3 (shift >= 0.63, past the 0.5 threshold) is no weaker evidence
    than reaching 4 (shift >= 0.26) -- the short ramp ran on shorter prompts, say."""
    def kv(levels: tuple[int, ...]):  # noqa: ANN202
        d = run_rules(_tables(short_limit=None, long_limit=3, short_levels=levels))
        return next(f for f in d.findings if f.category == "kv_cache")

    to4, to6 = kv((1, 2, 3, 4)), kv((1, 2, 4, 6))
    row = next(e for e in to6.evidence if e.key == evidence.LONG_RAMP_SHIFT)
    assert row.crossed and "a lower bound" in row.meaning
    assert to6.confidence >= to4.confidence


def test_the_same_count_admitted_at_either_length_is_a_limit_in_requests() -> None:
    tables = _tables(short_limit=2, long_limit=2)
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") == 2 and feats.value("long_ramp_short_decode_cap") == 2
    d = run_rules(tables)
    assert not any(f.category == "kv_cache" for f in d.findings)
    assert any("a limit in requests (see queue)" in p.reason for p in d.passed if p.rule_id == "kv_cache")
    queue = next(f for f in d.findings if f.category == "queue")
    assert queue.black_box and "a limit in requests" in queue.title


def test_shared_compute_lets_every_stream_decode_and_claims_no_limit() -> None:
    # no limit: TTFT grows with every request in flight (compute shared), whatever ends when
    tables = _tables(short_limit=None, long_limit=None, shared=0.6)
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") is None and feats.value("long_ramp_short_decode_cap") is None
    assert feats.value("long_ramp_knee_ratio") is None
    assert feats.value("long_ramp_decode_max") == 6 and feats.value("long_ramp_top") == 6
    d = run_rules(tables)
    assert not any(f.category == "kv_cache" or "a limit in requests" in f.title for f in d.findings)
    assert any("6 streams decoded at once at 6 in flight" in p.reason for p in d.passed if p.rule_id == "kv_cache")
    # nor a queue: TTFT rising with load is the streams sharing the compute
    assert not any(f.category == "queue" for f in d.findings)
    assert any("no admission limit holds requests back" in p.reason for p in d.passed if p.rule_id == "queue")


def test_a_stage_taking_prompts_one_at_a_time_reads_as_a_kv_limit_until_longer_answers_overlap() -> None:
    # a tokenizer thread before an engine with no limit: 1 ms per prompt token, one prompt at a
    # time. Its decode windows (32 x 4 ms) overlap little at 256-token prompts (256 ms apart), so
    # the long ramp sees one stream decoding at a time, as under a KV limit ...
    tables = _tables(short_limit=None, long_limit=None, serial_s_per_token=0.001)
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") == 1
    assert feats.value("long_out_decode_max") is None and "no longout" in feats.get("long_out_decode_max").reason
    assert run_rules(tables).named == "kv_cache"
    # ... and with answers 5x longer more of them decode together: no limit on what runs at once
    tables = _tables(short_limit=None, long_limit=None, serial_s_per_token=0.001, long_out=5 * OUT)
    feats = compute_features(tables)
    assert feats.value("long_out_decode_max") >= 3 and feats.value("long_out_output_x") == 5
    assert feats.value("requests_n") == sum(4 * c for c in (1, 2, 4, 8))  # kept apart, as the long ramp
    d = run_rules(tables)
    assert not any(f.category in ("kv_cache", "queue") for f in d.findings), [f.title for f in d.findings]
    reason = next(p.reason for p in d.passed if p.rule_id == "kv_cache")
    assert "with 5.0x longer answers" in reason and "one at a time before the engine" in reason


def test_a_cap_with_a_prompt_token_costing_a_decode_step_is_not_called_a_kv_limit_without_longer_answers() -> None:
    """The same tokenizer stage (1 ms a token, one prompt at a time), now with the ladder's rungs: a
    prompt token costs over a quarter of a decode step, as sequential work before the engine does. Without the
    longout follow-up that tells such a stage from a limit, the long ramp's cap stays a candidate,
    demoted and saying why; tokenize leads."""
    tables = _tables(short_limit=None, long_limit=None, serial_s_per_token=0.001, ladder=(128, 256, 512))
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") == 1 and feats.value("prompt_slope_per_itl") >= 0.25
    assert feats.value("ttft_prompt_fit_itl_p50_s") == STEP_S
    d = run_rules(tables)
    kv = next(f for f in d.findings if f.category == "kv_cache")
    assert "a stage taking prompts one at a time (see tokenize) is not ruled out" in kv.note
    assert d.named == "tokenize"
    # a real limit with a fast prefill: the same ladder leaves the long ramp's reading whole
    d = run_rules(_tables(short_limit=None, long_limit=2, ladder=(128, 256, 512)))
    assert d.named == "kv_cache" and "not ruled out" not in ((d.leading or d.verdict).note or "")


def test_a_kv_limit_holds_as_few_streams_with_longer_answers() -> None:
    tables = _tables(short_limit=None, long_limit=2, long_out=5 * OUT)
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") == 2 and feats.value("long_out_decode_max") == 2
    kv = next(f for f in run_rules(tables).findings if f.category == "kv_cache")
    row = next(e for e in kv.evidence if e.key == evidence.LONG_OUT_CAP)
    assert row.value == 2 and "5.0x as long" in row.meaning
    # a limit in requests likewise
    d = run_rules(_tables(short_limit=2, long_limit=2, long_out=5 * OUT))
    assert any(f.category == "queue" and "a limit in requests" in f.title for f in d.findings)


def test_without_a_long_ramp_its_features_say_so() -> None:
    tables = make_tables(make_requests([0.01] * 12, segment=[f"concurrency={c}" for c in (1, 2, 4) for _ in range(4)]))
    feat = compute_features(tables).get("long_ramp_knee_ratio")
    assert feat.value is None and "no long ramp" in feat.reason


def test_a_long_ramp_stopped_under_four_in_flight_says_neither_capped_nor_not() -> None:
    """Real vLLM (a KV pool of 8 blocks, diagnose's budget spent): the long ramp reached 3 in flight
    with 1 decoding at once. That is too few levels to tell a cap (which needs 4 in flight), and
    certainly no sign that nothing holds requests back: no "uncapped" reading clears kv_cache."""
    tables = _tables(short_limit=None, long_limit=1, long_levels=(1, 2, 3))
    feats = compute_features(tables)
    assert not feats.available("long_ramp_decode_cap")
    assert not feats.available("long_ramp_decode_max") and "too few levels" in feats.get("long_ramp_decode_max").reason
    d = run_rules(tables)
    assert not any("no admission limit" in p.reason or "would have held them to fewer" in p.reason
                   for p in d.passed), [p.reason for p in d.passed]
