"""The model's LoRA slots: ``max_loras`` adapters held on the model's device, and the batched delta
a forward adds for each sequence whose adapter is in one.

Per layer and per fused projection group (:data:`diag.bundled_engine.lora.GROUPS`) a slot holds a stacked
``A`` ``[n * R, in]`` and a block-diagonal ``B`` ``[out, n * R]`` (``R`` = ``max_lora_rank``,
scale folded into ``B``), as vLLM's punica layers hold ``lora_a_stacked`` / ``lora_b_stacked`` per
slot. :meth:`LoraSlots.load` copies a :class:`~diag.bundled_engine.lora.PackedAdapter` from host memory
into a slot (a real copy, to the GPU on CUDA); :meth:`LoraSlots.apply` adds ``x[rows] @ A.T @ B.T``
to a projection's output rows, one pair of matmuls per adapter in the batch.

Threading: owned by the thread that runs the model (the engine's step loop).
"""

from __future__ import annotations

import torch

from diag.bundled_engine.lora import GROUPS, PackedAdapter, group_shapes
from diag.bundled_engine.model_config import ModelConfig

#: one forward's adapters: (slot, row indices of its tokens; None = every row of the batch)
LoraGroups = list[tuple[int, "torch.Tensor | None"]]


class LoraSlots:
    """``num_slots`` adapter slots of rank ``max_rank`` for every layer of ``cfg`` on ``device``."""

    def __init__(self, cfg: ModelConfig, num_slots: int, max_rank: int, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        shapes = group_shapes(cfg, max_rank)
        self._a: list[dict[str, torch.Tensor]] = []
        self._b: list[dict[str, torch.Tensor]] = []
        for _ in range(cfg.num_layers):
            self._a.append({g: torch.zeros((num_slots, *shapes[g][0]), dtype=dtype, device=device) for g, _t in GROUPS})
            self._b.append({g: torch.zeros((num_slots, *shapes[g][1]), dtype=dtype, device=device) for g, _t in GROUPS})

    @property
    def nbytes(self) -> int:
        """Bytes the slots take on the device."""
        return sum(t.numel() * t.element_size() for layer in self._a + self._b for t in layer.values())

    def load(self, slot: int, adapter: PackedAdapter) -> None:
        """Copy ``adapter`` into ``slot`` (every layer's A and B; waits for the copy on CUDA)."""
        for li, layer in enumerate(adapter.layers):
            for g, (a, b) in layer.items():
                self._a[li][g][slot].copy_(a)
                self._b[li][g][slot].copy_(b)
        if self._a and self._a[0]["qkv"].is_cuda:
            torch.cuda.synchronize(self._a[0]["qkv"].device)

    def apply(self, layer: int, group: str, x: torch.Tensor, out: torch.Tensor, groups: LoraGroups) -> None:
        """``out[rows] += x[rows] @ A.T @ B.T`` for each (slot, rows) of ``groups``, in place."""
        a_all, b_all = self._a[layer][group], self._b[layer][group]
        for slot, rows in groups:
            a, b = a_all[slot], b_all[slot]
            if rows is None:
                out.add_((x @ a.t()) @ b.t())
            else:
                out.index_add_(0, rows, (x.index_select(0, rows) @ a.t()) @ b.t())
