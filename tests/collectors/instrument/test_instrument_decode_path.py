"""Plain-mode ``transformers serve`` generation under the patches: the decode forwards run no hook of ours.

A real random-weight Llama runs ``generate()`` in-process with the real ``DirectStreamer`` and the
real ``GenerationMixin._prefill``, both patched as ``ttft instrument`` patches them. The stages
are still all there (queue, prefill, sample, detokenize), and every forward after the prefill
runs with no torch hook on the model: the instrumentation's cost does not grow with the number
of decode steps or the model's size. Slow: importing torch and transformers takes seconds.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from collectors.instrument import transformers_streamers
from collectors.instrument import tx_request as rq
from collectors.instrument.runtime import Instrumentation
from collectors.instrument.transformers_serve import _Patches
from collectors.spans import setup_tracing
from diag.ground import stages

pytestmark = pytest.mark.slow

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "diag" / "bundled_engine" / "data" / "tokenizer.json"
_PATCHED = (("DirectStreamer", "__init__"), ("DirectStreamer", "put"), ("DirectStreamer", "end"),
            ("CBStreamer", "__init__"), ("CBStreamer", "put"),
            ("GenerateManager", "generate_streaming"), ("CBGenerateManager", "generate_streaming"))


def _unwrap(owner, name):
    fn = owner.__dict__.get(name)
    if getattr(fn, "__ttft_wrapped__", False):
        setattr(owner, name, fn.__wrapped__)


def test_plain_generate_times_every_stage_and_runs_no_hook_on_decode_forwards():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.cli.serving import utils as serving_utils
    from transformers.generation import utils as gen_utils

    inst = Instrumentation(environ={})
    p = _Patches(inst, "5.24.0")
    sink = setup_tracing(memory=True)
    loop = asyncio.new_event_loop()
    transformers_streamers.patch_generation(p, gen_utils)
    transformers_streamers.patch_utils(p, serving_utils)
    try:
        tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_JSON))
        cfg = LlamaConfig(vocab_size=tok.backend_tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                          eos_token_id=1, bos_token_id=2)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
        forwards: list[tuple[int, int]] = []  # (start ns, torch hooks on the model during that forward)
        inner = model.forward

        def observed_forward(*args, **kwargs):
            forwards.append((time.time_ns(), len(model._forward_pre_hooks) + len(model._forward_hooks)))
            return inner(*args, **kwargs)

        model.forward = observed_forward
        req = rq.ServeRequest(None, "/v1/chat/completions")
        ctx = rq.CURRENT.set(req)
        try:
            req.start(sink, "req-1", {"stream": True, "max_tokens": 6})
            req.tokenize_end_ns = time.time_ns()
            streamer = serving_utils.DirectStreamer(tok.backend_tokenizer, loop, asyncio.Queue())
        finally:
            rq.CURRENT.reset(ctx)
        ids = torch.randint(3, cfg.vocab_size, (1, 24))
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                       do_sample=False, streamer=streamer)
        req.finish()
        sink.force_flush()
    finally:
        for cls, name in _PATCHED:
            _unwrap(getattr(serving_utils, cls), name)
        _unwrap(gen_utils.GenerationMixin, "_prefill")
        loop.close()

    assert inst.stats.total_errors == 0, inst.stats.first_error
    assert len(forwards) == 6  # prefill + 5 decode forwards (the 6th token needs no forward)
    assert [n for _t, n in forwards[1:]] == [0] * 5, "a torch hook ran on a decode forward"
    assert len(model._forward_pre_hooks) + len(model._forward_hooks) == 0
    spans = {s.name: s for s in sink.memory.get_finished_spans()}
    for stage in (stages.QUEUE, stages.PREFILL, stages.SAMPLE, stages.DETOKENIZE):
        assert stage in spans, sorted(spans)
    queue, prefill, sample = spans[stages.QUEUE], spans[stages.PREFILL], spans[stages.SAMPLE]
    assert queue.end_time == prefill.start_time <= forwards[0][0]  # prefill starts before its forward
    assert prefill.end_time == sample.start_time <= sample.end_time <= forwards[1][0]  # before the next step
    root = spans[stages.SPAN_REQUEST]
    assert len(root.attributes[stages.ATTR_TOKEN_TIMES_NS]) == 6
    sink.shutdown()
