"""LoRA adapters on the model: peft-format files, the slots' batched delta against the merged-weights
reference, and adapters ``peft`` itself wrote."""

from __future__ import annotations

import json
import random

import pytest
import torch

from diag.bundled_engine.kv_cache import BlockManager, PagedKVCache
from diag.bundled_engine.lora import (ADAPTER_CONFIG, LoraError, check_adapter, merged_state_dict, parse_lora_module, read_adapter,
                              write_adapter)
from diag.bundled_engine.lora_slots import LoraSlots
from diag.bundled_engine.model import LlamaModel, SeqInput
from diag.bundled_engine.model_config import ModelConfig, random_state_dict

CFG = ModelConfig(name="t", vocab_size=2048, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=96, max_position=512)
RANK = 8


def _model_with_slots(sd, slots: int = 2) -> LlamaModel:
    model = LlamaModel.from_state_dict(CFG, sd)
    model.lora = LoraSlots(CFG, slots, RANK, model.device, model.cfg.torch_dtype)
    return model


def _cache(bm: BlockManager) -> PagedKVCache:
    return PagedKVCache(CFG.num_layers, bm.num_blocks, bm.block_size, CFG.num_kv_heads, CFG.head_dim)


def test_module_items_and_adapter_checks_are_one_line(tmp_path):
    assert parse_lora_module("a") .path is None and parse_lora_module("b=/x/y").path == "/x/y"
    for bad in ("", "a b", "a,b", "a="):
        with pytest.raises(LoraError, match="--lora-modules"):
            parse_lora_module(bad)
    path = write_adapter(tmp_path / "ad", CFG, rank=4, seed=1, targets=("q_proj", "down_proj"))
    info = check_adapter(path, CFG, max_rank=8)
    assert (info.rank, info.scale, info.targets) == (4, 2.0, ("q_proj", "down_proj"))
    with pytest.raises(LoraError, match="rank 4 is greater than --max-lora-rank 2"):
        check_adapter(path, CFG, max_rank=2)
    other = ModelConfig(name="o", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=96)
    with pytest.raises(LoraError, match="has shape"):
        check_adapter(path, other, max_rank=8)
    with pytest.raises(LoraError, match="not a LoRA adapter directory"):
        check_adapter(tmp_path, CFG, max_rank=8)
    conf = json.loads((path / ADAPTER_CONFIG).read_text())
    (path / ADAPTER_CONFIG).write_text(json.dumps({**conf, "use_dora": True}))
    with pytest.raises(LoraError, match="DoRA"):
        check_adapter(path, CFG, max_rank=8)


def test_packed_adapter_pads_the_rank_and_folds_the_scale(tmp_path):
    info = check_adapter(write_adapter(tmp_path / "ad", CFG, rank=4, seed=2), CFG, max_rank=RANK)
    packed = read_adapter(info, CFG, RANK)
    a, b = packed.layers[0]["qkv"]
    assert a.shape == (3 * RANK, 64) and b.shape == (64 + 32 + 32, 3 * RANK)
    assert a[4:8].abs().sum() == 0 and b[:, 4:8].abs().sum() == 0  # q's rank 4 padded to 8
    assert b[64:, :RANK].abs().sum() == 0  # block-diagonal: q's columns only feed q's rows


def test_lora_forward_equals_the_merged_weights_and_differs_from_the_base(tmp_path):
    """A batch of a base sequence and two adapters' sequences (prefill chunks, then decodes) gives, for
    each sequence, the logits of the model with its adapter merged into the weights."""
    base = random_state_dict(CFG, seed=5)
    paths = [write_adapter(tmp_path / n, CFG, rank=r, seed=s) for n, r, s in (("x", 8, 1), ("y", 4, 2))]
    model = _model_with_slots(base)
    for slot, p in enumerate(paths):
        model.lora.load(slot, read_adapter(check_adapter(p, CFG, RANK), CFG, RANK))
    refs = [LlamaModel.from_state_dict(CFG, merged_state_dict(base, p, CFG)) for p in paths]
    plain = LlamaModel.from_state_dict(CFG, base)
    rng = random.Random(3)
    toks = {k: [rng.randrange(2048) for _ in range(n)] for k, n in (("base", 19), ("x", 27), ("y", 15))}
    slot_of = {"base": None, "x": 0, "y": 1}
    want = {"base": plain.forward_dense(toks["base"]), "x": refs[0].forward_dense(toks["x"]),
            "y": refs[1].forward_dense(toks["y"])}
    assert (want["x"] - plain.forward_dense(toks["x"])).abs().max() > 0.1  # the adapter changes the logits
    bm = BlockManager(64, 4)
    cache = _cache(bm)
    pos = {"base": 11, "x": 13, "y": 15}
    out = model.forward([SeqInput(toks[k][:n], 0, list(bm.allocate(k, n)), lora_slot=slot_of[k]) for k, n in pos.items()],
                        cache)
    for i, k in enumerate(pos):
        assert torch.allclose(out[i], want[k][pos[k] - 1], atol=1e-4), k
    # the rest of x's prompt as a chunk beside single-token steps of the others
    seqs = []
    for k in pos:
        n = len(toks[k]) - pos[k] if k == "x" else (1 if pos[k] < len(toks[k]) else 0)
        if n:
            seqs.append((k, n))
    while seqs:
        out = model.forward([SeqInput(toks[k][pos[k]:pos[k] + n], pos[k], list(bm.allocate(k, pos[k] + n)),
                                      lora_slot=slot_of[k]) for k, n in seqs], cache)
        for i, (k, n) in enumerate(seqs):
            pos[k] += n
            assert torch.allclose(out[i], want[k][pos[k] - 1], atol=1e-4), (k, pos[k])
        seqs = [(k, 1) for k in pos if pos[k] < len(toks[k])]


def test_one_adapter_for_the_whole_batch_takes_every_row(tmp_path):
    base = random_state_dict(CFG, seed=6)
    path = write_adapter(tmp_path / "z", CFG, rank=8, seed=9)
    model = _model_with_slots(base, slots=1)
    model.lora.load(0, read_adapter(check_adapter(path, CFG, RANK), CFG, RANK))
    ref = LlamaModel.from_state_dict(CFG, merged_state_dict(base, path, CFG))
    a, b = [3, 9, 400, 17, 5], [8, 1, 2]
    bm = BlockManager(16, 4)
    out = model.forward([SeqInput(a, 0, list(bm.allocate("a", 5)), lora_slot=0),
                         SeqInput(b, 0, list(bm.allocate("b", 3)), lora_slot=0)], _cache(bm))
    assert torch.allclose(out[0], ref.forward_dense(a)[-1], atol=1e-4)
    assert torch.allclose(out[1], ref.forward_dense(b)[-1], atol=1e-4)


@pytest.mark.slow
def test_an_adapter_peft_wrote_gives_peft_s_logits(tmp_path):
    """peft's own adapter for a HF Llama with the same weights: same logits as peft's model."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    base = random_state_dict(CFG, seed=7)
    hf_cfg = LlamaConfig(vocab_size=CFG.vocab_size, hidden_size=CFG.hidden_size, num_hidden_layers=CFG.num_layers,
                         num_attention_heads=CFG.num_heads, num_key_value_heads=CFG.num_kv_heads,
                         head_dim=CFG.head_dim, intermediate_size=CFG.intermediate_size, rms_norm_eps=CFG.rms_norm_eps,
                         rope_theta=CFG.rope_theta, max_position_embeddings=CFG.max_position, tie_word_embeddings=False)
    hf = LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(base)
    torch.manual_seed(0)
    peft_model = get_peft_model(hf, LoraConfig(r=4, lora_alpha=12, init_lora_weights=False,
                                               target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    peft_model.save_pretrained(tmp_path / "peft")
    ids = [5, 99, 1500, 7, 42, 300, 11]
    fresh = LlamaForCausalLM(hf_cfg).eval()
    fresh.load_state_dict(base)
    with torch.no_grad():
        base_logits = fresh(torch.tensor([ids])).logits[0]
        want_logits = PeftModel.from_pretrained(fresh, tmp_path / "peft")(torch.tensor([ids])).logits[0]
    assert torch.allclose(LlamaModel.from_state_dict(CFG, base).forward_dense(ids), base_logits, atol=1e-3)
    info = check_adapter(tmp_path / "peft", CFG, RANK)
    assert info.rank == 4 and info.scale == 3.0 and "k_proj" not in info.targets
    model = _model_with_slots(base, slots=1)
    model.lora.load(0, read_adapter(info, CFG, RANK))
    bm = BlockManager(8, 4)
    out = model.forward([SeqInput(ids, 0, list(bm.allocate("s", len(ids))), lora_slot=0)], _cache(bm))
    assert torch.allclose(out[0], want_logits[-1], atol=1e-3), (out[0] - want_logits[-1]).abs().max()
