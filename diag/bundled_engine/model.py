"""A Llama-style decoder-only transformer in torch: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Weights use Hugging Face Llama names (``model.layers.0.self_attn.q_proj.weight`` ...), so the
same code path serves seeded random presets and local HF checkpoints. Attention reads and writes
K/V through a :class:`~diag.bundled_engine.kv_cache.PagedKVCache` via per-sequence block tables; a
tensor-parallel rank holds only its shard of heads and MLP columns and calls ``all_reduce`` after
the attention output and MLP down projections. A pipeline-parallel stage holds a contiguous run of
layers (:func:`stage_layers`); the first stage embeds tokens, the last one applies the final norm
and LM head, and :meth:`LlamaModel.forward_stage` passes hidden states ``[tokens, hidden]`` between.
With LoRA slots attached (:attr:`LlamaModel.lora`, :mod:`diag.bundled_engine.lora_slots`) a sequence whose
:attr:`SeqInput.lora_slot` is set gets its adapter's delta on every fused projection (q/k/v, o,
gate/up, down), added to its rows of the projection's output.

Its configuration, presets and weights are in :mod:`diag.bundled_engine.model_config`.

Threading: a model instance is used by one thread at a time (the engine's step loop, or a TP
worker process's loop). Nothing here allocates per-request state.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from diag.bundled_engine.kv_cache import PagedKVCache
from diag.bundled_engine.model_config import (PRESETS, CheckpointError, ModelConfig, config_from_hf, load_checkpoint,
                                      random_state_dict, stage_layers)

if TYPE_CHECKING:  # pragma: no cover
    from diag.bundled_engine.lora_slots import LoraGroups, LoraSlots

AllReduce = Callable[[torch.Tensor], torch.Tensor]

# --- the model ---------------------------------------------------------------------------------


@dataclass
class SeqInput:
    """One sequence's share of a forward pass.

    ``token_ids`` are the new tokens (a whole prompt, a prefill chunk, or one decode token) at
    positions ``start_pos .. start_pos+len-1``; positions ``< start_pos`` are already in the cache.
    ``lora_slot``: the LoRA slot of the sequence's adapter (None: the base model).
    """

    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    want_logits: bool = True
    lora_slot: int | None = None


@dataclass
class _Layer:
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


_TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
_HAS_ENABLE_GQA = _TORCH_VERSION >= (2, 5)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, group: int) -> torch.Tensor:
    """Attention over 4-D ``[B, heads, T, d]``; K/V have ``heads / group`` heads (GQA).

    ``mask`` None means causal (top-left aligned, i.e. a prefill from position 0).
    """
    if group > 1 and not _HAS_ENABLE_GQA:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        group = 1
    kw = {"enable_gqa": True} if group > 1 else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, **kw)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class _Batch:
    """One forward's per-token metadata (positions, cache slots, attention layout), built once and
    shared by every layer (and rebuilt on each pipeline stage from the same ``SeqInput`` list)."""

    total: int
    tokens: torch.Tensor
    slots: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    prefill: list[tuple[int, int, int, torch.Tensor | None]]
    prefill_masks: list[torch.Tensor | None]
    ctx_dev: list[torch.Tensor | None]
    dec_rows_t: torch.Tensor | None
    dec_slots: torch.Tensor | None
    dec_mask: torch.Tensor | None
    logit_rows: list[int]
    #: (LoRA slot, rows of its sequences' tokens; None = all rows), empty without LoRA sequences
    lora_groups: "LoraGroups" = field(default_factory=list)


@dataclass
class LlamaModel:
    """The decoder (one TP shard of it when ``tp_size > 1``; one pipeline stage's layers when
    ``pp_size > 1``, ``first_layer`` the global index of ``layers[0]``). Build with
    :meth:`from_state_dict`."""

    cfg: ModelConfig
    tp_rank: int
    tp_size: int
    device: torch.device
    embed: torch.Tensor
    layers: list[_Layer]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    all_reduce: AllReduce | None = None
    local_heads: int = 0
    local_kv_heads: int = 0
    extra: dict[str, object] = field(default_factory=dict)
    pp_rank: int = 0
    pp_size: int = 1
    first_layer: int = 0
    #: LoRA adapter slots (set by the engine with ``--lora-modules``; tp = pp = 1 only)
    lora: "LoraSlots | None" = None

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @classmethod
    def from_state_dict(
        cls,
        cfg: ModelConfig,
        sd: Mapping[str, torch.Tensor],
        device: str | torch.device = "cpu",
        tp_rank: int = 0,
        tp_size: int = 1,
        all_reduce: AllReduce | None = None,
        pp_rank: int = 0,
        pp_size: int = 1,
    ) -> "LlamaModel":
        """Take this rank's shard of HF-named weights (its TP shard of its pipeline stage's
        layers), cast to ``cfg.dtype``, move to ``device``. Embeddings and LM head are loaded on
        every stage (the first embeds, the last projects; small next to the layers)."""
        cfg.validate_tp(tp_size)
        cfg.validate_pp(pp_size)
        own = stage_layers(cfg.num_layers, pp_size, pp_rank)
        dev = torch.device(device)
        dt = cfg.torch_dtype
        d = cfg.head_dim
        hq, hkv, inter = cfg.num_heads // tp_size, cfg.num_kv_heads // tp_size, cfg.intermediate_size // tp_size

        def get(name: str) -> torch.Tensor:
            try:
                return sd[name]
            except KeyError:
                raise CheckpointError(f"weights: missing tensor {name!r}") from None

        def rows(t: torch.Tensor, n: int) -> torch.Tensor:
            return t[tp_rank * n : (tp_rank + 1) * n]

        def cols(t: torch.Tensor, n: int) -> torch.Tensor:
            return t[:, tp_rank * n : (tp_rank + 1) * n]

        def prep(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=dev, dtype=dt).contiguous()

        layers: list[_Layer] = []
        for i in own:
            p = f"model.layers.{i}."
            q = rows(get(p + "self_attn.q_proj.weight"), hq * d)
            k = rows(get(p + "self_attn.k_proj.weight"), hkv * d)
            v = rows(get(p + "self_attn.v_proj.weight"), hkv * d)
            gate = rows(get(p + "mlp.gate_proj.weight"), inter)
            up = rows(get(p + "mlp.up_proj.weight"), inter)
            layers.append(
                _Layer(
                    w_qkv=prep(torch.cat([q, k, v], 0)),
                    w_o=prep(cols(get(p + "self_attn.o_proj.weight"), hq * d)),
                    w_gate_up=prep(torch.cat([gate, up], 0)),
                    w_down=prep(cols(get(p + "mlp.down_proj.weight"), inter)),
                    attn_norm=prep(get(p + "input_layernorm.weight")),
                    mlp_norm=prep(get(p + "post_attention_layernorm.weight")),
                )
            )
        embed = prep(get("model.embed_tokens.weight"))
        lm_head = embed if cfg.tie_embeddings else prep(sd.get("lm_head.weight", get("model.embed_tokens.weight")))
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        t = torch.arange(cfg.max_position, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        return cls(
            cfg=cfg,
            tp_rank=tp_rank,
            tp_size=tp_size,
            device=dev,
            embed=embed,
            layers=layers,
            final_norm=prep(get("model.norm.weight")),
            lm_head=lm_head,
            rope_cos=emb.cos().to(device=dev, dtype=dt),
            rope_sin=emb.sin().to(device=dev, dtype=dt),
            all_reduce=all_reduce,
            local_heads=hq,
            local_kv_heads=hkv,
            pp_rank=pp_rank,
            pp_size=pp_size,
            first_layer=own.start,
        )

    # -- paged forward -------------------------------------------------------------------------

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1 and self.all_reduce is not None:
            return self.all_reduce(x)
        return x

    @torch.inference_mode()
    def forward(self, seqs: Sequence[SeqInput], cache: PagedKVCache, compute_logits: bool = True) -> torch.Tensor | None:
        """Run one batched step: write the new tokens' K/V into ``cache`` and return logits.

        Returns float32 logits ``[n, vocab]`` for the last new token of each sequence with
        ``want_logits`` (in order), or None when ``compute_logits`` is False (TP workers).
        All sequences' tokens go through the projections and MLP as one matrix; attention runs
        per prefill sequence and as one padded batch for single-token (decode) sequences.
        Needs the whole model on this rank (``pp_size == 1``); stages use :meth:`forward_stage`.
        """
        if self.pp_size != 1:
            raise ValueError("forward needs every layer (pp_size=1); a pipeline stage runs forward_stage")
        return self.forward_stage(seqs, cache, None, compute_logits)

    @torch.inference_mode()
    def forward_stage(self, seqs: Sequence[SeqInput], cache: PagedKVCache, hidden: torch.Tensor | None = None,
                      compute_logits: bool = True) -> torch.Tensor | None:
        """This stage's share of one step: embed the tokens (first stage) or take ``hidden``
        ``[tokens, hidden_size]`` from the stage before, run this stage's layers (K/V into
        ``cache``, which holds only these layers), then return float32 logits (last stage; None
        when ``compute_logits`` is False or no sequence wants logits) or the hidden states for
        the next stage."""
        b = self._batch(seqs, cache.block_size)
        if self.is_first_stage:
            x = self.embed[b.tokens]
        else:
            if hidden is None or hidden.shape[0] != b.total:
                raise ValueError(f"pipeline stage {self.pp_rank} needs hidden states for {b.total} tokens")
            x = hidden
        x = self._run_layers(x, b, cache)
        if not self.is_last_stage:
            return x
        if not compute_logits or not b.logit_rows:
            return None
        last = x[torch.tensor(b.logit_rows, dtype=torch.long, device=self.device)]
        return F.linear(_rms_norm(last, self.final_norm, self.cfg.rms_norm_eps), self.lm_head).float()

    def _batch(self, seqs: Sequence[SeqInput], bs: int) -> _Batch:
        """Positions, cache slots and attention layout of a step (``bs``: block size in tokens)."""
        dev = self.device
        tok_list: list[int] = []
        pos_parts: list[torch.Tensor] = []
        slot_parts: list[torch.Tensor] = []
        prefill: list[tuple[int, int, int, torch.Tensor | None]] = []  # (row, n, start, ctx_slots)
        dec_rows: list[int] = []
        dec_ctx: list[torch.Tensor] = []
        logit_rows: list[int] = []
        lora_rows: dict[int, list[int]] = {}
        row = 0
        for s in seqs:
            n = len(s.token_ids)
            if s.lora_slot is not None:
                lora_rows.setdefault(s.lora_slot, []).extend(range(row, row + n))
            tok_list.extend(s.token_ids)
            bt = torch.tensor(s.block_table, dtype=torch.long)
            ctx_pos = torch.arange(0, s.start_pos + n, dtype=torch.long)
            ctx_slots = bt[ctx_pos // bs] * bs + ctx_pos % bs
            pos_parts.append(ctx_pos[s.start_pos :])
            slot_parts.append(ctx_slots[s.start_pos :])
            if n == 1:
                dec_rows.append(row)
                dec_ctx.append(ctx_slots)
            else:
                prefill.append((row, n, s.start_pos, ctx_slots if s.start_pos > 0 else None))
            if s.want_logits:
                logit_rows.append(row + n - 1)
            row += n
        positions = torch.cat(pos_parts).to(dev)
        # decode batch: pad context slots to the longest, mask the padding
        dec_slots = dec_mask = dec_rows_t = None
        if dec_rows:
            lmax = max(len(c) for c in dec_ctx)
            pad = torch.zeros(len(dec_ctx), lmax, dtype=torch.long)
            msk = torch.zeros(len(dec_ctx), lmax, dtype=torch.bool)
            for i, c in enumerate(dec_ctx):
                pad[i, : len(c)] = c
                msk[i, : len(c)] = True
            dec_slots = pad.to(dev)
            dec_mask = msk.to(dev)[:, None, None, :]
            dec_rows_t = torch.tensor(dec_rows, dtype=torch.long, device=dev)
        prefill_masks: list[torch.Tensor | None] = []
        for _row, n, start, ctx in prefill:
            if ctx is None:
                prefill_masks.append(None)
            else:
                q_pos = torch.arange(start, start + n, device=dev)[:, None]
                k_pos = torch.arange(0, start + n, device=dev)[None, :]
                prefill_masks.append(k_pos <= q_pos)
        return _Batch(
            total=row,
            tokens=torch.tensor(tok_list, dtype=torch.long, device=dev),
            slots=torch.cat(slot_parts).to(dev),
            cos=self.rope_cos[positions].unsqueeze(1),  # [T, 1, D]
            sin=self.rope_sin[positions].unsqueeze(1),
            prefill=prefill,
            prefill_masks=prefill_masks,
            ctx_dev=[None if c is None else c.to(dev) for (_r, _n, _s, c) in prefill],
            dec_rows_t=dec_rows_t,
            dec_slots=dec_slots,
            dec_mask=dec_mask,
            logit_rows=logit_rows,
            lora_groups=self._lora_groups(lora_rows, row),
        )

    def _lora_groups(self, lora_rows: dict[int, list[int]], total: int) -> "LoraGroups":
        """Each LoRA slot in the batch with the rows of its tokens (None when it has every row)."""
        if not lora_rows:
            return []
        if self.lora is None:
            raise ValueError("a sequence asks for a LoRA slot but the model has no LoRA slots")
        return [(slot, None if len(rows) == total else torch.tensor(rows, dtype=torch.long, device=self.device))
                for slot, rows in lora_rows.items()]

    def _run_layers(self, x: torch.Tensor, b: _Batch, cache: PagedKVCache) -> torch.Tensor:
        """This rank's layers over ``x`` ``[tokens, hidden]``; cache layer ``li`` is the local index."""
        cfg, dev = self.cfg, self.device
        total, cos, sin = b.total, b.cos, b.sin
        hq, hkv, d = self.local_heads, self.local_kv_heads, cfg.head_dim
        group = hq // hkv
        eps = cfg.rms_norm_eps
        lora, lg = self.lora, b.lora_groups
        for li, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.attn_norm, eps)
            qkv = F.linear(h, layer.w_qkv)
            if lg:
                lora.apply(li, "qkv", h, qkv, lg)  # type: ignore[union-attr]
            q = qkv[:, : hq * d].view(total, hq, d)
            k = qkv[:, hq * d : (hq + hkv) * d].view(total, hkv, d)
            v = qkv[:, (hq + hkv) * d :].view(total, hkv, d)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache.write(li, b.slots, k, v)
            attn = torch.empty(total, hq, d, dtype=x.dtype, device=dev)
            for (r, n, _start, _c), ctx, mask in zip(b.prefill, b.ctx_dev, b.prefill_masks):
                if ctx is None:
                    kc, vc = k[r : r + n], v[r : r + n]
                else:
                    kc, vc = cache.gather(li, ctx)
                # 4-D [1, heads, T, d] inputs select torch's fused CPU/GPU kernels
                o = _sdpa(
                    q[r : r + n].transpose(0, 1)[None],
                    kc.transpose(0, 1)[None],
                    vc.transpose(0, 1)[None],
                    mask,
                    group,
                )
                attn[r : r + n] = o[0].transpose(0, 1)
            if b.dec_rows_t is not None:
                assert b.dec_slots is not None and b.dec_mask is not None
                kc, vc = cache.gather(li, b.dec_slots)  # [B, L, hkv, d]
                qd = q[b.dec_rows_t].unsqueeze(2)  # [B, hq, 1, d]
                o = _sdpa(qd, kc.transpose(1, 2), vc.transpose(1, 2), b.dec_mask, group)
                attn[b.dec_rows_t] = o.squeeze(2)
            if not lg:
                x = x + self._reduce(F.linear(attn.view(total, hq * d), layer.w_o))
                h = _rms_norm(x, layer.mlp_norm, eps)
                gu = F.linear(h, layer.w_gate_up)
                inter = gu.shape[-1] // 2
                x = x + self._reduce(F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], layer.w_down))
                continue
            assert lora is not None
            o_in = attn.view(total, hq * d)
            o = F.linear(o_in, layer.w_o)
            lora.apply(li, "o", o_in, o, lg)
            x = x + self._reduce(o)
            h = _rms_norm(x, layer.mlp_norm, eps)
            gu = F.linear(h, layer.w_gate_up)
            lora.apply(li, "gate_up", h, gu, lg)
            inter = gu.shape[-1] // 2
            act = F.silu(gu[:, :inter]) * gu[:, inter:]
            down = F.linear(act, layer.w_down)
            lora.apply(li, "down", act, down, lg)
            x = x + self._reduce(down)
        return x

    # -- dense reference -------------------------------------------------------------------------

    @torch.inference_mode()
    def forward_dense(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Reference forward without any cache (whole sequence, causal): float32 logits ``[T, vocab]``.

        Only for an unsharded model; used by tests to check the paged path.
        """
        if self.tp_size != 1 or self.pp_size != 1:
            raise ValueError("forward_dense needs an unsharded model (tp_size=1, pp_size=1)")
        cfg, dev = self.cfg, self.device
        t = len(token_ids)
        hq, hkv, d = self.local_heads, self.local_kv_heads, cfg.head_dim
        x = self.embed[torch.tensor(list(token_ids), dtype=torch.long, device=dev)]
        cos, sin = self.rope_cos[:t].unsqueeze(1), self.rope_sin[:t].unsqueeze(1)
        for layer in self.layers:
            h = _rms_norm(x, layer.attn_norm, cfg.rms_norm_eps)
            q, k, v = F.linear(h, layer.w_qkv).split([hq * d, hkv * d, hkv * d], dim=-1)
            q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(d)
            causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(x.dtype)
            x = x + F.linear(o.reshape(t, hq * d), layer.w_o)
            h = _rms_norm(x, layer.mlp_norm, cfg.rms_norm_eps)
            gate, up = F.linear(h, layer.w_gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.w_down)
        return F.linear(_rms_norm(x, self.final_norm, cfg.rms_norm_eps), self.lm_head).float()


# --- model specs (what to build, in any process) -----------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model in any process (picklable): a preset name or a checkpoint path."""

    model: str = "tiny"
    device: str = "cpu"
    dtype: str | None = None
    seed: int = 0

    def is_preset(self) -> bool:
        return self.model in PRESETS

    def resolve_config(self) -> ModelConfig:
        """The model's config (reads only config.json for a checkpoint)."""
        if self.is_preset():
            cfg = PRESETS[self.model]
            return replace(cfg, dtype=self.dtype) if self.dtype else cfg
        ckpt = Path(self.model)
        cfg_path = ckpt / "config.json"
        if not ckpt.is_dir():
            raise CheckpointError(
                f"--model {self.model!r}: not a preset ({', '.join(PRESETS)}) nor a checkpoint directory"
            )
        if not cfg_path.is_file():
            raise CheckpointError(f"{ckpt}: no config.json (expected a Hugging Face Llama checkpoint)")
        try:
            hf_cfg = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{cfg_path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
        return config_from_hf(hf_cfg, name=ckpt.name, dtype=self.dtype)

    def build(self, tp_rank: int = 0, tp_size: int = 1, all_reduce: AllReduce | None = None,
              pp_rank: int = 0, pp_size: int = 1) -> LlamaModel:
        """Create the weights (seeded random or loaded) and return this rank's shard (of its stage)."""
        if self.is_preset():
            cfg = self.resolve_config()
            sd = random_state_dict(cfg, self.seed)
        else:
            cfg, sd = load_checkpoint(self.model, dtype=self.dtype)
        return LlamaModel.from_state_dict(cfg, sd, self.device, tp_rank, tp_size, all_reduce, pp_rank, pp_size)
