"""The model: paged attention equals a dense reference; HF checkpoints load and give the right logits."""

from __future__ import annotations

import json
import math
import random
import shutil
from collections import deque

import pytest
import torch

from diag.bundled_engine.kv_cache import BlockManager, PagedKVCache
from diag.bundled_engine.model import LlamaModel, ModelSpec, SeqInput
from diag.bundled_engine.model_config import PRESETS, CheckpointError, ModelConfig, random_state_dict
from diag.bundled_engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer

SMALL_CFG = ModelConfig(
    name="t", vocab_size=2048, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=16, intermediate_size=96, max_position=512,
)


def _scrambled(num_blocks: int, block_size: int, seed: int = 0) -> BlockManager:
    bm = BlockManager(num_blocks, block_size)
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    bm._free = deque(free)  # non-contiguous block tables
    return bm


def _cache(model: LlamaModel, bm: BlockManager) -> PagedKVCache:
    c = model.cfg
    return PagedKVCache(c.num_layers, bm.num_blocks, bm.block_size, c.num_kv_heads, c.head_dim)


def test_paged_attention_matches_dense_reference():
    torch.manual_seed(0)
    model = LlamaModel.from_state_dict(SMALL_CFG, random_state_dict(SMALL_CFG, seed=3))
    bm = _scrambled(64, 4)
    cache = _cache(model, bm)
    rng = random.Random(1)
    a = [rng.randrange(2048) for _ in range(41)]
    b = [rng.randrange(2048) for _ in range(23)]
    ref_a, ref_b = model.forward_dense(a), model.forward_dense(b)

    # step 1: a's first chunk (17 tokens) and all of b's prompt but its last 3 tokens, batched
    out = model.forward(
        [SeqInput(a[:17], 0, list(bm.allocate("a", 17))), SeqInput(b[:20], 0, list(bm.allocate("b", 20)))], cache
    )
    assert torch.allclose(out[0], ref_a[16], atol=1e-4) and torch.allclose(out[1], ref_b[19], atol=1e-4)
    # step 2: a's second chunk (reads its cached prefix through the block table) + b one token
    out = model.forward(
        [SeqInput(a[17:30], 17, list(bm.allocate("a", 30))), SeqInput(b[20:21], 20, list(bm.allocate("b", 21)))], cache
    )
    assert torch.allclose(out[0], ref_a[29], atol=1e-4) and torch.allclose(out[1], ref_b[20], atol=1e-4)
    # decode steps: both single-token, one padded batch with different context lengths
    pa, pb = 30, 21
    while pa < len(a):
        seqs = [SeqInput([a[pa]], pa, list(bm.allocate("a", pa + 1)))]
        if pb < len(b):
            seqs.append(SeqInput([b[pb]], pb, list(bm.allocate("b", pb + 1))))
        out = model.forward(seqs, cache)
        assert torch.allclose(out[0], ref_a[pa], atol=1e-4)
        if pb < len(b):
            assert torch.allclose(out[1], ref_b[pb], atol=1e-4)
        pa, pb = pa + 1, pb + 1


def test_want_logits_selects_rows():
    model = LlamaModel.from_state_dict(SMALL_CFG, random_state_dict(SMALL_CFG))
    bm = _scrambled(16, 8)
    cache = _cache(model, bm)
    out = model.forward(
        [SeqInput([1, 2, 3], 0, list(bm.allocate("x", 3)), want_logits=False), SeqInput([4, 5], 0, list(bm.allocate("y", 2)))],
        cache,
    )
    assert out.shape == (1, 2048)
    assert torch.allclose(out[0], model.forward_dense([4, 5])[1], atol=1e-4)


def test_presets_match_bundled_tokenizer_vocab():
    tok = Tokenizer.bundled()
    for cfg in PRESETS.values():
        assert cfg.vocab_size == tok.vocab_size
        assert cfg.eos_token_ids == (0,)


def test_kv_bytes_per_token_formula():
    cfg = PRESETS["tiny"]
    assert cfg.kv_bytes_per_token() == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    bf16 = ModelSpec("tiny", dtype="bfloat16").resolve_config()
    assert bf16.kv_bytes_per_token() == cfg.kv_bytes_per_token() // 2


def test_seeded_presets_are_deterministic():
    a = ModelSpec("tiny", seed=5).build().forward_dense([1, 2, 3])
    b = ModelSpec("tiny", seed=5).build().forward_dense([1, 2, 3])
    c = ModelSpec("tiny", seed=6).build().forward_dense([1, 2, 3])
    assert torch.equal(a, b) and not torch.equal(a, c)


# --- Hugging Face checkpoints ------------------------------------------------------------------


def _naive_llama_logits(sd: dict[str, torch.Tensor], hf: dict, ids: list[int]) -> torch.Tensor:
    """An independent, loop-based Llama forward straight from the HF tensors (float64)."""
    h, nh, nkv = hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
    d = h // nh
    eps, theta = hf["rms_norm_eps"], hf["rope_theta"]
    W = {k: v.double() for k, v in sd.items()}

    def norm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def rope(x, pos):  # x [heads, d]; HF "rotate_half" convention
        out = torch.empty_like(x)
        for i in range(d // 2):
            ang = pos / theta ** (2 * i / d)
            c, s = math.cos(ang), math.sin(ang)
            x1, x2 = x[:, i], x[:, i + d // 2]
            out[:, i] = x1 * c - x2 * s
            out[:, i + d // 2] = x2 * c + x1 * s
        return out

    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    T = len(ids)
    for L in range(hf["num_hidden_layers"]):
        p = f"model.layers.{L}."
        hn = norm(x, W[p + "input_layernorm.weight"])
        q = (hn @ W[p + "self_attn.q_proj.weight"].T).view(T, nh, d)
        k = (hn @ W[p + "self_attn.k_proj.weight"].T).view(T, nkv, d)
        v = (hn @ W[p + "self_attn.v_proj.weight"].T).view(T, nkv, d)
        q = torch.stack([rope(q[t], t) for t in range(T)])
        k = torch.stack([rope(k[t], t) for t in range(T)])
        att = torch.zeros(T, nh, d, dtype=torch.float64)
        for t in range(T):
            for hh in range(nh):
                kv = hh // (nh // nkv)
                scores = torch.stack([q[t, hh] @ k[j, kv] for j in range(t + 1)]) / math.sqrt(d)
                att[t, hh] = scores.softmax(0) @ v[: t + 1, kv]
        x = x + att.view(T, h) @ W[p + "self_attn.o_proj.weight"].T
        hn = norm(x, W[p + "post_attention_layernorm.weight"])
        g = hn @ W[p + "mlp.gate_proj.weight"].T
        u = hn @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = norm(x, W["model.norm.weight"])
    return x @ W["lm_head.weight"].T


def write_hf_checkpoint(path, seed: int = 11) -> tuple[dict, dict[str, torch.Tensor]]:
    """A small Llama checkpoint in HF layout: config.json, model.safetensors, tokenizer.json."""
    from safetensors.torch import save_file

    hf = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 2048, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 112,
        "rms_norm_eps": 1e-5, "rope_theta": 500.0, "max_position_embeddings": 256, "tie_word_embeddings": False,
        "eos_token_id": 0, "bos_token_id": 1, "torch_dtype": "float32",
    }
    g = torch.Generator().manual_seed(seed)
    sd = {k: (torch.randn(v.shape, generator=g) * 0.1 + (1.0 if "norm" in k else 0.0)).contiguous()
          for k, v in random_state_dict(ModelSpec("tiny").resolve_config().__class__(
              vocab_size=2048, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
              intermediate_size=112), seed=0).items()}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf))
    save_file(sd, str(path / "model.safetensors"))
    shutil.copy(BUNDLED_TOKENIZER_PATH, path / "tokenizer.json")
    return hf, sd


def test_hf_checkpoint_loads_and_gives_the_written_weights_logits(tmp_path):
    ckpt = tmp_path / "llama-mini"
    hf, sd = write_hf_checkpoint(ckpt)
    model = ModelSpec(str(ckpt)).build()
    assert model.cfg.num_kv_heads == 2 and model.cfg.rope_theta == 500.0 and model.cfg.name == "llama-mini"
    ids = [5, 99, 1500, 7, 42, 300]
    ref = _naive_llama_logits(sd, hf, ids)
    got = model.forward_dense(ids)
    assert torch.allclose(got.double(), ref, atol=1e-3), (got.double() - ref).abs().max()
    # and the paged path over the same checkpoint
    bm = _scrambled(8, 4)
    out = model.forward([SeqInput(ids, 0, list(bm.allocate("s", len(ids))))], _cache(model, bm))
    assert torch.allclose(out[0].double(), ref[-1], atol=1e-3)


def test_checkpoint_errors_are_one_line(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        ModelSpec(str(tmp_path)).resolve_config()
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON at line 1"):
        ModelSpec(str(tmp_path)).resolve_config()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(CheckpointError, match="missing key"):
        ModelSpec(str(tmp_path)).resolve_config()
    with pytest.raises(CheckpointError, match="not a preset"):
        ModelSpec("no-such-model").resolve_config()


def test_checkpoint_missing_tensor_is_reported(tmp_path):
    from safetensors.torch import save_file

    ckpt = tmp_path / "c"
    _, sd = write_hf_checkpoint(ckpt)
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
        ModelSpec(str(ckpt)).build()


def test_tp_shards_with_a_summing_all_reduce_equal_the_full_model():
    """Two shards run in two threads whose all-reduce sums their partials: same logits as tp=1."""
    import threading

    cfg = SMALL_CFG
    sd = random_state_dict(cfg, seed=2)
    ids = [3, 4, 5, 6, 7]
    ref = LlamaModel.from_state_dict(cfg, sd).forward_dense(ids)
    barrier = threading.Barrier(2)
    parts: list = [None, None]
    results: list = [None, None]

    def make_reduce(rank):
        def all_reduce(t):
            parts[rank] = t.clone()
            barrier.wait()
            total = parts[0] + parts[1]
            barrier.wait()
            t.copy_(total)
            return t
        return all_reduce

    def run(rank):
        shard = LlamaModel.from_state_dict(cfg, sd, tp_rank=rank, tp_size=2, all_reduce=make_reduce(rank))
        assert shard.local_heads == 2 and shard.local_kv_heads == 1
        assert shard.layers[0].w_down.shape[1] == cfg.intermediate_size // 2
        bm = BlockManager(8, 4)
        cache = PagedKVCache(cfg.num_layers, 8, 4, shard.local_kv_heads, cfg.head_dim)
        results[rank] = shard.forward([SeqInput(ids, 0, list(bm.allocate("s", len(ids))))], cache)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert torch.allclose(results[0][0], ref[-1], atol=1e-4)
    assert torch.allclose(results[1][0], ref[-1], atol=1e-4)
    with pytest.raises(ValueError, match="does not divide"):
        LlamaModel.from_state_dict(cfg, sd, tp_rank=0, tp_size=3)
