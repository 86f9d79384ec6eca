"""Block manager and paged storage."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.bundled_engine.kv_cache import BlockManager, NoFreeBlocksError, PagedKVCache, blocks_needed, kv_bytes_per_token


def test_allocate_grow_free():
    bm = BlockManager(8, 4)
    assert bm.allocate("a", 5) == [0, 1]
    assert bm.allocate("a", 8) == [0, 1]  # still fits
    assert bm.allocate("a", 9) == [0, 1, 2]
    assert bm.num_free_blocks == 5 and bm.usage_ratio() == pytest.approx(3 / 8)
    assert bm.extra_blocks_for("b", 21) == 6 and not bm.can_grow("b", 21)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate("b", 21)
    assert bm.num_free_blocks == 5 and not bm.has("b")  # a failed allocate takes nothing
    assert bm.free("a") == 3 and bm.free("a") == 0
    assert bm.num_free_blocks == 8


def test_bytes_per_token():
    assert kv_bytes_per_token(4, 2, 32, torch.float32) == 2 * 4 * 2 * 32 * 4
    assert kv_bytes_per_token(4, 2, 32, torch.bfloat16) == 2 * 4 * 2 * 32 * 2
    c = PagedKVCache(4, 10, 16, 2, 32)
    assert c.bytes_per_token == 2048 and c.total_bytes == 10 * 16 * 2048
    assert blocks_needed(0, 16) == 0 and blocks_needed(16, 16) == 1 and blocks_needed(17, 16) == 2


def test_write_gather_roundtrip():
    c = PagedKVCache(2, 4, 2, 3, 5)
    k, v = torch.randn(3, 3, 5), torch.randn(3, 3, 5)
    slots = torch.tensor([7, 0, 4])
    c.write(1, slots, k, v)
    gk, gv = c.gather(1, torch.tensor([[4, 7], [0, 0]]))
    assert gk.shape == (2, 2, 3, 5)
    assert torch.equal(gk[0, 0], k[2]) and torch.equal(gv[0, 1], v[0]) and torch.equal(gk[1, 1], k[1])
    assert torch.count_nonzero(c.k[0]) == 0  # other layers untouched


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40), st.booleans()), max_size=60))
def test_blocks_are_never_lost_or_shared(ops):
    bm = BlockManager(16, 4)
    sizes: dict[str, int] = {}
    for sid, tokens, free in ops:
        name = f"s{sid}"
        if free:
            bm.free(name)
            sizes.pop(name, None)
            continue
        target = max(tokens, sizes.get(name, 0))
        try:
            bm.allocate(name, target)
            sizes[name] = target
        except NoFreeBlocksError:
            pass
        owned = [b for s in sizes for b in bm.block_table(s)]
        assert len(owned) == len(set(owned))
        assert len(owned) + bm.num_free_blocks == 16
        for s, n in sizes.items():
            assert bm.capacity_tokens(s) >= n
    for s in list(sizes):
        bm.free(s)
    assert bm.num_free_blocks == 16
