"""rules.features.concurrency.long_ramp and the kv_cache rule's reading of it: ttft diagnose's
long ramp (segments ``long=N``) against the short one, client only."""

from __future__ import annotations

from featcap import make_requests, make_tables

from rules import diagnose
from rules.features import compute_features


def _ramp(label: str, ttft_by_level: dict[int, float], tokens: int, per_level: int = 4) -> dict[str, list]:
    rows: dict[str, list] = {"ttft": [], "segment": [], "input_tokens": []}
    for level, ttft in ttft_by_level.items():
        for i in range(per_level):
            rows["ttft"].append(ttft * (1 + 0.01 * i))
            rows["segment"].append(f"{label}={level}")
            rows["input_tokens"].append(tokens)
    return rows


def _tables(short: dict[int, float], long: dict[int, float]):  # noqa: ANN202
    s, lr = _ramp("concurrency", short, 64), _ramp("long", long, 256)
    ttft = s["ttft"] + lr["ttft"]
    n = len(ttft)
    req = make_requests(ttft, segment=s["segment"] + lr["segment"], input_tokens=s["input_tokens"] + lr["input_tokens"],
                        output_tokens=[32] * n, tpot_s=[0.004] * n, has_client=[True] * n, has_server=[False] * n,
                        client_ttft_s=ttft)
    return make_tables(req)


SHORT_FLAT = {1: 0.010, 2: 0.011, 4: 0.012, 8: 0.013}


def test_fewer_requests_holding_more_tokens_is_a_token_limit() -> None:
    # short prompts hold to 8 in flight; 4x the prompt (3x the tokens held) only to 2
    tables = _tables(SHORT_FLAT, {1: 0.030, 2: 0.033, 3: 0.090, 4: 0.120, 6: 0.200})
    feats = compute_features(tables)
    assert feats.value("long_ramp_held") == 2 and feats.value("long_ramp_short_held") == 8
    assert feats.value("long_ramp_knee_ratio") == 4 and feats.value("long_ramp_short_flat") == 1
    assert abs(feats.value("long_ramp_token_ratio") - 3.0) < 1e-9
    assert feats.value("requests_n") == 16  # the experiment is kept out of the TTFT statistics
    kv = next(f for f in diagnose(tables).findings if f.category == "kv_cache")
    assert kv.black_box and "limit in tokens" in kv.title
    assert any(e.name == "knee shift with the tokens each request holds" and e.crossed for e in kv.evidence)


def test_the_same_count_at_either_length_is_not_kv() -> None:
    # both hold to 4 in flight, then jump: a limit in requests (max_num_seqs, workers)
    tables = _tables({1: 0.010, 2: 0.011, 4: 0.012, 8: 0.060}, {1: 0.030, 2: 0.032, 3: 0.034, 4: 0.036, 6: 0.150})
    feats = compute_features(tables)
    assert feats.value("long_ramp_knee_ratio") == 1
    d = diagnose(tables)
    assert not any(f.category == "kv_cache" for f in d.findings)
    assert any("did not move with the tokens held" in p.reason for p in d.passed if p.rule_id == "kv_cache")
    queue = next(f for f in d.findings if f.category == "queue")
    assert queue.black_box and "a limit in requests" in queue.title and "admits 4" in queue.title


def test_no_long_ramp_no_long_ramp_features() -> None:
    feats = compute_features(_tables(SHORT_FLAT, {}))
    assert feats.value("long_ramp_knee_ratio") is None
