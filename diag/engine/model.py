"""A Llama-style decoder-only transformer in torch: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Weights use Hugging Face Llama names (``model.layers.0.self_attn.q_proj.weight`` ...), so the
same code path serves seeded random presets and local HF checkpoints. Attention reads and writes
K/V through a :class:`~diag.engine.kv_cache.PagedKVCache` via per-sequence block tables; a
tensor-parallel rank holds only its shard of heads and MLP columns and calls ``all_reduce`` after
the attention output and MLP down projections. A pipeline-parallel stage holds a contiguous run of
layers (:func:`stage_layers`); the first stage embeds tokens, the last one applies the final norm
and LM head, and :meth:`LlamaModel.forward_stage` passes hidden states ``[tokens, hidden]`` between.
With LoRA slots attached (:attr:`LlamaModel.lora`, :mod:`diag.engine.lora_slots`) a sequence whose
:attr:`SeqInput.lora_slot` is set gets its adapter's delta on every fused projection (q/k/v, o,
gate/up, down), added to its rows of the projection's output.

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

from diag.engine.kv_cache import PagedKVCache

if TYPE_CHECKING:  # pragma: no cover
    from diag.engine.lora_slots import LoraGroups, LoraSlots

AllReduce = Callable[[torch.Tensor], torch.Tensor]

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_dtype(name: str) -> torch.dtype:
    """``"float32"|"bfloat16"|"float16"`` (or fp32/bf16/fp16) -> torch dtype; ValueError otherwise."""
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of float32, bfloat16, float16") from None


class CheckpointError(ValueError):
    """A checkpoint directory is missing files or holds an unsupported/incomplete model."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one Llama-family decoder. Sizes are counts; ``max_position`` in tokens."""

    name: str = "tiny"
    vocab_size: int = 2048
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 704
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position: int = 4096
    tie_embeddings: bool = False
    dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = (0,)

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    def kv_bytes_per_token(self) -> int:
        """K and V bytes one token takes in the cache: 2 x layers x kv_heads x head_dim x dtype size."""
        itemsize = torch.empty((), dtype=self.torch_dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    def num_params(self, include_embeddings: bool = True) -> int:
        """Parameter count of the full (unsharded) model."""
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_heads * d) * 2 + h * (self.num_kv_heads * d) * 2
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        n = self.num_layers * per_layer + h
        if include_embeddings:
            n += self.vocab_size * h * (1 if self.tie_embeddings else 2)
        else:
            n += self.vocab_size * h  # the LM head is a real matmul per logit row
        return n

    def validate_tp(self, tp_size: int) -> None:
        """Raise ValueError if this model cannot be split over ``tp_size`` ranks."""
        for what, n in (
            ("attention heads", self.num_heads),
            ("KV heads", self.num_kv_heads),
            ("MLP intermediate size", self.intermediate_size),
        ):
            if n % tp_size:
                raise ValueError(f"--tp {tp_size} does not divide the model's {what} ({n})")

    def validate_pp(self, pp_size: int) -> None:
        """Raise ValueError if this model cannot be split into ``pp_size`` pipeline stages."""
        if pp_size < 1:
            raise ValueError(f"--pp must be >= 1, got {pp_size}")
        if pp_size > self.num_layers:
            raise ValueError(f"--pp {pp_size} is more stages than the model's {self.num_layers} layers")


def stage_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Layer indices of pipeline stage ``pp_rank``: contiguous, as even as possible (the first
    ``num_layers % pp_size`` stages hold one more)."""
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


#: Built-in presets with seeded random weights and the bundled tokenizer (vocab 2048).
PRESETS: dict[str, ModelConfig] = {
    # ~3.4 M params: a 512-token prefill takes tens of ms on 2 CPU cores.
    "tiny": ModelConfig(),
    # ~85 M params: a GPU-sized toy, or a slow CPU one.
    "small": ModelConfig(
        name="small",
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        num_kv_heads=4,
        head_dim=64,
        intermediate_size=2048,
    ),
}


# --- weights -----------------------------------------------------------------------------------


def random_state_dict(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random weights with HF Llama names (float32, CPU). Same seed -> same weights."""
    g = torch.Generator().manual_seed(seed)
    h, d = cfg.hidden_size, cfg.head_dim
    std = 0.02
    out_std = std / math.sqrt(2 * cfg.num_layers)

    def rnd(*shape: int, s: float = std) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * s

    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rnd(cfg.vocab_size, h, s=1.0)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = rnd(cfg.num_heads * d, h)
        sd[p + "self_attn.k_proj.weight"] = rnd(cfg.num_kv_heads * d, h)
        sd[p + "self_attn.v_proj.weight"] = rnd(cfg.num_kv_heads * d, h)
        sd[p + "self_attn.o_proj.weight"] = rnd(h, cfg.num_heads * d, s=out_std)
        sd[p + "mlp.gate_proj.weight"] = rnd(cfg.intermediate_size, h)
        sd[p + "mlp.up_proj.weight"] = rnd(cfg.intermediate_size, h)
        sd[p + "mlp.down_proj.weight"] = rnd(h, cfg.intermediate_size, s=out_std)
        sd[p + "input_layernorm.weight"] = torch.ones(h)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h)
    sd["model.norm.weight"] = torch.ones(h)
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = rnd(cfg.vocab_size, h, s=1.0 / math.sqrt(h))
    return sd


def config_from_hf(hf: Mapping[str, object], name: str, dtype: str | None = None) -> ModelConfig:
    """Map a HF Llama ``config.json`` dict to :class:`ModelConfig`; CheckpointError on missing keys."""
    try:
        hidden = int(hf["hidden_size"])  # type: ignore[arg-type]
        heads = int(hf["num_attention_heads"])  # type: ignore[arg-type]
        eos = hf.get("eos_token_id", 0)
        eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (int(eos),)  # type: ignore[arg-type]
        torch_dtype = str(hf.get("torch_dtype") or hf.get("dtype") or "float32")
        return ModelConfig(
            name=name,
            vocab_size=int(hf["vocab_size"]),  # type: ignore[arg-type]
            hidden_size=hidden,
            num_layers=int(hf["num_hidden_layers"]),  # type: ignore[arg-type]
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),  # type: ignore[arg-type]
            head_dim=int(hf.get("head_dim") or hidden // heads),  # type: ignore[arg-type]
            intermediate_size=int(hf["intermediate_size"]),  # type: ignore[arg-type]
            rope_theta=float(hf.get("rope_theta", 10000.0)),  # type: ignore[arg-type]
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),  # type: ignore[arg-type]
            max_position=int(hf.get("max_position_embeddings", 4096)),  # type: ignore[arg-type]
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dtype=dtype or (torch_dtype if torch_dtype in _DTYPES else "float32"),
            eos_token_ids=eos_ids,
        )
    except KeyError as exc:
        raise CheckpointError(f"config.json: missing key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"config.json: bad value ({exc})") from None


def load_checkpoint(ckpt_dir: str | Path, dtype: str | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a local HF Llama checkpoint: ``config.json`` + ``*.safetensors`` -> (config, state dict)."""
    from safetensors.torch import load_file

    ckpt_dir = Path(ckpt_dir)
    cfg_path = ckpt_dir / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{ckpt_dir}: no config.json (expected a Hugging Face Llama checkpoint)")
    try:
        hf_cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    arch = hf_cfg.get("model_type", "llama")
    if arch not in ("llama", "mistral", "qwen2"):
        raise CheckpointError(f"{cfg_path}: model_type {arch!r} is not a Llama-family model")
    cfg = config_from_hf(hf_cfg, name=ckpt_dir.name, dtype=dtype)
    files = sorted(ckpt_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{ckpt_dir}: no *.safetensors weight files")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{f}: unreadable safetensors file ({exc})") from None
    return cfg, sd


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
