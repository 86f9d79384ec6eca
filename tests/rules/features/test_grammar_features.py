"""The grammar theme: a schema's first uses against its repeats (the probe's design), and the engine's
grammar waits on its request spans, on hand-built tables whose answer is known."""

from __future__ import annotations

import pytest

from rules.features import compute_features
from support.featcap import make_requests, make_tables


def _client(first_s: float, repeat_s: float, groups: int = 6, group: int = 4, concurrent: int = 0):
    ttft, roles = [], []
    for _ in range(groups):
        ttft += [first_s] + [first_s] * concurrent + [repeat_s] * (group - 1 - concurrent)
        roles += ["first"] + ["concurrent"] * concurrent + ["repeat"] * (group - 1 - concurrent)
    return compute_features(make_tables(make_requests(ttft, schema_role=roles)))


def test_first_uses_against_repeats_give_the_ratio_and_the_wait_share():
    f = _client(first_s=0.10, repeat_s=0.02)
    assert f.value("schema_first_ttft_p50_s") == pytest.approx(0.10)
    assert f.value("schema_repeat_ttft_p50_s") == pytest.approx(0.02)
    assert f.value("schema_first_ttft_x") == pytest.approx(5.0)
    # each group: one first use 80 ms beyond the repeats, over 100 + 3 x 20 ms of TTFT
    assert f.value("schema_wait_share_of_ttft") == pytest.approx(0.08 / 0.16)
    assert (f.value("schema_first_n"), f.value("schema_repeat_n")) == (6, 18)


def test_uses_sent_while_the_first_still_waited_count_as_waiting():
    f = _client(first_s=0.10, repeat_s=0.02, concurrent=1)
    assert f.value("schema_concurrent_n") == 6
    assert f.value("schema_wait_share_of_ttft") == pytest.approx(0.16 / 0.24)


def test_without_first_uses_or_repeats_the_client_features_say_why():
    f = compute_features(make_tables(make_requests([0.02] * 10, schema_role=["repeat"] * 10)))
    assert f.value("schema_first_ttft_x") is None
    assert "warm-up" in f.get("schema_first_ttft_x").reason
    f = _client(first_s=0.1, repeat_s=0.02, groups=2, group=2)
    assert "raise R" in f.get("schema_wait_share_of_ttft").reason
    f = compute_features(make_tables(make_requests([0.02] * 10)))
    assert "--response-format" in f.get("schema_first_ttft_x").reason


def test_the_engines_grammar_waits_give_their_share_of_ttft():
    ttft = [0.10, 0.02, 0.02, 0.02] * 5 + [0.02] * 5
    key = ["k1", "k1", "k1", "k1"] * 5 + [None] * 5
    hit = [False, True, True, True] * 5 + [None] * 5
    wait = [0.08, 0.0, 0.0, 0.0] * 5 + [None] * 5
    f = compute_features(make_tables(make_requests(ttft, grammar_key=key, grammar_cache_hit=hit,
                                                   grammar_wait_s=wait)))
    assert f.value("grammar_requests_n") == 20
    assert f.value("grammar_miss_frac") == pytest.approx(0.25)
    assert f.value("grammar_wait_p50_s") == pytest.approx(0.08)
    assert f.value("grammar_wait_share_of_ttft") == pytest.approx(0.4 / 0.8)
    assert f.value("grammar_wait_share_of_ttft_tail") == pytest.approx(0.8)  # the slowest 5% are first uses
    f = compute_features(make_tables(make_requests([0.02] * 10)))
    assert f.value("grammar_wait_share_of_ttft") is None and "ttft.grammar.key" in f.get("grammar_wait_share_of_ttft").reason
