"""One request's KV over point-to-point send/recv (gloo): what the decode side writes into its cache
is, bit for bit, what the prefill side computed; the metadata and the sampler's state come along."""

from __future__ import annotations

import multiprocessing as mp

import torch

from diag.bundled_engine.kv_cache import PagedKVCache, position_slots
from diag.bundled_engine.model import ModelSpec, SeqInput
from diag.bundled_engine.pd_wire import KIND_KV, KIND_STOP, kv_meta, restore_generator, send_kv
from diag.bundled_engine.sampler import SamplerState, SamplingParams
from diag.bundled_engine.tp import CacheSpec, make_cache, make_process_group, make_store
from support.engine_testutil import kv_receiver

CPU = torch.device("cpu")


def test_export_then_import_at_other_blocks_is_bitwise():
    a = PagedKVCache(3, 8, 4, 2, 8)
    a.k.normal_()
    a.v.normal_()
    kv = a.export_slots(position_slots([5, 2, 7], 10, 4))
    assert kv.shape == (2, 3, 10, 2, 8) and kv.is_contiguous()
    b = PagedKVCache(3, 8, 4, 2, 8)
    b.import_slots(position_slots([0, 6, 1], 10, 4), kv)
    assert torch.equal(b.export_slots(position_slots([0, 6, 1], 10, 4)), kv)
    assert torch.equal(kv[0, 1, 9], a.k[1, 7 * 4 + 1])  # position 9 = block 2 (id 7), offset 1


def test_a_prefilled_requests_kv_crosses_gloo_bit_for_bit():
    spec = ModelSpec("tiny")
    model = spec.build()
    prompt = list(range(40, 90))
    src = make_cache(model, CacheSpec(16, 16))
    table = [9, 3, 12, 0]
    model.forward([SeqInput(prompt, 0, table)], src)
    sent = src.export_slots(position_slots(table, len(prompt), 16))
    sampler = SamplerState(SamplingParams(temperature=0.8, seed=7), 0)
    torch.rand(3, generator=sampler.generator())  # the first draw happened on the prefill side
    meta = kv_meta("r1", prompt, sampler.params, 0, sampler.generator_if_started(), 123, sent)

    store = make_store(2)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=kv_receiver, args=(store.port, child), daemon=True)  # the decode side
    proc.start()
    try:
        pg = make_process_group(store, 0, 2, "cpu")
        send_kv(pg, 1, meta, sent, CPU)
        send_kv(pg, 1, None, None, CPU, KIND_STOP)
        assert parent.poll(60)
        kind, meta2, kv = parent.recv()
        assert parent.poll(30) and parent.recv() == (KIND_STOP, None, None)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    assert kind == KIND_KV and meta2 == meta
    dst = make_cache(model, CacheSpec(8, 16))
    dst_table = [5, 1, 7, 2]
    dst.import_slots(position_slots(dst_table, len(prompt), 16), kv)
    assert torch.equal(dst.export_slots(position_slots(dst_table, len(prompt), 16)), sent)
    g = restore_generator(meta2.generator_state)
    assert g is not None and torch.equal(g.get_state(), sampler.generator().get_state())
    # the next position decodes the same on both caches
    nxt = [SeqInput([123], len(prompt), dst_table)]
    assert torch.equal(model.forward(nxt, dst), model.forward([SeqInput([123], len(prompt), table)], src))
