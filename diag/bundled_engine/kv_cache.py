"""The paged KV cache: a block manager (free list + per-sequence block tables) and the K/V storage.

A block holds ``block_size`` consecutive token positions of one sequence for every layer. Token
position ``p`` of a sequence lives at slot ``block_table[p // block_size] * block_size +
p % block_size`` of the flat storage. Bytes per token = 2 (K and V) x layers x KV heads x head
dim x dtype size (per TP rank: KV heads / tp).

With ``prefix_caching`` the manager also keeps a :class:`~diag.bundled_engine.prefix_cache.PrefixCache`:
blocks are reference-counted, full blocks are indexed by a chained hash, and a freed cached
block waits in an LRU list (counted as free) until a request with the same prefix takes it back
or allocation evicts it. Without it every method behaves as before, block for block.

Threading: :class:`BlockManager` and :class:`PagedKVCache` are owned by the engine's step loop
thread (a TP worker owns its own storage shard); nothing here locks.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import torch

from diag.bundled_engine.prefix_cache import NO_HIT, BlockHash, PrefixCache, PrefixHit, chain_hashes


class NoFreeBlocksError(RuntimeError):
    """Raised by :meth:`BlockManager.allocate` when the free list cannot cover a request."""


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K+V bytes one token occupies: 2 x layers x kv_heads x head_dim x element size."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` positions (ceil division)."""
    return -(-num_tokens // block_size)


def position_slots(block_table: list[int], num_tokens: int, block_size: int) -> torch.Tensor:
    """Flat cache slots ``[num_tokens]`` (int64) of positions ``0..num_tokens-1`` of a sequence."""
    pos = torch.arange(num_tokens, dtype=torch.long)
    return torch.tensor(block_table, dtype=torch.long)[pos // block_size] * block_size + pos % block_size


class BlockManager:
    """Fixed-size blocks, a free list and one block table per sequence id.

    Blocks are taken when a sequence's token count grows past its table's capacity (prefill,
    chunks, decode) and returned on :meth:`free` (finish, abort, preemption, disconnect).
    With ``prefix_caching``, :meth:`match_prefix` finds a waiting sequence's cached blocks,
    :meth:`allocate` with ``hit`` puts them at the head of its table, and
    :meth:`cache_full_blocks` indexes the blocks a step filled.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}
        #: None when prefix caching is off
        self.prefix_cache: PrefixCache | None = PrefixCache(block_size) if prefix_caching else None
        self._hashes: dict[str, list[BlockHash]] = {}  # per sequence: hashes of its full blocks
        self._num_indexed: dict[str, int] = {}  # per sequence: table blocks already in the index

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: the free list plus unreferenced cached blocks."""
        if self.prefix_cache is not None:
            return len(self._free) + self.prefix_cache.num_evictable
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def usage_ratio(self) -> float:
        """Used blocks / all blocks, 0..1."""
        return self.num_used_blocks / self.num_blocks

    def block_table(self, seq_id: str) -> list[int]:
        """The sequence's block ids in position order (empty if it holds none). Do not mutate."""
        return self._tables.get(seq_id, [])

    def capacity_tokens(self, seq_id: str) -> int:
        """Token positions the sequence's current blocks can hold."""
        return len(self._tables.get(seq_id, ())) * self.block_size

    def extra_blocks_for(self, seq_id: str, total_tokens: int, hit: PrefixHit = NO_HIT) -> int:
        """Blocks still to take so that the sequence can hold ``total_tokens`` positions."""
        held = len(self._tables.get(seq_id, ())) + len(hit.blocks)
        return max(0, blocks_needed(total_tokens, self.block_size) - held)

    def available_for(self, hit: PrefixHit = NO_HIT) -> int:
        """Blocks left to take once a sequence holds ``hit``: free blocks less the hit's blocks
        that now wait in the LRU (they stop being free when it holds them)."""
        if self.prefix_cache is None or not hit.blocks:
            return self.num_free_blocks
        return self.num_free_blocks - sum(1 for b in hit.blocks if self.prefix_cache.is_evictable(b))

    def can_grow(self, seq_id: str, total_tokens: int, hit: PrefixHit = NO_HIT) -> bool:
        """True when :meth:`allocate` (with the same ``hit``) would succeed."""
        if self.prefix_cache is None:
            return self.extra_blocks_for(seq_id, total_tokens) <= len(self._free)
        return self.extra_blocks_for(seq_id, total_tokens, hit) <= self.available_for(hit)

    def match_prefix(self, seq_id: str, token_ids: list[int]) -> PrefixHit:
        """The cached blocks that hold the longest prefix of ``token_ids`` (a sequence holding no blocks).

        Changes nothing but the sequence's memoised hashes; :data:`NO_HIT` with caching off.
        """
        if self.prefix_cache is None:
            return NO_HIT
        hashes = self._hashes[seq_id] = chain_hashes(token_ids, self.block_size, self._hashes.get(seq_id, ()))
        return self.prefix_cache.match(hashes, len(token_ids))

    def has(self, seq_id: str) -> bool:
        return seq_id in self._tables

    # -- changes -----------------------------------------------------------------------------

    def allocate(self, seq_id: str, total_tokens: int, hit: PrefixHit = NO_HIT) -> list[int]:
        """Grow the sequence's table to hold ``total_tokens`` positions; return the table.

        ``hit`` (from :meth:`match_prefix`, only for a sequence holding no blocks) puts those
        cached blocks first. Raises NoFreeBlocksError (taking nothing) when too few blocks are free.
        """
        pc = self.prefix_cache
        if pc is None:
            need = self.extra_blocks_for(seq_id, total_tokens)
            if need > len(self._free):
                raise NoFreeBlocksError(f"need {need} blocks, {len(self._free)} free")
            table = self._tables.setdefault(seq_id, [])
            for _ in range(need):
                table.append(self._free.popleft())
            return table
        if not self.can_grow(seq_id, total_tokens, hit):
            raise NoFreeBlocksError(
                f"need {self.extra_blocks_for(seq_id, total_tokens, hit)} blocks, {self.num_free_blocks} free"
            )
        need = self.extra_blocks_for(seq_id, total_tokens, hit)
        table = self._tables.setdefault(seq_id, [])
        if hit.blocks:
            assert not table, "a prefix hit is for a sequence that holds no blocks"
            for b in hit.blocks:
                pc.acquire(b)
                table.append(b)
            self._num_indexed[seq_id] = len(hit.blocks)
        for _ in range(need):
            b = self._free.popleft() if self._free else pc.evict()
            assert b is not None
            pc.acquire(b)
            table.append(b)
        return table

    def cache_full_blocks(self, seq_id: str, num_computed_tokens: int, token_slice: Callable[[int, int], list[int]]) -> None:
        """Index the sequence's blocks that its first ``num_computed_tokens`` tokens fill.

        ``token_slice(start, end)`` gives the sequence's token ids at positions start..end-1.
        No-op with caching off.
        """
        pc = self.prefix_cache
        if pc is None:
            return
        table = self._tables.get(seq_id)
        if not table:
            return
        full = min(num_computed_tokens // self.block_size, len(table))
        done = self._num_indexed.get(seq_id, 0)
        if full <= done:
            return
        hashes = self._hashes.get(seq_id, [])
        if len(hashes) < full:
            hashes = chain_hashes(token_slice(0, full * self.block_size), self.block_size, hashes)
            self._hashes[seq_id] = hashes
        for i in range(done, full):
            pc.register(table[i], hashes[i])
        self._num_indexed[seq_id] = full

    def free(self, seq_id: str) -> int:
        """Release all of the sequence's blocks; the number released (0 if none).

        Caching off: they go back to the free list. On: each loses one reference; an
        unreferenced cached block goes to the LRU (tail blocks first), others to the free list.
        """
        table = self._tables.pop(seq_id, None)
        pc = self.prefix_cache
        if pc is not None:
            self._hashes.pop(seq_id, None)
            self._num_indexed.pop(seq_id, None)
        if not table:
            return 0
        if pc is None:
            self._free.extend(table)
        else:
            for b in reversed(table):
                if pc.release(b):
                    self._free.append(b)
        return len(table)


class PagedKVCache:
    """K and V storage for every layer, addressed by flat slot index (block * block_size + offset).

    ``k[layer]`` and ``v[layer]`` are ``[num_blocks * block_size, kv_heads, head_dim]``.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)

    @property
    def total_bytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` ``[n, kv_heads, head_dim]`` at flat ``slots`` ``[n]``."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def export_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of K and V at ``slots`` ``[n]`` in every layer: ``[2, layers, n, kv_heads, head_dim]``
        (what disaggregated prefill/decode sends; :meth:`import_slots` writes it back)."""
        slots = slots.to(self.k.device)
        return torch.stack((self.k.index_select(1, slots), self.v.index_select(1, slots)))

    def import_slots(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Write ``kv`` ``[2, layers, n, kv_heads, head_dim]`` (from :meth:`export_slots`) at ``slots`` ``[n]``."""
        slots = slots.to(self.k.device)
        self.k.index_copy_(1, slots, kv[0])
        self.v.index_copy_(1, slots, kv[1])

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots`` (any shape ``S``) -> two tensors ``[*S, kv_heads, head_dim]``."""
        flat = slots.reshape(-1)
        shape = (*slots.shape, *self.k.shape[2:])
        return self.k[layer].index_select(0, flat).view(shape), self.v[layer].index_select(0, flat).view(shape)
