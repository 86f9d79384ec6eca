"""The paged KV cache: a block manager (free list + per-sequence block tables) and the K/V storage.

A block holds ``block_size`` consecutive token positions of one sequence for every layer. Token
position ``p`` of a sequence lives at slot ``block_table[p // block_size] * block_size +
p % block_size`` of the flat storage. Bytes per token = 2 (K and V) x layers x KV heads x head
dim x dtype size (per TP rank: KV heads / tp).

Threading: :class:`BlockManager` and :class:`PagedKVCache` are owned by the engine's step loop
thread (a TP worker owns its own storage shard); nothing here locks.
"""

from __future__ import annotations

from collections import deque

import torch


class NoFreeBlocksError(RuntimeError):
    """Raised by :meth:`BlockManager.allocate` when the free list cannot cover a request."""


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K+V bytes one token occupies: 2 x layers x kv_heads x head_dim x element size."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` positions (ceil division)."""
    return -(-num_tokens // block_size)


class BlockManager:
    """Fixed-size blocks, a free list and one block table per sequence id.

    Blocks are taken when a sequence's token count grows past its table's capacity (prefill,
    chunks, decode) and returned on :meth:`free` (finish, abort, preemption, disconnect).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def usage_ratio(self) -> float:
        """Used blocks / all blocks, 0..1."""
        return self.num_used_blocks / self.num_blocks

    def block_table(self, seq_id: str) -> list[int]:
        """The sequence's block ids in position order (empty if it holds none). Do not mutate."""
        return self._tables.get(seq_id, [])

    def capacity_tokens(self, seq_id: str) -> int:
        """Token positions the sequence's current blocks can hold."""
        return len(self._tables.get(seq_id, ())) * self.block_size

    def extra_blocks_for(self, seq_id: str, total_tokens: int) -> int:
        """Blocks still to take so that the sequence can hold ``total_tokens`` positions."""
        return max(0, blocks_needed(total_tokens, self.block_size) - len(self._tables.get(seq_id, ())))

    def can_grow(self, seq_id: str, total_tokens: int) -> bool:
        return self.extra_blocks_for(seq_id, total_tokens) <= len(self._free)

    def has(self, seq_id: str) -> bool:
        return seq_id in self._tables

    # -- changes -----------------------------------------------------------------------------

    def allocate(self, seq_id: str, total_tokens: int) -> list[int]:
        """Grow the sequence's table to hold ``total_tokens`` positions; return the table.

        Raises NoFreeBlocksError (taking nothing) when the free list is too short.
        """
        need = self.extra_blocks_for(seq_id, total_tokens)
        if need > len(self._free):
            raise NoFreeBlocksError(f"need {need} blocks, {len(self._free)} free")
        table = self._tables.setdefault(seq_id, [])
        for _ in range(need):
            table.append(self._free.popleft())
        return table

    def free(self, seq_id: str) -> int:
        """Return all of the sequence's blocks to the free list; the number freed (0 if none)."""
        table = self._tables.pop(seq_id, None)
        if not table:
            return 0
        self._free.extend(table)
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

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots`` (any shape ``S``) -> two tensors ``[*S, kv_heads, head_dim]``."""
        flat = slots.reshape(-1)
        shape = (*slots.shape, *self.k.shape[2:])
        return self.k[layer].index_select(0, flat).view(shape), self.v[layer].index_select(0, flat).view(shape)
