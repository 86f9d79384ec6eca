"""Automatic prefix caching over the paged KV cache's blocks (off by default).

Only *full* blocks (``block_size`` tokens) are cached. Block ``i`` of a sequence gets a hash
that chains its parent's, ``h_i = H(h_{i-1}, tokens of block i)``, so one hash stands for
every token from position 0 to the end of its block: two sequences share block ``i`` only if
their first ``(i + 1) * block_size`` tokens are equal.

Every block in use has a reference count (the sequences whose tables hold it). A cached block
whose count falls to 0 is not returned to the free list: it stays in the hash index and goes to
the tail of an LRU list of *evictable* blocks, where a later request with the same prefix can
take it back. When the free list is empty, allocation evicts from the LRU head (the block
unreferenced longest ago) and drops its hash. A sequence frees its blocks last-first, so a
prefix's tail is evicted before its head (a tail is useless without the blocks before it).

The same scheme as vLLM V1's (``vllm/v1/core/kv_cache_manager.py`` ``get_computed_blocks``
and ``block_pool.py`` ``cache_full_blocks`` @ace980e6, read, not copied): a hit is capped at
``num_tokens - 1`` tokens, rounded down to whole blocks, so a logit is always computed.

Threading: owned by the engine's step-loop thread through :class:`~diag.bundled_engine.kv_cache.BlockManager`;
nothing here locks.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

BlockHash = bytes


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The chained hash of one full block: 16 bytes of BLAKE2b over the parent hash and the ids."""
    h = hashlib.blake2b(parent or b"\x00", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def chain_hashes(token_ids: Sequence[int], block_size: int, prefix: Sequence[BlockHash] = ()) -> list[BlockHash]:
    """Hashes of every full block of ``token_ids``, extending already known ``prefix`` hashes."""
    out = list(prefix)
    for i in range(len(out), len(token_ids) // block_size):
        out.append(hash_block(out[-1] if out else None, token_ids[i * block_size:(i + 1) * block_size]))
    return out


@dataclass(frozen=True)
class PrefixHit:
    """Cached blocks that hold a sequence's first ``num_tokens`` tokens (whole blocks)."""

    blocks: tuple[int, ...]
    num_tokens: int


NO_HIT = PrefixHit((), 0)


class PrefixCache:
    """Hash index of full blocks, per-block reference counts and the LRU of unreferenced cached blocks.

    Counters (tokens, since start): ``queries_tokens`` (prompt + output tokens of every
    admission that looked the cache up) and ``hits_tokens`` (of those, served from the cache);
    ``evictions`` counts cached blocks taken back for new data.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._block_by_hash: dict[BlockHash, int] = {}
        self._hash_by_block: dict[int, BlockHash] = {}
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.queries_tokens = 0
        self.hits_tokens = 0
        self.evictions = 0

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_evictable(self) -> int:
        """Cached blocks no sequence holds (reusable, or evictable for new data)."""
        return len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_by_block)

    def refcount(self, block: int) -> int:
        return self._refs.get(block, 0)

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def match(self, hashes: Sequence[BlockHash], num_tokens: int) -> PrefixHit:
        """The longest cached prefix of ``hashes``, capped so that at least one of ``num_tokens`` is left."""
        max_blocks = max(0, (num_tokens - 1) // self.block_size)
        blocks: list[int] = []
        for h in hashes[:max_blocks]:
            b = self._block_by_hash.get(h)
            if b is None:
                break
            blocks.append(b)
        return PrefixHit(tuple(blocks), len(blocks) * self.block_size) if blocks else NO_HIT

    # -- changes -----------------------------------------------------------------------------

    def record_lookup(self, num_tokens: int, hit: PrefixHit) -> None:
        """Count one admission's lookup (tokens queried, tokens hit)."""
        self.queries_tokens += num_tokens
        self.hits_tokens += hit.num_tokens

    def acquire(self, block: int) -> None:
        """One more holder of ``block`` (a new block, or a cached one taken back from the LRU)."""
        self._refs[block] = self._refs.get(block, 0) + 1
        self._evictable.pop(block, None)

    def release(self, block: int) -> bool:
        """One holder fewer. True when the block goes back to the free list (unreferenced, uncached)."""
        n = self._refs.get(block, 0) - 1
        if n > 0:
            self._refs[block] = n
            return False
        self._refs.pop(block, None)
        if block in self._hash_by_block:
            self._evictable[block] = None  # most recently used at the tail
            return False
        return True

    def register(self, block: int, h: BlockHash) -> None:
        """Index a block that became full. A hash already indexed keeps its first block."""
        if h in self._block_by_hash or block in self._hash_by_block:
            return
        self._block_by_hash[h] = block
        self._hash_by_block[block] = h

    def evict(self) -> int | None:
        """Take the least recently used unreferenced cached block out of the index (None if none)."""
        if not self._evictable:
            return None
        block, _ = self._evictable.popitem(last=False)
        h = self._hash_by_block.pop(block)
        del self._block_by_hash[h]
        self.evictions += 1
        return block
