"""``transformers serve``'s generation side: streamers, generate managers and torch forward hooks.

Hooks (transformers 5.24.0, ``transformers/cli/serving/utils.py``):

- ``DirectStreamer`` / ``CBStreamer`` ``__init__`` (event loop, inside ``generate_streaming``):
  the streamer carries the request (:data:`tx_request.CURRENT`) to the generation side.
- ``DirectStreamer.put`` (plain mode, inference thread): the first call is ``generate()``
  handing over the prompt (it marks the thread's request for the forward hooks); each later call
  decodes new tokens (``DecodeStream.step``) and queues their text: ``sample`` ends at its entry,
  ``detokenize`` is the call that decoded the first token, token times are its ends.
- ``DirectStreamer.end``: the request leaves the inference thread.
- ``CBStreamer.put`` (continuous batching, event loop): ``detokenize`` and token times.
- ``GenerateManager`` / ``CBGenerateManager`` ``.generate_streaming`` (event loop): input token
  count; the request is registered by id before ``add_request`` so the CB loop finds it.
- :func:`patch_generation` (``transformers/generation/utils.py``): ``GenerationMixin._prefill``,
  the generation loop's prefill boundary (inference thread): plain mode's ``queue`` end and
  ``prefill`` start and end. No hook runs on the per-token decode forwards (a torch hook on the
  top-level model ran on every one of them): per step, only the streamer ``put`` is ours.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from collectors.instrument import tx_request as rq

_PLAIN_WARMUP_NOTE = ("plain mode has no warm-up phase: the first request pays lazy initialisation inside "
                      "its own stages (--continuous-batching records init_cb and the KV-cache allocation)")


def patch_generation(p: Any, mod: ModuleType) -> None:
    """``generation.utils.GenerationMixin._prefill`` (plain mode, inference thread): queue, prefill.

    ``_prefill`` is the generation loop's own prefill boundary (transformers 5.24.0,
    ``generation/utils.py``: ``_sample`` and the beam search call it once per ``generate``; it
    runs the forward over the prompt, all chunks of a chunked prefill, and returns its output).
    Its entry ends the request's ``queue`` and starts ``prefill``; its return ends ``prefill``
    and starts ``sample``. Nothing of ours runs on the decode steps after it: the one-shot
    forward pre-hook armed here (only for a stop check deferred past the next forward, as on
    MPS) is removed by the first ``put`` of a token.
    """
    stats = p.stats

    def make(orig: Any) -> Any:
        def _prefill(model: Any, *args: Any, **kwargs: Any) -> Any:
            req = getattr(rq.THREAD, "req", None)
            if req is None or req.prefill_start_ns is not None:
                return orig(model, *args, **kwargs)
            with stats.guard("prefill_start"):
                req.first_forward(time.time_ns())
            result = orig(model, *args, **kwargs)
            t1 = time.time_ns()
            with stats.guard("prefill_end"):
                req.prefill_done(t1)
                _arm_deferred_sample(stats, model, req)
            return result
        return _prefill

    p.wrap(mod.GenerationMixin, "_prefill", make)


def _arm_deferred_sample(stats: Any, model: Any, req: rq.ServeRequest) -> None:
    """A forward pre-hook that ends ``sample`` if the next forward starts before ``put`` does."""
    if not hasattr(model, "register_forward_pre_hook"):
        return

    def pre(_module: Any, _args: Any) -> None:
        with stats.guard("forward_pre"):
            req.sampled(time.time_ns())  # deferred stop check: the next forward starts before put()
        return None

    req.sample_hook = model.register_forward_pre_hook(pre)


def patch_utils(p: Any, mod: ModuleType) -> None:
    patches = p
    stats = p.stats

    def make_init(orig: Any) -> Any:
        def __init__(streamer: Any, *args: Any, **kwargs: Any) -> None:
            orig(streamer, *args, **kwargs)
            req = rq.CURRENT.get()  # built in generate_streaming, in the handler's context
            if req is not None and req.trace is not None:
                streamer._ttft_req = req
        return __init__

    def make_put(orig: Any) -> Any:
        def put(streamer: Any, value: Any) -> Any:
            req = getattr(streamer, "_ttft_req", None)
            if req is None:
                return orig(streamer, value)
            if not req.prompt_seen:  # plain mode: generate() hands over the prompt first
                with stats.guard("put_prompt"):
                    req.prompt_seen = True
                    rq.THREAD.req = req
                return orig(streamer, value)
            before = streamer.total_tokens
            t0 = time.time_ns()
            try:
                return orig(streamer, value)
            finally:
                t1 = time.time_ns()
                with stats.guard("put"):
                    if req.sample_end_ns is None and req.prefill_end_ns is not None:
                        req.sampled(t0)
                        req.disarm()
                    req.tokens_out(t0, t1, streamer.total_tokens - before)
        return put

    def make_end(orig: Any) -> Any:
        def end(streamer: Any) -> Any:
            with stats.guard("streamer_end"):
                req = getattr(streamer, "_ttft_req", None)
                if req is not None:
                    req.disarm()
                    if getattr(rq.THREAD, "req", None) is req:
                        rq.THREAD.req = None
            return orig(streamer)
        return end

    def make_generate_streaming(orig: Any) -> Any:
        def generate_streaming(manager: Any, *args: Any, **kwargs: Any) -> Any:
            req = rq.CURRENT.get()
            if req is not None and req.trace is not None:
                with stats.guard("generate_streaming"):
                    inputs = kwargs.get("inputs", args[2] if len(args) > 2 else None)
                    ids = inputs["input_ids"] if inputs is not None else None
                    if ids is not None:
                        req.input_tokens = len(ids) if isinstance(ids, list) else int(ids.shape[-1])
                    rq.BY_REQUEST_ID[req.request_id] = req  # before add_request: the CB loop looks it up
                    if isinstance(manager, mod.GenerateManager):
                        patches.inst.note_unmeasured("cold_start.warmup", _PLAIN_WARMUP_NOTE)
            return orig(manager, *args, **kwargs)
        return generate_streaming

    def make_cb_put(orig: Any) -> Any:
        def put(streamer: Any, output: Any) -> Any:
            req = getattr(streamer, "_ttft_req", None)
            if req is None:
                return orig(streamer, output)
            before = streamer.total_tokens
            t0 = time.time_ns()
            try:
                return orig(streamer, output)
            finally:
                t1 = time.time_ns()
                with stats.guard("cb_put"):
                    req.tokens_out(t0, t1, streamer.total_tokens - before)
        return put

    for cls in (mod.DirectStreamer, mod.CBStreamer):
        p.wrap(cls, "__init__", make_init)
    p.wrap(mod.DirectStreamer, "put", make_put)
    p.wrap(mod.DirectStreamer, "end", make_end)
    p.wrap(mod.CBStreamer, "put", make_cb_put)
    for cls in (mod.GenerateManager, mod.CBGenerateManager):
        p.wrap(cls, "generate_streaming", make_generate_streaming)
