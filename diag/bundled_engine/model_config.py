"""The bundled engine's model description: :class:`ModelConfig`, the presets, dtypes, and the weights
(seeded random, or a local Hugging Face Llama checkpoint).

Pure data and loading; sizes are counts, ``max_position`` tokens, bytes where a name says so. Any
thread; a model built from these lives in :mod:`diag.bundled_engine.model`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

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
