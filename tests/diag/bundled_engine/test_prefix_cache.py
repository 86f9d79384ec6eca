"""Prefix caching: hash chain, reference counts, LRU eviction, the scheduler's use of hits, and
the engine's output, spans and /metrics with the cache on and off."""

from __future__ import annotations

import random

import pytest

from support.engine_testutil import finished_spans, spans_by_request
from diag.ground import stages
from diag.bundled_engine import SamplingParams, SyncEventStream, build_engine
from diag.bundled_engine.kv_cache import BlockManager, NoFreeBlocksError
from diag.bundled_engine.prefix_cache import NO_HIT, chain_hashes, hash_block
from diag.bundled_engine.sampler import SamplerState
from diag.bundled_engine.scheduler import Scheduler
from diag.bundled_engine.scheduler_types import POLICIES, SchedulerConfig, Sequence, StepPlan

BS = 4  # tokens per block in the unit tests


def _seq(name: str, prompt: list[int], max_tokens: int = 3) -> Sequence:
    p = SamplingParams(max_tokens=max_tokens)
    return Sequence(name, list(prompt), p, SamplerState(p, 0))


def _run(s: Scheduler, plan: StepPlan) -> list[Sequence]:
    """Pretend to execute the plan: tokens land in the cache, completing seqs get a token."""
    done = []
    for item in plan.items:
        s.on_step_done(item)
        if item.completes:
            item.seq.output_ids.append(1000 + len(item.seq.output_ids))
            if len(item.seq.output_ids) >= item.seq.params.max_tokens:
                done.append(item.seq)
    for seq in done:
        s.remove(seq)
    return done


def _drain(s: Scheduler, limit: int = 500) -> None:
    for _ in range(limit):
        if not s.has_work():
            return
        _run(s, s.schedule())
    raise AssertionError("scheduler did not drain")


def _check(bm: BlockManager, holders: list[str]) -> None:
    """Every block is exactly one of: held (refcount = its holders), evictable-cached, or free."""
    pc = bm.prefix_cache
    counts: dict[int, int] = {}
    for sid in holders:
        for b in bm.block_table(sid):
            counts[b] = counts.get(b, 0) + 1
    for b, n in counts.items():
        assert pc.refcount(b) == n and not pc.is_evictable(b)
    assert len(counts) + bm.num_free_blocks == bm.num_blocks


# -- the hash chain --------------------------------------------------------------------------


def test_a_block_hash_covers_every_token_before_it():
    a = list(range(1, 13))
    h = chain_hashes(a, BS)
    assert len(h) == 3 and len(set(h)) == 3
    assert chain_hashes(a + [99, 98], BS) == h  # a partial block has no hash
    b = [77] + a[1:]  # differs in the first token only
    hb = chain_hashes(b, BS)
    assert all(x != y for x, y in zip(h, hb))  # ... so every later block differs too
    c = a[:8] + [5, 5, 5, 5]
    assert chain_hashes(c, BS)[:2] == h[:2] and chain_hashes(c, BS)[2] != h[2]
    # extending known hashes gives the same chain as hashing from scratch
    assert chain_hashes(a, BS, h[:1]) == h
    # the same block content under a different parent is a different block
    assert hash_block(h[0], a[4:8]) != hash_block(None, a[4:8])


# -- block manager ---------------------------------------------------------------------------


def test_hit_is_whole_blocks_and_leaves_one_token_to_compute():
    bm = BlockManager(16, BS, prefix_caching=True)
    prompt = list(range(1, 13))  # 3 full blocks
    bm.allocate("a", 12)
    bm.cache_full_blocks("a", 12, lambda i, j: prompt[i:j])
    # the same 12 tokens again: at most 11 may come from the cache -> 2 blocks (8 tokens)
    hit = bm.match_prefix("b", prompt)
    assert hit.num_tokens == 8 and hit.blocks == tuple(bm.block_table("a")[:2])
    # 13 tokens: all three blocks
    assert bm.match_prefix("c", prompt + [50]).num_tokens == 12
    # a different first token: nothing
    assert bm.match_prefix("d", [9] + prompt[1:]) is NO_HIT
    bm.allocate("b", 12, hit)
    assert bm.block_table("b")[:2] == bm.block_table("a")[:2] and bm.block_table("b")[2] != bm.block_table("a")[2]
    _check(bm, ["a", "b"])


def test_refcounts_and_release_to_lru_not_free_list():
    bm = BlockManager(8, BS, prefix_caching=True)
    toks = list(range(1, 10))  # 2 full blocks + 1 token
    bm.allocate("a", 9)
    bm.cache_full_blocks("a", 9, lambda i, j: toks[i:j])
    hit = bm.match_prefix("b", toks)
    bm.allocate("b", 9, hit)
    shared = bm.block_table("a")[:2]
    assert [bm.prefix_cache.refcount(x) for x in shared] == [2, 2]
    _check(bm, ["a", "b"])
    bm.free("a")
    assert [bm.prefix_cache.refcount(x) for x in shared] == [1, 1]
    _check(bm, ["b"])
    bm.free("b")
    # both cached blocks wait in the LRU (counted free), the partial block went to the free list
    assert bm.prefix_cache.num_evictable == 2 and bm.num_free_blocks == 8 and bm.usage_ratio() == 0.0
    assert bm.match_prefix("c", toks).blocks == tuple(shared)


def test_lru_eviction_under_memory_pressure():
    bm = BlockManager(6, BS, prefix_caching=True)
    old, new = list(range(1, 10)), list(range(101, 110))
    for sid, toks in (("old", old), ("new", new)):
        bm.allocate(sid, 9)
        bm.cache_full_blocks(sid, 9, lambda i, j, t=toks: t[i:j])
    bm.free("old")  # freed first: least recently used
    bm.free("new")
    assert bm.prefix_cache.num_evictable == 4 and bm.num_free_blocks == 6
    # 3 blocks: the 2 uncached free blocks first, then one eviction -- the old prefix's tail
    bm.allocate("x", 12)
    assert bm.prefix_cache.evictions == 1
    assert bm.match_prefix("q", old + [0]).num_tokens == 4  # old lost its second block only
    assert bm.match_prefix("r", new + [0]).num_tokens == 8
    # taking an evictable hit makes it unavailable for eviction: the pool can still fit it
    hit = bm.match_prefix("n", new + [0])
    assert not bm.can_grow("n", 13, hit)  # 2 hit blocks + 2 new; only old's head is left to evict
    assert bm.can_grow("n", 12, hit)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate("y", 16)
    bm.allocate("n", 12, hit)
    assert bm.prefix_cache.evictions == 2 and bm.match_prefix("q", old + [0]) is NO_HIT
    _check(bm, ["x", "n"])


def test_cache_off_keeps_no_state():
    bm = BlockManager(8, BS)
    assert bm.prefix_cache is None
    toks = list(range(1, 10))
    bm.allocate("a", 9)
    bm.cache_full_blocks("a", 9, lambda i, j: toks[i:j])
    assert bm.match_prefix("b", toks) is NO_HIT
    bm.free("a")
    assert bm.num_free_blocks == 8 and list(bm._free) == [3, 4, 5, 6, 7, 0, 1, 2]


# -- scheduler -------------------------------------------------------------------------------


def test_admission_starts_at_the_cached_length_and_counts_only_uncached_tokens():
    s = Scheduler(SchedulerConfig(policy="decode-first", max_num_batched_tokens=8),
                  BlockManager(64, BS, prefix_caching=True))
    prefix = list(range(1, 21))  # 5 blocks
    s.add(_seq("a", prefix + [30, 31]))
    _drain(s)
    s.add(_seq("b", prefix + [40, 41, 42]))  # 23 tokens: 20 cached, 3 to compute, fits a budget of 8
    plan = s.schedule()
    (item,) = plan.items
    assert item.seq.seq_id == "b" and item.start_pos == 20 and item.num_new_tokens == 3 and item.completes
    assert item.seq.num_cached_tokens == 20
    pc = s.blocks.prefix_cache
    assert pc.queries_tokens == 22 + 23 and pc.hits_tokens == 20
    _run(s, plan)
    _drain(s)
    assert s.blocks.num_free_blocks == 64


def test_chunked_prefill_continues_from_the_cached_length():
    s = Scheduler(SchedulerConfig(policy="chunked", chunk_size_tokens=8), BlockManager(64, BS, prefix_caching=True))
    prefix = list(range(1, 33))  # 8 blocks
    s.add(_seq("a", prefix + [50]))
    _drain(s)
    s.add(_seq("b", prefix + list(range(60, 72))))  # 44 tokens: 32 cached, 12 to compute in 8 + 4
    chunks = []
    while s.has_work():
        plan = s.schedule()
        chunks += [(i.start_pos, i.num_new_tokens) for i in plan.items if i.is_prefill]
        _run(s, plan)
    assert chunks == [(32, 8), (40, 4)]


def test_preempted_and_aborted_sequences_release_their_references():
    bm = BlockManager(12, BS, prefix_caching=True)
    s = Scheduler(SchedulerConfig(policy="decode-first"), bm)
    prefix = list(range(1, 17))  # 4 blocks
    s.add(_seq("warm", prefix + [99]))
    _drain(s)
    seqs = [_seq(f"s{i}", prefix + [200 + i, 300 + i], max_tokens=12) for i in range(3)]
    for q in seqs:
        s.add(q)
    preempted = 0
    for _ in range(200):
        if not s.has_work():
            break
        plan = s.schedule()
        preempted += len(plan.preempted)
        _check(bm, [q.seq_id for q in s.running])
        for q in s.waiting:
            assert not bm.has(q.seq_id)
        _run(s, plan)
        if preempted and s.running and seqs[0] in s.running:
            s.remove(seqs[0])  # abort one holder of the shared prefix mid-run
            _check(bm, [q.seq_id for q in s.running])
    assert preempted > 0  # 3 x (18 + 12) tokens cannot all fit in 12 blocks of 4 at once
    assert not s.has_work()
    assert bm.num_free_blocks == 12 and all(bm.prefix_cache.refcount(b) == 0 for b in range(12))


def _workload(rng: random.Random, n: int, distinct: bool) -> list[list[int]]:
    base = list(range(1, 40))
    out = []
    for i in range(n):
        head = [500 + i] if distinct else []
        out.append(head + base[: rng.randint(3, 30)] + [rng.randint(1, 400) for _ in range(rng.randint(1, 10))])
    return out


@pytest.mark.parametrize("policy", ["prefill-first", "decode-first", "chunked"])
def test_cache_on_without_shared_blocks_plans_exactly_as_cache_off(policy):
    """No prompt shares a first block and nothing is preempted (a recompute may hit its own blocks):
    the cache must change no step's plan."""
    rng = random.Random(7)
    prompts = _workload(rng, 12, distinct=True)
    arrivals = [rng.randint(0, 30) for _ in prompts]

    def run(caching: bool) -> list[list[tuple]]:
        s = Scheduler(SchedulerConfig(policy=policy, chunk_size_tokens=8, max_num_batched_tokens=24),
                      BlockManager(40, BS, prefix_caching=caching))
        trace = []
        for t in range(400):
            for i, (p, at) in enumerate(zip(prompts, arrivals)):
                if at == t:
                    s.add(_seq(f"s{i}", p, max_tokens=6))
            plan = s.schedule()
            trace.append([(i.seq.seq_id, i.start_pos, i.num_new_tokens, i.is_prefill) for i in plan.items]
                         + [("preempted", q.seq_id) for q in plan.preempted])
            _run(s, plan)
        assert not s.has_work() and s.num_preemptions_total == 0
        return trace

    assert run(True) == run(False)


def test_shared_prefixes_compute_fewer_tokens_and_finish_the_same_work():
    rng = random.Random(3)
    prompts = _workload(rng, 10, distinct=False)

    def run(caching: bool) -> tuple[int, dict[str, int]]:
        s = Scheduler(SchedulerConfig(policy="prefill-first"), BlockManager(64, BS, prefix_caching=caching))
        computed, outs = 0, {}
        for i, p in enumerate(prompts):
            s.add(_seq(f"s{i}", p))
            while s.has_work():
                plan = s.schedule()
                computed += plan.num_prefill_tokens
                for it in plan.items:
                    if it.completes and len(it.seq.output_ids) + 1 >= it.seq.params.max_tokens:
                        outs[it.seq.seq_id] = it.seq.num_tokens
                _run(s, plan)
        return computed, outs

    on, off = run(True), run(False)
    assert on[1] == off[1]
    assert on[0] < off[0] * 0.6


# -- the engine ------------------------------------------------------------------------------

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _ids(events) -> list[int]:
    return [e.token_id for e in events if e.token_id is not None]


def test_greedy_output_with_the_cache_equals_output_without(traced_engine):
    """The cached KV is the KV a full prefill writes: same tokens, fewer prefill tokens, spans and /metrics say so."""
    prefix = list(range(200, 296))  # 96 tokens = 6 blocks of 16
    prompts = [prefix + list(range(400 + 7 * i, 405 + 7 * i)) for i in range(3)]
    params = SamplingParams(max_tokens=10, **GREEDY)
    ref = [_ids(traced_engine.generate(p, params)[1]) for p in prompts]  # traced_engine: caching off
    eng = build_engine(model="tiny", warmup=False, prefix_caching=True, trace_memory=True)
    try:
        got = [_ids(eng.generate(p, params)[1]) for p in prompts]
        got.append(_ids(eng.generate(prompts[0], params)[1]))  # the whole prompt seen before
        spans = finished_spans(eng)
        body = eng.metrics.exposition()[0].decode()
        assert eng.blocks.usage_ratio() == 0.0 and eng.blocks.num_free_blocks == eng.blocks.num_blocks
    finally:
        eng.shutdown()
    assert got == ref + [ref[0]]
    reqs = sorted(spans_by_request(spans).values(), key=lambda by: by[stages.SPAN_REQUEST][0].start_time)
    cached = [by[stages.SPAN_REQUEST][0].attributes[stages.GEN_AI_USAGE_CACHED_TOKENS] for by in reqs]
    assert cached == [0, 96, 96, 96]  # the 4th: 101 tokens, 6 full blocks cached, the 5 others computed
    assert [by[stages.PREFILL][0].attributes[stages.GEN_AI_USAGE_CACHED_TOKENS] for by in reqs] == cached
    steps = [s for s in spans if s.name == stages.SPAN_ENGINE_STEP and s.attributes[stages.ATTR_STEP_PREFILL_TOKENS]]
    assert [s.attributes[stages.ATTR_STEP_PREFILL_TOKENS] for s in steps] == [101, 5, 5, 5]
    assert 'ttft_engine:prefix_cache_queries_total{model_name="tiny"} 404.0' in body
    assert 'ttft_engine:prefix_cache_hits_total{model_name="tiny"} 288.0' in body


def test_cache_off_spans_carry_no_cached_tokens(traced_engine):
    before = {s.context.span_id for s in finished_spans(traced_engine)}
    traced_engine.generate(list(range(200, 296)), SamplingParams(max_tokens=2, **GREEDY))
    spans = [s for s in finished_spans(traced_engine) if s.context.span_id not in before]
    assert spans and all(stages.GEN_AI_USAGE_CACHED_TOKENS not in s.attributes for s in spans)
    assert 'prefix_cache_queries_total{model_name="tiny"} 0.0' in traced_engine.metrics.exposition()[0].decode()


def test_serve_flag_is_off_by_default():
    import argparse

    from diag.cli.commands import serve

    def parse(*argv: str) -> argparse.Namespace:
        p = argparse.ArgumentParser()
        serve.add_parser(p.add_subparsers())
        return p.parse_args(["serve", *argv])

    assert parse().enable_prefix_caching is False and parse("--enable-prefix-caching").enable_prefix_caching is True


@pytest.mark.parametrize("kv_admission", ["on-demand", "reserve"])
def test_random_shared_prefixes_under_memory_pressure_never_lose_or_overdraw_blocks(kv_admission):
    """Many sequences sharing prefixes in small pools (evictions, preemptions, reservations): every
    plan is allocatable -- a reservation counts a hit's LRU blocks as taken --, every block is held,
    cached-and-evictable or free, and all end free."""
    for seed in range(12):
        rng = random.Random(seed)
        base = list(range(1, 60))
        nb = rng.choice((12, 16, 24))
        bm = BlockManager(nb, BS, prefix_caching=True)
        s = Scheduler(SchedulerConfig(policy=rng.choice(POLICIES), chunk_size_tokens=8, max_num_batched_tokens=32,
                                      kv_admission=kv_admission, max_context_tokens=nb * BS - BS), bm)
        for t in range(400):
            if t < 200 and rng.random() < 0.4:
                head = base[: rng.choice((8, 12, 16, 24))] if rng.random() < 0.8 else [700 + t]
                s.add(_seq(f"s{t}", head + [rng.randint(100, 400) for _ in range(rng.randint(1, 9))],
                           max_tokens=rng.randint(1, 8)))
            _run(s, s.schedule())
            _check(bm, [q.seq_id for q in s.running])
        assert not s.has_work(), seed
        assert bm.num_free_blocks == nb and bm.prefix_cache.hits_tokens > 0, seed
