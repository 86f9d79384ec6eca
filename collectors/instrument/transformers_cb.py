"""``transformers serve --continuous-batching``: stages from the CB loop's steps, and CB warm-up.

Hooks (transformers 5.24.0, ``generation/continuous_batching/continuous_api.py``), all on the
CB generation thread unless said otherwise:

- ``ContinuousBatchProcessor.prepare_next_batch``: scheduling; on success the batch's
  ``inputs_and_outputs.requests_in_batch`` (``FutureRequestState``: request id, query length,
  ``has_new_token``) is noted with the step's start.
- ``ContinuousBatchProcessor._generation_step``: the step (forward + logits processing +
  sampling + device sync). The first step that holds a request ends its ``queue`` and starts
  its ``prefill``; the step whose ``has_new_token`` is the request's first token ends its
  prefill at the model's forward end (a torch forward hook registered on the model for that
  step only, removed after it: decode-only steps run no hook of ours; the step end when the
  hook did not run, e.g. CUDA-graph replay - then ``sample`` is noted unmeasured).
- ``ContinuousBatchProcessor.update_batch``: the first token id is in the request state and
  handed to the output router: ``sample`` ends. One ``ttft.engine.step`` span per step.
- ``ContinuousBatchingManager._create_batch_processor`` and (event loop)
  ``utils.CBGenerateManager.init_cb``: cold start, phase ``warmup`` (paged KV cache, CB thread).

Between ``update_batch`` and ``CBStreamer.put`` on the event loop (``call_soon_threadsafe``)
lies a hand-off that belongs to no stage; meta.json says so. Async batching (CUDA) reads a
step's tokens one step later: its stages are noted unmeasured instead of guessed.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from collectors.instrument import tx_request as rq
from diag.ground import stages

_HANDOFF_NOTE = ("continuous batching: the hand-off from the CB thread (update_batch) to the HTTP "
                 "event loop (CBStreamer.put via call_soon_threadsafe) lies between sample and "
                 "detokenize and is in no stage")


def patch_cb_manager(p: Any, mod: ModuleType) -> None:
    """``utils.CBGenerateManager.init_cb`` (event loop, inside the first CB request): warm-up."""

    def make(orig: Any) -> Any:
        def init_cb(manager: Any, *args: Any, **kwargs: Any) -> Any:
            fresh = getattr(manager, "_cb", None) is None
            t0 = time.time_ns()
            result = orig(manager, *args, **kwargs)
            with p.stats.guard("init_cb"):
                if fresh and p.sink is not None:
                    p.sink.record_cold_start(t0, time.time_ns(), "warmup",
                                             {"ttft.cold_start.what": "init_continuous_batching + start"})
                    p.inst.note_unmeasured("cb.handoff", _HANDOFF_NOTE)
            return result
        return init_cb

    p.wrap(mod.CBGenerateManager, "init_cb", make)


def patch_continuous_api(p: Any, mod: ModuleType) -> None:
    stats = p.stats
    proc = mod.ContinuousBatchProcessor

    def make_create(orig: Any) -> Any:
        def _create_batch_processor(manager: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.time_ns()
            result = orig(manager, *args, **kwargs)
            with stats.guard("create_batch_processor"):
                if p.sink is not None:
                    p.sink.record_cold_start(t0, time.time_ns(), "warmup",
                                             {"ttft.cold_start.what": "continuous batching processor (paged KV cache)"})
            return result
        return _create_batch_processor

    def make_prepare(orig: Any) -> Any:
        def prepare_next_batch(bp: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.time_ns()
            ok = orig(bp, *args, **kwargs)
            with stats.guard("prepare_next_batch"):
                rq.THREAD.cb_batch = None
                if ok and p.sink is not None:
                    if getattr(bp, "use_async_batching", False):
                        for stage in (stages.QUEUE, stages.PREFILL, stages.SAMPLE):
                            p.inst.note_unmeasured(stage, "continuous batching with async batching: a step's "
                                                          "tokens are read one step later")
                    else:
                        batch = bp.inputs_and_outputs.requests_in_batch
                        # only the requests still before their first token (decode steps: none)
                        prefill = [(fs.state.request_id, bool(fs.has_new_token), int(fs.query_length))
                                   for fs in batch if fs.state.generated_len() == 0]
                        first_token = any(new for _rid, new, _q in prefill)
                        rq.THREAD.cb_batch = (t0, prefill, len(batch) - len(prefill), first_token)
            return ok
        return prepare_next_batch

    def note_forward_end(_module: Any, _args: Any, _output: Any) -> None:
        rq.THREAD.forward_end_ns = time.time_ns()
        return None

    def make_step(orig: Any) -> Any:
        def _generation_step(bp: Any, *args: Any, **kwargs: Any) -> Any:
            noted = getattr(rq.THREAD, "cb_batch", None)
            handle = None
            rq.THREAD.forward_end_ns = None
            if noted is not None and noted[3]:  # a first token comes out of this step: time its forward
                with stats.guard("forward_hook"):
                    model = args[0] if args else kwargs["model"]
                    handle = model.register_forward_hook(note_forward_end)
            t0 = time.time_ns()
            try:
                result = orig(bp, *args, **kwargs)
            finally:
                if handle is not None:
                    with stats.guard("forward_hook"):
                        handle.remove()
            t1 = time.time_ns()
            with stats.guard("generation_step"):
                if noted is not None:
                    fwd_end = getattr(rq.THREAD, "forward_end_ns", None)
                    if fwd_end is None and noted[3]:
                        p.inst.note_unmeasured(stages.SAMPLE, "continuous batching: the model's forward hook did "
                                                              "not run (CUDA graph / compiled step); prefill ends at the step end")
                    firsts = []
                    for rid, has_new_token, _q in noted[1]:  # decoding ones: recorded already
                        req = rq.BY_REQUEST_ID.get(rid)
                        if req is None or req.trace is None:
                            continue
                        req.first_forward(t0)
                        if has_new_token and req.prefill_end_ns is None:
                            req.prefill_done(fwd_end if fwd_end is not None else t1)
                            if fwd_end is None:
                                req.sample_start_ns = None
                            firsts.append(req)
                    rq.THREAD.cb_step = (noted[0], t0, t1, firsts)
            return result
        return _generation_step

    def make_update(orig: Any) -> Any:
        def update_batch(bp: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig(bp, *args, **kwargs)
            t1 = time.time_ns()
            with stats.guard("update_batch"):
                step = getattr(rq.THREAD, "cb_step", None)
                noted = getattr(rq.THREAD, "cb_batch", None)
                rq.THREAD.cb_step = None
                if step is not None:
                    for req in step[3]:
                        req.sampled(t1)
                    if noted is not None and p.sink is not None:
                        p.sink.record_step(step[0], t1, {
                            stages.ATTR_STEP_PREFILL_TOKENS: sum(q for _rid, _new, q in noted[1]),
                            stages.ATTR_STEP_PREFILL_SEQS: len(noted[1]),
                            stages.ATTR_STEP_DECODE_SEQS: noted[2],
                        })
            return result
        return update_batch

    p.wrap(mod.ContinuousBatchingManager, "_create_batch_processor", make_create)
    p.wrap(proc, "prepare_next_batch", make_prepare)
    p.wrap(proc, "_generation_step", make_step)
    p.wrap(proc, "update_batch", make_update)
