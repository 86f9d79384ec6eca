"""Hugging Face ``transformers serve`` (plain and ``--continuous-batching``): its py-spy frames.

Read from the installed package, **transformers 5.24.0** (the version is the commit cited), and
learnt by attaching py-spy to a real ``transformers serve`` under load
(tests/thirdparty/test_transformers_pyspy.py). Where each stage lives:

* HTTP: ``cli/serving/server.py`` (FastAPI app, ``request_id_middleware``), ``chat_completion.py``
  / ``completion.py`` / ``response.py`` ``handle_request`` and their ``sse_gen`` generators,
  ``model_manager.py`` (``_resolve_model`` -> ``load_model_and_processor`` on every request);
  serialization: ``ChatCompletionHandler._build_chunk_sse`` / ``_build_completion`` and
  ``BaseHandler.chunk_to_sse`` (pydantic ``model_dump_json``), ``_ResponseStreamBuilder``.
* tokenize: ``processor.apply_chat_template(..., tokenize=True)`` in ``handle_request``
  (``tokenization_utils_base.py``, ``tokenization_utils_tokenizers.py``: the shared rules).
* queue / scheduling: plain mode hands each request to one ``InferenceThread``
  (``cli/serving/utils.py``: ``GenerateManager.generate_streaming`` -> ``InferenceThread.submit``,
  a ``queue.Queue``), then ``GenerationMixin.generate`` sets up config, logits processors,
  stopping criteria and the cache (``generation/utils.py``) before the prefill; CB mode:
  ``CBGenerateManager.generate_streaming`` -> ``ContinuousBatchingManager.add_request``, and the
  generation loop's ``ContinuousBatchProcessor.prepare_next_batch`` / ``update_batch``
  (``generation/continuous_batching/continuous_api.py``), ``FIFOScheduler.schedule_batch``
  (``scheduler.py``), block allocation in ``cache.py`` / ``cache_allocators/``, request states in
  ``requests.py``; ``OutputRouter.deliver_batch`` hands outputs to the event loop.
* forward: ``GenerationMixin._prefill``, ``prepare_inputs_for_generation``,
  ``_update_model_kwargs_for_generation``, the model (``models/*/modeling_*.py``,
  ``integrations/sdpa_attention.py``, ``cache_utils.py``, ``masking_utils.py``, torch.nn); CB:
  ``ModelRunner.compute_batch`` / ``_forward_process_and_sample`` (``model_runner.py``), the batch's
  input tensors (``ContinuousBatchingIOs.prepare_batch_tensors`` in ``input_outputs.py``,
  ``build_attention_mask`` in ``continuous_batching/utils.py``) and the paged-KV writes inside
  attention (``PagedAttentionCache.update``).
* sample: the token choice inline in ``GenerationMixin._sample`` (logits copy, softmax,
  ``torch.multinomial``/``argmax``), ``StopCheck`` / ``DeferredStopCheck`` and
  ``_has_unfinished_sequences``, logits processors and stopping criteria (shared rules); CB:
  ``ModelRunner._sample``.
* detokenize: ``DirectStreamer.put`` (plain; called by ``StopCheck`` on the inference thread)
  and ``CBStreamer.put`` (CB; on the event loop, from ``CBGenerateManager``'s ``_on_output``):
  ``tokenizers.decoders.DecodeStream.step`` in Rust, charged to ``put`` without ``--native``.
Pure data: :data:`FRAMES`, read by :mod:`collectors.pyspy_engines`.
"""

from __future__ import annotations

from diag.ground import stages as S
from diag.ground.external import FrameRule

#: the engine's name (py-spy pattern set)
NAME = "transformers"

#: what to check next in transformers serve's terms, by rule id: none, so its capture gets every
#: engine's line (:func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {}

_TX = r"(^|/)transformers/"
_SERV = _TX + r"cli/serving/"
_GEN = _TX + r"generation/utils\.py$"
_CB = _TX + r"generation/continuous_batching/"

#: which of transformers' own files and functions are which CPU stage, first match first
#: (:mod:`collectors.pyspy_engines` adds the shared rules)
FRAMES: tuple[FrameRule, ...] = (
    # detokenize: the streamers of cli/serving/utils.py (DecodeStream.step runs in Rust inside put)
    FrameRule(S.DETOKENIZE, _SERV + r"utils\.py$",
                            r"^(DirectStreamer|CBStreamer)\.|(^|\.)_decode_prefix$|generate_streaming\.<locals>\._on_output$",
              why="cli/serving/utils.py DirectStreamer.put / CBStreamer.put (DecodeStream.step)"),
    # serialization: SSE chunks and completions built as pydantic models and dumped to JSON
    FrameRule(S.CPU_SERIALIZATION, _SERV,
                                   r"(^|\.)(_build_chunk\w*|_build_completion\w*|chunk_to_sse|response_events_to_chunks|compute_usage)$"
                                   r"|^_ResponseStreamBuilder\.",
              why="cli/serving/chat_completion.py _build_chunk_sse / _build_completion, chunk_to_sse"),
    FrameRule(S.TOKENIZE, _SERV, r"(^|\.)(get_processor_inputs_from_messages|_normalize_input|\w*chat_template\w*)$",
              why="cli/serving: messages -> processor inputs for the chat template"),
    FrameRule(S.TOKENIZE, _TX + r"processing_utils\.py$", why="processor (chat template, input processing)"),
    # queue: the request handed to the inference thread (plain) or the CB manager
    FrameRule(S.CPU_SCHEDULER, _SERV + r"utils\.py$", r"^(InferenceThread|GenerateManager|CBGenerateManager|BaseGenerateManager)\.",
              why="cli/serving/utils.py InferenceThread / GenerateManager: the request's queue"),
    FrameRule(S.CPU_HTTP, _SERV, why="cli/serving: FastAPI app, handle_request, sse_gen, model manager"),
    # plain mode: GenerationMixin (generation/utils.py)
    FrameRule(S.SAMPLE, _GEN, r"^(StopCheck|DeferredStopCheck)\.|^GenerationMixin\.(_sample|_has_unfinished_sequences)$",
              why="generation/utils.py _sample's token choice (softmax, multinomial/argmax), StopCheck"),
    FrameRule(S.CPU_FORWARD, _GEN, r"^GenerationMixin\.(_prefill|prepare_inputs_for_generation|_update_model_kwargs_for_generation"
                             r"|_cache_dependant_input_preparation\w*|_optimize_model_for_decode|get_compiled_call)$",
              why="generation/utils.py _prefill and the decode step's input preparation"),
    FrameRule(S.CPU_SCHEDULER, _GEN, why="generation/utils.py generate() set-up before the prefill (config, processors, cache)"),
    FrameRule(S.CPU_SCHEDULER, _TX + r"generation/configuration_utils\.py$", why="per-request GenerationConfig"),
    # continuous batching: generation/continuous_batching/
    FrameRule(S.SAMPLE, _CB + r"model_runner\.py$", r"^ModelRunner\._sample$", why="continuous_batching ModelRunner._sample"),
    FrameRule(S.CPU_SCHEDULER, _CB + r"input_outputs\.py$", r"\.prepare_batch_update$",
              why="continuous_batching: reading the step's tokens back into request states"),
    FrameRule(S.CPU_FORWARD, _CB + r"(model_runner|input_outputs)\.py$|" + _CB + r"utils\.py$",
              why="continuous_batching ModelRunner.compute_batch, the batch's input tensors and masks"),
    FrameRule(S.CPU_FORWARD, _CB + r"(cache\.py|cache_allocators/)", r"\.update$",
              why="continuous_batching PagedAttentionCache.update: KV writes inside attention"),
    FrameRule(S.CPU_SCHEDULER, _CB, why="continuous_batching scheduler, KV-block allocation, request states, generation loop"),
    # the model itself
    FrameRule(S.CPU_FORWARD, _TX + r"(models/|integrations/|modeling_\w+\.py$|cache_utils\.py$|masking_utils\.py$"
                             r"|pytorch_utils\.py$|activations\.py$)",
              why="modeling_*.py, sdpa attention, caches and masks"),
)
