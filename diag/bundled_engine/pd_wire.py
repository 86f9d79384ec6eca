"""The data plane of disaggregated prefill/decode: one request's KV over point-to-point send/recv.

A transfer is three messages from the prefill side (rank 0) to the decode worker (rank 1) over
their ``torch.distributed`` process group (gloo on CPU, NCCL on CUDA), as :mod:`diag.bundled_engine.pp`
sends activations:

1. a header, int64 ``[kind, meta bytes, KV elements]`` (tag 0);
2. the request's :class:`KVMeta`, pickled, as a uint8 tensor (tag 1);
3. its KV, ``[2, layers, prompt tokens, kv_heads, head_dim]`` in the model's dtype (tag 2):
   every layer's K and V of the prompt (:meth:`~diag.bundled_engine.kv_cache.PagedKVCache.export_slots`).

A header of kind :data:`KIND_STOP` (no meta, no KV) ends the receiver. Messages of one tag
between one pair of ranks arrive in the order they were sent; one thread sends and one thread
receives, so transfers never interleave.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch

from diag.bundled_engine.sampler import SamplingParams

KIND_KV = 0
KIND_STOP = 1
KIND_PING = 2  # warm-up: meta and KV are sent and dropped

_TAG_HEADER, _TAG_META, _TAG_KV = 0, 1, 2


@dataclass(frozen=True)
class KVMeta:
    """What travels with a request's KV: who it is, what it asked for, the first token the prefill
    side sampled (and the sampler's generator state after it, so a seeded request continues the
    same random stream), and the KV tensor's shape and dtype."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    default_seed: int
    generator_state: bytes | None
    first_token: int
    kv_shape: tuple[int, ...]
    kv_dtype: str

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def send_kv(pg: Any, dst: int, meta: KVMeta | None, kv: torch.Tensor | None, device: torch.device,
            kind: int = KIND_KV) -> None:
    """Send one transfer (or a stop header) to ``dst`` and wait until it has gone; blocks the calling thread."""
    blob = pickle.dumps(meta) if meta is not None else b""
    numel = kv.numel() if kv is not None else 0
    head = torch.tensor([kind, len(blob), numel], dtype=torch.long, device=device)
    works = [pg.send([head], dst, _TAG_HEADER)]
    if kind != KIND_STOP:
        works.append(pg.send([torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)], dst, _TAG_META))
        assert kv is not None
        works.append(pg.send([kv.contiguous()], dst, _TAG_KV))
    for w in works:
        w.wait()


def recv_kv(pg: Any, src: int, device: torch.device) -> tuple[int, KVMeta | None, torch.Tensor | None]:
    """Receive one transfer from ``src``: (kind, meta, KV); blocks until its header arrives."""
    head = torch.empty(3, dtype=torch.long, device=device)
    pg.recv([head], src, _TAG_HEADER).wait()
    kind, nbytes, numel = (int(x) for x in head.tolist())
    if kind == KIND_STOP:
        return kind, None, None
    blob = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pg.recv([blob], src, _TAG_META).wait()
    meta: KVMeta = pickle.loads(blob.cpu().numpy().tobytes())
    kv = torch.empty(meta.kv_shape, dtype=getattr(torch, meta.kv_dtype), device=device)
    if kv.numel() != numel:
        raise RuntimeError(f"KV transfer of {meta.request_id}: header says {numel} elements, meta {kv.numel()}")
    pg.recv([kv], src, _TAG_KV).wait()
    return kind, meta, kv


def kv_meta(request_id: str, prompt_ids: list[int], params: SamplingParams, default_seed: int,
            generator: torch.Generator | None, first_token: int, kv: torch.Tensor) -> KVMeta:
    """The :class:`KVMeta` of a request whose prefill sampled ``first_token`` and produced ``kv``."""
    state = bytes(generator.get_state().numpy().tobytes()) if generator is not None else None
    return KVMeta(request_id, tuple(prompt_ids), params, default_seed, state, first_token, tuple(kv.shape),
                  _dtype_name(kv.dtype))


def restore_generator(state: bytes | None) -> torch.Generator | None:
    """A CPU generator with the state :func:`kv_meta` saved (None when the request had none yet)."""
    if state is None:
        return None
    g = torch.Generator()
    g.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    return g
