"""rules.features.concurrency.long_ramp and the rules' reading of it (kv_cache, queue): ttft
diagnose's long ramp (segments ``long=N``) against the short ramp, client only, on timelines
of a closed loop against a server that admits a fixed number of requests at a time (a slot
heap: a waiting request starts when a running one ends) or shares its compute (no limit): how
many streams decode at once tells them apart."""

from __future__ import annotations

import heapq

from featcap import make_requests, make_tables

from rules import diagnose
from rules.features import compute_features

STEP_S = 0.004  # one decode step
OUT = 32  # output tokens


def _closed_loop(c: int, limit: int | None, prefill_s: float, t0_s: float, per_client: int = 4,
                 shared: float = 0.0) -> list[tuple[float, float, float]]:
    """(start s, TTFT s, e2e s) of ``c`` clients sending ``per_client`` requests each, one after
    another, to a server admitting ``limit`` at a time (None: all; then ``shared`` x prefill more
    per other request in flight: compute shared, not a queue)."""
    slots = [t0_s] * (limit or c)
    sends = [(t0_s + 0.001 * i, i, 0) for i in range(c)]
    heapq.heapify(sends)
    out = []
    while sends:
        s, client, k = heapq.heappop(sends)
        free = heapq.heappop(slots)
        admit = max(s, free)
        pre = prefill_s * (1 + shared * (c - 1))
        end = admit + pre + OUT * STEP_S
        heapq.heappush(slots, end)
        out.append((s, admit - s + pre, end - s))
        if k + 1 < per_client:
            heapq.heappush(sends, (end, client, k + 1))
    return out


def _tables(short_limit: int | None, long_limit: int | None, shared: float = 0.0,  # noqa: ANN202
            short_levels: tuple[int, ...] = (1, 2, 4, 8)):
    rows, t = [], 1000.0
    for label, levels, limit, prefill, tokens in (("concurrency", short_levels, short_limit, 0.010, 64),
                                                   ("long", (1, 2, 3, 4, 6), long_limit, 0.030, 256)):
        for c in levels:
            for s, ttft, e2e in _closed_loop(c, limit, prefill, t, shared=shared):
                rows.append((s, ttft, e2e, f"{label}={c}", tokens))
            t = max(r[0] + r[2] for r in rows) + 1.0
    start, ttft, e2e, seg, tok = map(list, zip(*rows))
    n = len(rows)
    req = make_requests(ttft, start_ns=[x * 1e9 for x in start], e2e_s=e2e, segment=seg, input_tokens=tok,
                        output_tokens=[OUT] * n, itl_p50_s=[STEP_S] * n, tpot_s=[STEP_S] * n,
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
    d = diagnose(tables)
    kv = next(f for f in d.findings if f.category == "kv_cache")
    assert kv.black_box and "Fewer requests are admitted the more tokens each holds" in kv.title
    assert d.verdict.category == "kv_cache"


def test_a_short_ramp_that_decoded_more_at_once_than_the_long_cap_is_enough() -> None:
    # the short ramp stopped at 4 (all 4 decoding together), the long one decodes 3 at most to 6
    tables = _tables(short_limit=None, long_limit=3, short_levels=(1, 2, 3, 4))
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") == 3 and feats.value("long_ramp_short_flat") == 1
    kv = next(f for f in diagnose(tables).findings if f.category == "kv_cache")
    assert any("a lower bound" in e.meaning for e in kv.evidence)


def test_the_same_count_admitted_at_either_length_is_a_limit_in_requests() -> None:
    tables = _tables(short_limit=2, long_limit=2)
    feats = compute_features(tables)
    assert feats.value("long_ramp_decode_cap") == 2 and feats.value("long_ramp_short_decode_cap") == 2
    d = diagnose(tables)
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
    d = diagnose(tables)
    assert not any(f.category == "kv_cache" or "a limit in requests" in f.title for f in d.findings)
    assert any("6 streams decoded at once at 6 in flight" in p.reason for p in d.passed if p.rule_id == "kv_cache")
    # nor a queue: TTFT rising with load is the streams sharing the compute
    assert not any(f.category == "queue" for f in d.findings)
    assert any("no admission limit holds requests back" in p.reason for p in d.passed if p.rule_id == "queue")


def test_without_a_long_ramp_its_features_say_so() -> None:
    tables = make_tables(make_requests([0.01] * 12, segment=[f"concurrency={c}" for c in (1, 2, 4) for _ in range(4)]))
    feat = compute_features(tables).get("long_ramp_knee_ratio")
    assert feat.value is None and "no long ramp" in feat.reason
