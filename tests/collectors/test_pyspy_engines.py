"""py-spy's stage rules per engine (:mod:`collectors.pyspy_engines`): hand-written stacks, each
attributed to the CPU stage an engine's own files and functions say, plus the shared frames."""

from __future__ import annotations

import json

import pytest

from collectors import pyspy as P
from collectors.pyspy import (
    CPU_COMM, CPU_DETOKENIZE, CPU_FORWARD, CPU_HTTP, CPU_IDLE, CPU_OTHER, CPU_SAMPLE, CPU_SCHEDULER,
    CPU_SERIALIZATION, CPU_STAGES, CPU_TOKENIZE, Frame, attribute_raw,
)

def stacks_text(*stacks: tuple[list[str], int]) -> str:
    return "\n".join(";".join(frames) + f" {count}" for frames, count in stacks) + "\n"


SERVER = "handle_chat (diag/bundled_engine/server.py:120)"
ENGINE = "Engine.step (diag/bundled_engine/engine.py:200)"

BUNDLED_CASES: list[tuple[list[str], str]] = [
    ([SERVER, "Tokenizer.encode (diag/bundled_engine/tokenizer.py:80)"], CPU_TOKENIZE),
    ([SERVER, "Tokenizer.apply_chat_template (diag/bundled_engine/tokenizer.py:90)", "Template.render (jinja2/environment.py:1301)"], CPU_TOKENIZE),
    ([ENGINE, "Tokenizer.decode (diag/bundled_engine/tokenizer.py:84)"], CPU_DETOKENIZE),  # first rule in the frame
    ([ENGINE, "IncrementalDetokenizer.add (diag/bundled_engine/tokenizer.py:130)", "IncrementalDetokenizer.add.<locals>.<listcomp> (diag/bundled_engine/tokenizer.py:131)"], CPU_DETOKENIZE),
    ([ENGINE, "sample (diag/bundled_engine/sampler.py:85)", "filter_logits (diag/bundled_engine/sampler.py:70)"], CPU_SAMPLE),
    ([ENGINE, "LlamaModel.forward (diag/bundled_engine/model.py:300)", "_rms_norm (diag/bundled_engine/model.py:236)"], CPU_FORWARD),
    ([ENGINE, "TensorParallelRunner.execute (diag/bundled_engine/tp.py:215)"], CPU_FORWARD),
    ([ENGINE, "TensorParallelRunner.execute (diag/bundled_engine/tp.py:215)", "TensorParallelRunner._all_reduce (diag/bundled_engine/tp.py:206)"], CPU_COMM),
    ([ENGINE, "LlamaModel.forward (diag/bundled_engine/model.py:300)", "all_reduce (torch/distributed/distributed_c10d.py:2050)"], CPU_COMM),
    ([ENGINE, "Scheduler.schedule (diag/bundled_engine/scheduler.py:280)", "BlockManager.allocate (diag/bundled_engine/kv_cache.py:80)"], CPU_SCHEDULER),  # kv_cache is transparent
    ([ENGINE], CPU_SCHEDULER),
    (["Engine.run (diag/bundled_engine/engine.py:150)", "Condition.wait (threading.py:327)"], CPU_IDLE),  # deepest wins
    ([SERVER, "dumps (json/__init__.py:231)", "JSONEncoder.encode (json/encoder.py:200)"], CPU_SERIALIZATION),
    ([SERVER], CPU_HTTP),
    (["RequestHandler.data_received (aiohttp/web_protocol.py:370)"], CPU_HTTP),
    (["BaseEventLoop._run_once (asyncio/base_events.py:1898)", "EpollSelector.select (selectors.py:468)"], CPU_IDLE),
    (["Thread.run (threading.py:975)", "_worker (concurrent/futures/thread.py:81)"], CPU_IDLE),  # leaf only
    (["_worker (concurrent/futures/thread.py:83)", "work (app.py:5)"], CPU_OTHER),
    (["BaseEventLoop._run_once (asyncio/base_events.py:1898)",
      "_SelectorSocketTransport._read_ready (asyncio/selector_events.py:1000)"], CPU_HTTP),
    (["Engine.run (diag/bundled_engine/engine.py:150)", "Poller.poll (zmq/sugar/poll.py:106)"], CPU_IDLE),
    (["Engine.run (diag/bundled_engine/engine.py:150)", "Queue.get (/usr/lib/python3.11/queue.py:171)"], CPU_IDLE),  # --full-filenames
    (["Engine.run (diag/bundled_engine/engine.py:150)", "Socket.recv (zmq/sugar/socket.py:300)"], CPU_SCHEDULER),  # not stdlib socket.py
    (["<module> (run.py:4)"], CPU_OTHER),
]


@pytest.mark.parametrize("frames,stage", BUNDLED_CASES, ids=[c[1] + str(i) for i, c in enumerate(BUNDLED_CASES)])
def test_bundled_rules_one_stack_each(frames, stage):
    prof = attribute_raw(stacks_text((frames, 7)), "bundled")
    assert prof.counts[stage] == 7 and prof.samples_total == 7, prof.counts


def test_bundled_profile_shares_counts_and_top_frames():
    text = stacks_text(*[(frames, (i + 1) * 10) for i, (frames, _s) in enumerate(BUNDLED_CASES)])
    prof = attribute_raw(text, "bundled")
    expected: dict[str, int] = {s: 0 for s in CPU_STAGES}
    for i, (_f, stage) in enumerate(BUNDLED_CASES):
        expected[stage] += (i + 1) * 10
    assert prof.counts == expected
    assert prof.samples_total == sum(expected.values())
    assert sum(prof.shares.values()) == pytest.approx(1.0)
    assert prof.shares[CPU_IDLE] == pytest.approx(expected[CPU_IDLE] / prof.samples_total)
    busy = prof.busy_shares()
    assert CPU_IDLE not in busy and sum(busy.values()) == pytest.approx(1.0)
    assert prof.dominant() == max((c, s) for s, c in expected.items() if s != CPU_IDLE)[1]
    top = dict(prof.top_frames[CPU_DETOKENIZE])
    assert top == {"Tokenizer.decode (diag/bundled_engine/tokenizer.py)": 30,
                   "IncrementalDetokenizer.add.<locals>.<listcomp> (diag/bundled_engine/tokenizer.py)": 40}
    d = prof.to_dict()
    json.dumps(d)
    assert d["engine"] == "bundled" and d["samples_total"] == prof.samples_total


API = "create_chat_completion (vllm/entrypoints/openai/api_server.py:600)"
CORE = "EngineCore.run_busy_loop (vllm/v1/engine/core.py:700)"
STEP = "EngineCore.step (vllm/v1/engine/core.py:280)"
RUNNER = "GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py:1400)"

VLLM_CASES: list[tuple[list[str], str]] = [
    ([API, "OpenAIServingChat.create_chat_completion (vllm/entrypoints/openai/serving_chat.py:200)",
      "apply_hf_chat_template (vllm/entrypoints/chat_utils.py:1300)", "Template.render (jinja2/environment.py:1301)"], CPU_TOKENIZE),
    ([API, "AsyncLLM.add_request (vllm/v1/engine/async_llm.py:250)", "Processor.process_inputs (vllm/v1/engine/processor.py:220)",
      "InputPreprocessor._tokenize_prompt (vllm/inputs/preprocess.py:200)",
      "PreTrainedTokenizerFast._batch_encode_plus (transformers/tokenization_utils_fast.py:528)"], CPU_TOKENIZE),
    ([API, "OpenAIServingChat._preprocess_chat (vllm/entrypoints/openai/serving_engine.py:800)"], CPU_TOKENIZE),
    ([CORE, STEP, "Scheduler.schedule (vllm/v1/core/sched/scheduler.py:180)",
      "KVCacheManager.allocate_slots (vllm/v1/core/kv_cache_manager.py:250)"], CPU_SCHEDULER),
    ([CORE, STEP, "UniProcExecutor.execute_model (vllm/v1/executor/abstract.py:87)", RUNNER,
      "LlamaModel.forward (vllm/model_executor/models/llama.py:380)"], CPU_FORWARD),
    ([CORE, STEP, RUNNER, "Sampler.forward (vllm/v1/sample/sampler.py:60)",
      "TopKTopPSampler.forward_native (vllm/v1/sample/ops/topk_topp_sampler.py:90)"], CPU_SAMPLE),
    ([RUNNER, "LlamaModel.forward (vllm/model_executor/models/llama.py:380)",
      "tensor_model_parallel_all_reduce (vllm/distributed/communication_op.py:13)",
      "GroupCoordinator.all_reduce (vllm/distributed/parallel_state.py:320)"], CPU_COMM),
    ([CORE, STEP, "MultiprocExecutor.collective_rpc (vllm/v1/executor/multiproc_executor.py:180)",
      "MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:480)"], CPU_FORWARD),
    (["AsyncLLM.output_handler (vllm/v1/engine/async_llm.py:400)",
      "OutputProcessor.process_outputs (vllm/v1/engine/output_processor.py:380)",
      "FastIncrementalDetokenizer.update (vllm/v1/engine/detokenizer.py:120)"], CPU_DETOKENIZE),
    ([CORE, "EngineCore._process_input_queue (vllm/v1/engine/core.py:720)", "Queue.get (queue.py:171)",
      "Condition.wait (threading.py:327)"], CPU_IDLE),
    (["EngineCoreProc.process_input_sockets (vllm/v1/engine/core.py:800)",
      "MsgpackDecoder.decode (vllm/v1/serial_utils.py:250)"], CPU_SERIALIZATION),
    (["HttpToolsProtocol.on_url (uvicorn/protocols/http/httptools_impl.py:250)"], CPU_HTTP),
    ([API], CPU_HTTP),
    ([API, "OpenAIServingChat.chat_completion_stream_generator (vllm/entrypoints/openai/serving_chat.py:700)",
      "BaseModel.model_dump_json (pydantic/main.py:470)"], CPU_SERIALIZATION),
]

SCHED = "Scheduler.event_loop_normal (sglang/srt/managers/scheduler.py:900)"
SG_CASES: list[tuple[list[str], str]] = [
    ([SCHED, "Scheduler.get_next_batch_to_run (sglang/srt/managers/scheduler.py:1500)",
      "PrefillAdder.add_one_req (sglang/srt/managers/schedule_policy.py:500)"], CPU_SCHEDULER),
    ([SCHED, "Scheduler.run_batch (sglang/srt/managers/scheduler.py:1700)",
      "TpModelWorker.forward_batch_generation (sglang/srt/managers/tp_worker.py:200)",
      "ModelRunner.forward (sglang/srt/model_executor/model_runner.py:1400)"], CPU_FORWARD),
    ([SCHED, "TpModelWorker.forward_batch_generation (sglang/srt/managers/tp_worker.py:200)",
      "Sampler.forward (sglang/srt/layers/sampler.py:60)"], CPU_SAMPLE),
    ([SCHED, "Scheduler.recv_requests (sglang/srt/managers/scheduler.py:1000)",
      "Socket.recv_pyobj (zmq/sugar/socket.py:900)"], CPU_SERIALIZATION),
    (["TokenizerManager.generate_request (sglang/srt/managers/tokenizer_manager.py:400)",
      "TokenizerManager._tokenize_one_request (sglang/srt/managers/tokenizer_manager.py:500)"], CPU_TOKENIZE),
    (["TokenizerManager.generate_request (sglang/srt/managers/tokenizer_manager.py:400)"], CPU_HTTP),
    (["DetokenizerManager.event_loop (sglang/srt/managers/detokenizer_manager.py:100)",
      "DetokenizerManager.handle_batch_token_id_out (sglang/srt/managers/detokenizer_manager.py:200)",
      "Tokenizer.decode_batch (tokenizers/implementations/base_tokenizer.py:290)"], CPU_DETOKENIZE),
    (["openai_v1_chat_completions (sglang/srt/entrypoints/http_server.py:700)",
      "OpenAIServingChat._process_messages (sglang/srt/entrypoints/openai/serving_chat.py:150)"], CPU_TOKENIZE),
    (["openai_v1_chat_completions (sglang/srt/entrypoints/http_server.py:700)"], CPU_HTTP),
    ([SCHED, "RadixCache.match_prefix (sglang/srt/mem_cache/radix_cache.py:200)"], CPU_SCHEDULER),
    (["all_reduce (sglang/srt/distributed/parallel_state.py:400)"], CPU_COMM),
]


@pytest.mark.parametrize("engine,cases", [("vllm", VLLM_CASES), ("sglang", SG_CASES)])
def test_external_engine_rules(engine, cases):
    for frames, stage in cases:
        prof = attribute_raw(stacks_text((frames, 3)), engine)
        assert prof.counts[stage] == 3, (frames[-1], stage, {k: v for k, v in prof.counts.items() if v})


def test_engine_sets_differ_and_unknown_engine_is_an_error():
    text = stacks_text((["EngineCore.step (vllm/v1/engine/core.py:280)"], 4))
    assert attribute_raw(text, "vllm").counts[CPU_SCHEDULER] == 4
    assert attribute_raw(text, "bundled").counts[CPU_OTHER] == 4
    assert attribute_raw(text, "generic").counts[CPU_OTHER] == 4  # no table, no telling name
    named = stacks_text((["Scheduler.schedule (vllm/v1/core/sched/scheduler.py:180)"], 4))
    assert attribute_raw(named, "generic").counts[CPU_SCHEDULER] == 4  # generic goes by the name
    assert attribute_raw(named, "bundled").counts[CPU_OTHER] == 4  # an engine's table names its files only
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        attribute_raw(text, "tgi")


# --- transformers serve (frames as py-spy printed them on a real attach; transformers 5.24.0) -----

HF_LOOP = ["Thread.run (threading.py:1010)", "InferenceThread._run (transformers/cli/serving/utils.py:742)",
           "GenerateManager.generate_streaming.<locals>._run (transformers/cli/serving/utils.py:863)",
           "GenerationMixin.generate (transformers/generation/utils.py:2500)"]
HF_SAMPLE = [*HF_LOOP, "GenerationMixin._sample (transformers/generation/utils.py:3240)"]
CALL = ["Module._wrapped_call_impl (torch/nn/modules/module.py:1776)", "Module._call_impl (torch/nn/modules/module.py:1787)"]
HF_MODEL = [*HF_SAMPLE, *CALL, "LlamaForCausalLM.forward (transformers/models/llama/modeling_llama.py:480)",
            *CALL, "LlamaModel.forward (transformers/models/llama/modeling_llama.py:400)"]
HF_SRV = ["<module> (transformers:8)", "Serve.__init__ (transformers/cli/serve.py:250)",
          "Server.run (uvicorn/server.py:67)", "asyncio_run (uvicorn/_compat.py:30)", "Runner.run (asyncio/runners.py:118)"]
HF_HANDLER = [*HF_SRV, "RequestResponseCycle.run_asgi (uvicorn/protocols/http/h11_impl.py:415)",
              "run_endpoint_function (fastapi/routing.py:300)",
              "build_server.<locals>.chat_completions (transformers/cli/serving/server.py:109)",
              "ChatCompletionHandler.handle_request (transformers/cli/serving/chat_completion.py:135)"]
HF_SSE = [*HF_SRV, "StreamingResponse.stream_response (starlette/responses.py:250)",
          "ChatCompletionHandler._streaming.<locals>.sse_gen (transformers/cli/serving/chat_completion.py:250)"]
CB = "transformers/generation/continuous_batching/"
CB_LOOP = ["Thread.run (threading.py:1010)",
           f"ContinuousBatchingManager._run_generation_loop ({CB}continuous_api.py:1140)",
           f"ContinuousBatchingManager._generation_loop_body ({CB}continuous_api.py:1095)"]
CB_RUNNER = [*CB_LOOP, f"ContinuousBatchProcessor._generation_step ({CB}continuous_api.py:640)",
             f"ModelRunner.compute_batch ({CB}model_runner.py:150)",
             f"ModelRunner._forward_process_and_sample ({CB}model_runner.py:195)"]

TRANSFORMERS_CASES: list[tuple[list[str], str]] = [
    # plain: the inference thread running model.generate()
    ([*HF_MODEL, *CALL, "LlamaAttention.forward (transformers/models/llama/modeling_llama.py:300)",
      "sdpa_attention_forward (transformers/integrations/sdpa_attention.py:90)"], CPU_FORWARD),
    ([*HF_MODEL, *CALL, "Linear.forward (torch/nn/modules/linear.py:134)"], CPU_FORWARD),
    ([*HF_SAMPLE, "GenerationMixin._prefill (transformers/generation/utils.py:3500)", *CALL], CPU_FORWARD),
    ([*HF_SAMPLE, "GenerationMixin._update_model_kwargs_for_generation (transformers/generation/utils.py:1000)"], CPU_FORWARD),
    (HF_SAMPLE, CPU_SAMPLE),  # softmax / multinomial / argmax inline in _sample
    ([*HF_SAMPLE, "Tensor.__rsub__ (torch/_tensor.py:40)"], CPU_SAMPLE),  # torch plumbing never outranks _sample
    ([*HF_SAMPLE, "StopCheck.__call__ (transformers/generation/utils.py:395)"], CPU_SAMPLE),
    ([*HF_SAMPLE, "StoppingCriteriaList.__call__ (transformers/generation/stopping_criteria.py:500)",
      "EosTokenCriteria.__call__ (transformers/generation/stopping_criteria.py:480)"], CPU_SAMPLE),
    ([*HF_SAMPLE, "StopCheck.__call__ (transformers/generation/utils.py:395)",
      "DirectStreamer.put (transformers/cli/serving/utils.py:600)",
      "DirectStreamer._enqueue (transformers/cli/serving/utils.py:591)"], CPU_DETOKENIZE),
    ([*HF_LOOP, "GenerationMixin._get_logits_processor (transformers/generation/utils.py:1200)"], CPU_SCHEDULER),
    (["Thread.run (threading.py:1010)", "InferenceThread._run (transformers/cli/serving/utils.py:738)",
      "Queue.get (queue.py:171)", "Condition.wait (threading.py:327)"], CPU_IDLE),
    # the HTTP side
    (HF_SRV, CPU_HTTP),  # uvloop's C loop: the event loop's own work
    ([*HF_SRV, "run_until_complete (loop.c)", "epoll_pwait (libc.so.6)"], CPU_IDLE),  # --native
    ([*HF_HANDLER, "PreTrainedTokenizerBase.apply_chat_template (transformers/tokenization_utils_base.py:3000)",
      "TokenizersBackend._encode_plus (transformers/tokenization_utils_tokenizers.py:800)"], CPU_TOKENIZE),
    ([*HF_HANDLER, "BaseHandler._resolve_model (transformers/cli/serving/utils.py:1210)",
      "ModelManager.load_model_and_processor (transformers/cli/serving/model_manager.py:330)"], CPU_HTTP),
    ([*HF_HANDLER, "ModelManager.load_model_and_processor (transformers/cli/serving/model_manager.py:330)",
      "TimedModel.reset_timer (transformers/cli/serving/model_manager.py:80)", "Thread.start (threading.py:964)",
      "Event.wait (threading.py:629)", "Condition.wait (threading.py:327)"], CPU_IDLE),
    ([*HF_SSE, "ChatCompletionHandler._build_chunk_sse (transformers/cli/serving/chat_completion.py:420)"], CPU_SERIALIZATION),
    ([*HF_SSE, "ChatCompletionHandler._build_chunk_sse (transformers/cli/serving/chat_completion.py:420)",
      "BaseModel.model_dump_json (pydantic/main.py:470)"], CPU_SERIALIZATION),
    ([*HF_SSE, "sleep (asyncio/tasks.py:649)"], CPU_IDLE),
    ([*HF_SRV, "RequestResponseCycle.send (uvicorn/protocols/http/h11_impl.py:500)"], CPU_HTTP),
    # --continuous-batching: the generation loop thread and the event loop's output callbacks
    ([*CB_LOOP, f"ContinuousBatchProcessor.prepare_next_batch ({CB}continuous_api.py:500)",
      f"FIFOScheduler.schedule_batch ({CB}scheduler.py:350)", f"Scheduler._schedule_request ({CB}scheduler.py:200)"],
     CPU_SCHEDULER),
    ([*CB_LOOP, f"ContinuousBatchProcessor.prepare_next_batch ({CB}continuous_api.py:500)",
      f"ContinuousBatchingIOs.prepare_batch_tensors ({CB}input_outputs.py:400)",
      f"build_attention_mask ({CB}utils.py:100)"], CPU_FORWARD),
    ([*CB_RUNNER, *CALL, "LlamaForCausalLM.forward (transformers/models/llama/modeling_llama.py:480)",
      "DisableContext.__call__.<locals>._fn (torch/_dynamo/eval_frame.py:1000)",
      f"PagedAttentionCache.update ({CB}cache.py:420)",
      f"FullAttentionCacheAllocator.update ({CB}cache_allocators/full_attention.py:80)"], CPU_FORWARD),
    ([*CB_RUNNER, f"ModelRunner._sample ({CB}model_runner.py:230)"], CPU_SAMPLE),
    ([*CB_LOOP, f"ContinuousBatchProcessor.update_batch ({CB}continuous_api.py:600)",
      f"ContinuousBatchingIOs.prepare_batch_update ({CB}input_outputs.py:500)"], CPU_SCHEDULER),
    ([*CB_LOOP, f"ContinuousBatchProcessor.update_batch ({CB}continuous_api.py:600)",
      f"OutputRouter.deliver_batch ({CB}continuous_api.py:125)"], CPU_SCHEDULER),
    ([*HF_SRV, "Handle._run (asyncio/events.py:84)", f"OutputRouter.deliver_batch.<locals>._run_batch ({CB}continuous_api.py:130)",
      "CBGenerateManager.generate_streaming.<locals>._on_output (transformers/cli/serving/utils.py:990)",
      "CBStreamer.put (transformers/cli/serving/utils.py:680)"], CPU_DETOKENIZE),
    ([*HF_HANDLER, "CBGenerateManager.generate_streaming (transformers/cli/serving/utils.py:960)",
      f"ContinuousBatchingManager.add_request ({CB}continuous_api.py:940)"], CPU_SCHEDULER),
    # --native frames under Python ones
    ([*HF_MODEL, "Linear.forward (torch/nn/modules/linear.py:134)", "torch::autograd::THPVariable_linear (libtorch_python.so)",
      "at::_ops::linear::call (libtorch_cpu.so)"], CPU_FORWARD),
    ([*HF_SAMPLE, "torch::autograd::THPVariable_argmax (libtorch_python.so)", "at::_ops::argmax::call (libtorch_cpu.so)"],
     CPU_SAMPLE),
    ([*HF_SAMPLE, "StopCheck.__call__ (transformers/generation/utils.py:395)",
      "DirectStreamer.put (transformers/cli/serving/utils.py:600)",
      "tokenizers::decoders::DecodeStream::step (tokenizers/tokenizers.abi3.so)"], CPU_DETOKENIZE),
    (["Condition.wait (threading.py:331)", "lock_PyThread_acquire_lock (libpython3.11.so.1.0)",
      "PyThread_acquire_lock_timed (libpython3.11.so.1.0)", "0x7f112c4aed90 (libc.so.6)"], CPU_IDLE),
]


@pytest.mark.parametrize("frames,stage", TRANSFORMERS_CASES,
                         ids=[c[1] + str(i) for i, c in enumerate(TRANSFORMERS_CASES)])
def test_transformers_rules_one_stack_each(frames, stage):
    prof = attribute_raw(stacks_text((frames, 5)), "transformers")
    assert prof.counts[stage] == 5, (frames[-1], stage, {k: v for k, v in prof.counts.items() if v})


# --- generic: the frames every Python stack shares, and what engines usually call things ---------

LC = ["WorkerThread.run (anyio/_backends/_asyncio.py:967)", "iterate_in_threadpool.<locals>._next (starlette/concurrency.py:60)",
      "Llama._create_completion (llama_cpp/llama.py:1400)"]
GENERIC_CASES: list[tuple[list[str], str]] = [
    (["loop (myengine/core.py:1)", "MyModel.forward (myengine/model.py:3)"], CPU_FORWARD),
    (["loop (myengine/core.py:1)", "Sampler.forward (myengine/sampling.py:5)"], CPU_SAMPLE),  # file before name
    (["loop (myengine/core.py:1)", "apply_top_p (myengine/ops.py:5)"], CPU_SAMPLE),
    (["loop (myengine/core.py:1)", "sample (myengine/ops.py:7)", "softmax (torch/nn/functional.py:2100)"], CPU_SAMPLE),
    (["loop (myengine/core.py:1)", "BatchScheduler.next_batch (myengine/core.py:9)"], CPU_SCHEDULER),
    (["loop (myengine/core.py:1)", "plan (myengine/scheduling/policy.py:9)"], CPU_SCHEDULER),
    (["handler (myengine/api.py:1)", "render_chat_template (myengine/api.py:2)"], CPU_TOKENIZE),
    (["handler (myengine/api.py:1)", "IncrementalDetokenizer.step (myengine/out.py:2)"], CPU_DETOKENIZE),
    (["handler (myengine/api.py:1)", "TextIteratorStreamer.put (transformers/generation/streamers.py:100)"], CPU_DETOKENIZE),
    (["loop (myengine/core.py:1)", "RepetitionPenaltyLogitsProcessor.__call__ (transformers/generation/logits_process.py:300)"],
     CPU_SAMPLE),
    (["Handle._run (asyncio/events.py:84)", "handler (myengine/api.py:1)"], CPU_HTTP),  # the loop, as a fallback
    (["Handle._run (asyncio/events.py:84)", "handler (myengine/api.py:1)", "dumps (json/__init__.py:231)"], CPU_SERIALIZATION),
    (["TaskHandle._run_coro (anyio/_core/_tasks.py:100)", "handler (myengine/api.py:1)"], CPU_HTTP),
    (["loop (myengine/core.py:1)", "Module._call_impl (torch/nn/modules/module.py:1787)"], CPU_FORWARD),  # fallback
    (["loop (myengine/core.py:1)", "step (myengine/core.py:4)", "is_initialized (torch/distributed/distributed_c10d.py:1200)"],
     CPU_OTHER),  # a query, not a collective
    (["loop (myengine/core.py:1)", "all_reduce (torch/distributed/distributed_c10d.py:2050)"], CPU_COMM),
    # native frames only (a C++/Rust engine under a thin Python server, seen with --native)
    (["serve (myengine/loop.py:10)", "Encoding::drop_glue (tokenizers/tokenizers.abi3.so)"], CPU_TOKENIZE),
    (["serve (myengine/loop.py:10)", "tokenizers::decoders::DecodeStream::step (tokenizers/tokenizers.abi3.so)"], CPU_DETOKENIZE),
    (["serve (myengine/loop.py:10)", "at::native::cpublas::gemm (libtorch_cpu.so)"], CPU_FORWARD),
    (["serve (myengine/loop.py:10)", "at::native::multinomial (libtorch_cpu.so)"], CPU_SAMPLE),
    (["serve (myengine/loop.py:10)", "gomp_team_barrier_wait_end (libgomp.so.1)"], CPU_FORWARD),
    (["serve (myengine/loop.py:10)", "pthread_cond_timedwait (libc.so.6)", "0x7f11 (libc.so.6)"], CPU_IDLE),
    (["serve (myengine/loop.py:10)", "step (myengine/loop.py:12)"], CPU_OTHER),
    # llama-cpp-python's server (frames from its source: llama_cpp/llama.py, _internals.py, server/app.py)
    ([*LC, "Llama.generate (llama_cpp/llama.py:980)", "Llama.eval (llama_cpp/llama.py:680)",
      "LlamaContext.decode (llama_cpp/_internals.py:330)"], CPU_FORWARD),
    ([*LC, "Llama.generate (llama_cpp/llama.py:980)", "Llama.eval (llama_cpp/llama.py:680)",
      "LlamaContext.decode (llama_cpp/_internals.py:330)", "llama_decode (libllama.so)",
      "ggml_graph_compute (libggml-cpu.so)"], CPU_FORWARD),
    ([*LC, "Llama.generate (llama_cpp/llama.py:980)", "Llama.sample (llama_cpp/llama.py:830)",
      "LlamaSampler.sample (llama_cpp/_internals.py:860)"], CPU_SAMPLE),
    ([*LC, "Llama.generate (llama_cpp/llama.py:980)", "Llama.sample (llama_cpp/llama.py:830)",
      "LlamaSampler.sample (llama_cpp/_internals.py:860)", "llama_sampler_sample (libllama.so)"], CPU_SAMPLE),
    ([*LC, "Llama.generate (llama_cpp/llama.py:980)"], CPU_SCHEDULER),
    ([*LC, "Llama.detokenize (llama_cpp/llama.py:630)", "LlamaModel.detokenize (llama_cpp/_internals.py:195)",
      "LlamaModel.token_to_piece (llama_cpp/_internals.py:188)"], CPU_DETOKENIZE),
    (LC, CPU_DETOKENIZE),  # _create_completion's own per-token text work
    ([*LC[:-1], "Llama.create_chat_completion (llama_cpp/llama.py:2050)",
      "chatml_function_calling (llama_cpp/llama_chat_format.py:600)"], CPU_TOKENIZE),
    ([*LC[:-1], "Llama.tokenize (llama_cpp/llama.py:610)", "LlamaModel.tokenize (llama_cpp/_internals.py:170)"], CPU_TOKENIZE),
    ([*HF_SRV, "create_chat_completion (llama_cpp/server/app.py:500)"], CPU_HTTP),
]


@pytest.mark.parametrize("frames,stage", GENERIC_CASES, ids=[c[1] + str(i) for i, c in enumerate(GENERIC_CASES)])
def test_generic_rules_one_stack_each(frames, stage):
    prof = attribute_raw(stacks_text((frames, 2)), "generic")
    assert prof.counts[stage] == 2, (frames[-1], stage, {k: v for k, v in prof.counts.items() if v})


def test_plumbing_never_outranks_the_code_it_calls():
    # a sampler calling torch's functional softmax: the deeper torch frame is plumbing (a fallback)
    text = stacks_text((["sample (diag/bundled_engine/sampler.py:85)", "softmax (torch/nn/functional.py:2100)"], 3),
                       (["Engine.run (diag/bundled_engine/engine.py:150)", "Handle._run (asyncio/events.py:84)"], 2),
                       (["<module> (run.py:1)", "Handle._run (asyncio/events.py:84)"], 4))
    prof = attribute_raw(text, "bundled")
    assert prof.counts[CPU_SAMPLE] == 3 and prof.counts[CPU_SCHEDULER] == 2 and prof.counts[CPU_HTTP] == 4
    ps = P.pattern_set("bundled")
    frame = Frame("Handle._run", "asyncio/events.py", 84)
    assert ps.classify(frame) is None and ps.classify(frame, fallback=True) == CPU_HTTP
