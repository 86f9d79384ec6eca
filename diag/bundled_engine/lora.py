"""LoRA adapter files for the bundled engine: ``--lora-modules NAME[=PATH]``, the peft format, a maker
of random adapters, and an adapter packed the way a slot holds it.

An adapter is a directory in the format ``peft``'s ``save_pretrained`` writes for a Hugging Face
Llama: ``adapter_config.json`` (``peft_type`` ``LORA``, ``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``) and ``adapter_model.safetensors`` with ``base_model.model.model.layers.<i>.
{self_attn,mlp}.<proj>.lora_A.weight`` (``[r, in]``) and ``lora_B.weight`` (``[out, r]``) for the
projections it targets (:data:`TARGETS`). The delta on a projection's output is ``x @ A.T @ B.T *
scale``, ``scale = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA).

:func:`check_adapter` reads the config and the safetensors header only (no tensor data), so a bad
adapter is refused when the engine starts; :func:`read_adapter` reads the tensors (the disk part of
a load) into a :class:`PackedAdapter`: per layer and per projection group of the fused model
(``qkv``, ``o``, ``gate_up``, ``down``: :data:`GROUPS`) one stacked ``A`` ``[n * max_rank, in]``
and one block-diagonal ``B`` ``[out, n * max_rank]`` with the scale folded in (vLLM folds it into
``lora_b`` too), ranks below ``max_rank`` zero-padded, so a slot load is one copy per tensor.

:func:`write_adapter` makes an adapter with real random rank-r ``A``/``B`` tensors for a model
config (tests, and ``--lora-modules NAME`` without a path: seeded by :func:`name_seed`);
:func:`merged_state_dict` is the reference: the base weights with ``scale * B @ A`` added.

Threading: pure functions over files and tensors; callers own what they return.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diag.bundled_engine.model_config import ModelConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: projections an adapter may target (HF Llama names), by module
TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
#: the fused model's projections (``diag.bundled_engine.model._Layer``) and the targets each one stacks, in order
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qkv", ("q_proj", "k_proj", "v_proj")),
    ("o", ("o_proj",)),
    ("gate_up", ("gate_proj", "up_proj")),
    ("down", ("down_proj",)),
)
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class LoraError(ValueError):
    """A bad ``--lora-modules`` item or adapter directory (one line, naming it)."""


@dataclass(frozen=True)
class LoraModule:
    """``--lora-modules NAME[=PATH]``: the name requests use as their ``model`` and the adapter's
    directory (None: a random adapter made from the name when the engine starts)."""

    name: str
    path: str | None = None


def parse_lora_module(text: str) -> LoraModule:
    """``NAME`` or ``NAME=PATH``; LoraError on an empty name or path, or a name with spaces or commas."""
    name, sep, path = text.partition("=")
    name = name.strip()
    if not name or any(c.isspace() or c == "," for c in name):
        raise LoraError(f"--lora-modules {text!r}: expected NAME or NAME=PATH (a name without spaces or commas)")
    if sep and not path.strip():
        raise LoraError(f"--lora-modules {text!r}: empty PATH after '='")
    return LoraModule(name, path.strip() if sep else None)


def name_seed(name: str) -> int:
    """A seed from an adapter's name (the first 8 bytes of its SHA-256): same name, same random adapter."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little") & (2**63 - 1)


def target_shape(cfg: ModelConfig, target: str) -> tuple[int, int]:
    """(out, in) of a target projection's weight in the full (unsharded) model."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    return {
        "q_proj": (cfg.num_heads * d, h), "k_proj": (cfg.num_kv_heads * d, h), "v_proj": (cfg.num_kv_heads * d, h),
        "o_proj": (h, cfg.num_heads * d), "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter),
    }[target]


def weight_key(layer: int, target: str, which: str) -> str:
    """The safetensors key peft writes for one LoRA matrix (``which``: ``"A"`` or ``"B"``)."""
    return f"base_model.model.model.layers.{layer}.{_MODULE[target]}.{target}.lora_{which}.weight"


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter directory holds, read without its tensors: rank, scale (alpha / r, or
    alpha / sqrt(r) with rsLoRA), the targets present and the safetensors file's size in bytes."""

    path: Path
    rank: int
    scale: float
    targets: tuple[str, ...]
    nbytes: int


def check_adapter(path: str | Path, cfg: ModelConfig, max_rank: int) -> AdapterInfo:
    """Read ``path``'s config and safetensors header; LoraError (one line) when it is not a LoRA
    adapter this model can serve: rank above ``max_rank``, DoRA, per-module ranks, a module other than
    :data:`TARGETS`, a layer the model lacks, or a tensor of the wrong shape."""
    p = Path(path)
    cfg_path, w_path = p / ADAPTER_CONFIG, p / ADAPTER_WEIGHTS
    if not cfg_path.is_file() or not w_path.is_file():
        raise LoraError(f"{p}: not a LoRA adapter directory (expected {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    try:
        conf = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoraError(f"{cfg_path}: unreadable ({' '.join(str(exc).split())})") from None
    if not isinstance(conf, dict) or conf.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{cfg_path}: peft_type {conf.get('peft_type') if isinstance(conf, dict) else None!r} "
                        "is not LORA")
    try:
        rank, alpha = int(conf["r"]), float(conf.get("lora_alpha", conf["r"]))
    except (KeyError, TypeError, ValueError):
        raise LoraError(f"{cfg_path}: 'r' and 'lora_alpha' must be numbers") from None
    if rank < 1:
        raise LoraError(f"{cfg_path}: rank r={rank} must be >= 1")
    if rank > max_rank:
        raise LoraError(f"{p}: LoRA rank {rank} is greater than --max-lora-rank {max_rank}")
    if conf.get("use_dora"):
        raise LoraError(f"{cfg_path}: DoRA adapters (use_dora) are not supported")
    if conf.get("rank_pattern") or conf.get("alpha_pattern"):
        raise LoraError(f"{cfg_path}: per-module ranks or alphas (rank_pattern, alpha_pattern) are not supported")
    if conf.get("modules_to_save"):
        raise LoraError(f"{cfg_path}: modules_to_save (fully trained modules) are not supported")
    scale = alpha / math.sqrt(rank) if conf.get("use_rslora") else alpha / rank
    targets: set[str] = set()
    try:
        with safe_open(str(w_path), "pt") as f:
            for key in f.keys():
                m = _KEY.search(key)
                if m is None or m.group(3) not in TARGETS or _MODULE[m.group(3)] != m.group(2):
                    raise LoraError(f"{w_path}: tensor {key!r} is not a LoRA A/B of {', '.join(TARGETS)}")
                layer, target, which = int(m.group(1)), m.group(3), m.group(4)
                if layer >= cfg.num_layers:
                    raise LoraError(f"{w_path}: tensor {key!r} is for layer {layer}; the model has {cfg.num_layers}")
                out, inp = target_shape(cfg, target)
                want = [rank, inp] if which == "A" else [out, rank]
                shape = list(f.get_slice(key).get_shape())
                if shape != want:
                    raise LoraError(f"{w_path}: tensor {key!r} has shape {shape}, expected {want}")
                targets.add(target)
    except LoraError:
        raise
    except Exception as exc:  # safetensors raises its own error types
        raise LoraError(f"{w_path}: unreadable safetensors file ({' '.join(str(exc).split())})") from None
    if not targets:
        raise LoraError(f"{w_path}: no LoRA tensors")
    return AdapterInfo(p, rank, scale, tuple(t for t in TARGETS if t in targets), w_path.stat().st_size)


@dataclass
class PackedAdapter:
    """An adapter as a slot holds it (host memory): ``layers[i][group] = (A, B)``, ``A`` ``[n * R, in]``
    stacked over the group's targets, ``B`` ``[out, n * R]`` block-diagonal with the scale folded in;
    ``R`` = ``max_rank``, zero rows and columns beyond the adapter's own rank or a target it lacks."""

    layers: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]
    rank: int

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size()
                   for layer in self.layers for a, b in layer.values())


def group_shapes(cfg: ModelConfig, max_rank: int) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """group -> (A shape, B shape) of a packed adapter's layer (full model, no tensor parallel)."""
    out: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}
    for group, targets in GROUPS:
        outs = [target_shape(cfg, t)[0] for t in targets]
        inp = target_shape(cfg, targets[0])[1]
        n = len(targets) * max_rank
        out[group] = ((n, inp), (sum(outs), n))
    return out


def pack(tensors: Mapping[str, torch.Tensor], info: AdapterInfo, cfg: ModelConfig, max_rank: int) -> PackedAdapter:
    """Pack peft-named tensors (float32 after this) into the slot layout (see :class:`PackedAdapter`)."""
    by_key: dict[tuple[int, str, str], torch.Tensor] = {}
    for key, t in tensors.items():
        m = _KEY.search(key)
        if m is not None:
            by_key[(int(m.group(1)), m.group(3), m.group(4))] = t
    shapes = group_shapes(cfg, max_rank)
    r = info.rank
    layers: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    for i in range(cfg.num_layers):
        layer: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for group, targets in GROUPS:
            (a_shape, b_shape) = shapes[group]
            a = torch.zeros(a_shape, dtype=torch.float32)
            b = torch.zeros(b_shape, dtype=torch.float32)
            row = 0
            for k, t in enumerate(targets):
                out = target_shape(cfg, t)[0]
                ta, tb = by_key.get((i, t, "A")), by_key.get((i, t, "B"))
                if ta is not None and tb is not None:
                    a[k * max_rank: k * max_rank + r] = ta.float()
                    b[row: row + out, k * max_rank: k * max_rank + r] = tb.float() * info.scale
                row += out
            layer[group] = (a, b)
        layers.append(layer)
    return PackedAdapter(layers, r)


def read_adapter(info: AdapterInfo, cfg: ModelConfig, max_rank: int) -> PackedAdapter:
    """Read the adapter's tensors from disk and pack them (the disk part of a slot load)."""
    try:
        tensors = load_file(str(info.path / ADAPTER_WEIGHTS))
    except Exception as exc:  # a file changed or vanished since the engine started
        raise LoraError(f"{info.path / ADAPTER_WEIGHTS}: unreadable ({' '.join(str(exc).split())})") from None
    return pack(tensors, info, cfg, max_rank)


def write_adapter(path: str | Path, cfg: ModelConfig, rank: int = 8, seed: int = 0, alpha: float | None = None,
                  targets: tuple[str, ...] = TARGETS, b_std: float = 0.04) -> Path:
    """Write a peft-format adapter for ``cfg`` with random rank-``rank`` ``A`` (std 1/sqrt(in)) and
    ``B`` (std ``b_std``) on ``targets`` of every layer, seeded; ``lora_alpha`` defaults to ``2 * rank``."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for i in range(cfg.num_layers):
        for t in targets:
            out, inp = target_shape(cfg, t)
            tensors[weight_key(i, t, "A")] = torch.randn(rank, inp, generator=g) / math.sqrt(inp)
            tensors[weight_key(i, t, "B")] = torch.randn(out, rank, generator=g) * b_std
    save_file(tensors, str(p / ADAPTER_WEIGHTS))
    conf = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": cfg.name, "r": rank,
            "lora_alpha": float(2 * rank if alpha is None else alpha), "lora_dropout": 0.0,
            "target_modules": list(targets), "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
            "use_dora": False, "modules_to_save": None, "init_lora_weights": False, "rank_pattern": {},
            "alpha_pattern": {}, "inference_mode": True}
    (p / ADAPTER_CONFIG).write_text(json.dumps(conf, indent=2))
    return p


def merged_state_dict(base: Mapping[str, torch.Tensor], path: str | Path, cfg: ModelConfig,
                      max_rank: int = 1 << 16) -> dict[str, torch.Tensor]:
    """The base weights with the adapter merged in (``W + scale * B @ A`` per target): the reference a
    LoRA forward must equal."""
    info = check_adapter(path, cfg, max_rank)
    tensors = load_file(str(Path(path) / ADAPTER_WEIGHTS))
    sd = dict(base)
    for i in range(cfg.num_layers):
        for t in info.targets:
            a, b = tensors.get(weight_key(i, t, "A")), tensors.get(weight_key(i, t, "B"))
            if a is None or b is None:
                continue
            name = f"model.layers.{i}.{_MODULE[t]}.{t}.weight"
            sd[name] = base[name].float() + info.scale * (b.float() @ a.float())
    return sd
