"""py-spy sampler: the raw parser and the stage rules on hand-written stacks, py-spy for real."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collectors import pyspy as P
from collectors.base import SeriesCollector
from collectors.pyspy import (
    CPU_COMM, CPU_DETOKENIZE, CPU_FORWARD, CPU_HTTP, CPU_IDLE, CPU_OTHER, CPU_SAMPLE,
    CPU_SCHEDULER, CPU_SERIALIZATION, CPU_STAGES, CPU_TOKENIZE, Frame, PySpyError,
    PySpyPermissionError, PySpySampler, PySpyUnavailable, attribute, attribute_raw, parse_raw,
)
from diag import stages as S

# --- the raw format ------------------------------------------------------------------------------

RAW = textwrap.dedent("""\
    <module> (run.py:4);encode (diag/engine/tokenizer.py:2) 48
    <module> (run.py:4) 8

    thread (2975): MainThread;<module> (spin2.py:10);JSONEncoder.iterencode (json/encoder.py:258) 32
    thread (0x7f3a1c2d3740);<module> (a.py:1);f (a.py) 3
    process 2973:"bash -c x;y";process 2975:"/usr/bin/python serve.py --port 8000";thread (2976): Thread-1 (waiter);Thread._bootstrap (threading.py:1002);Queue.get (queue.py:171) 5
    main (app.py:9);PyEval_EvalFrame (libpython3.11.so.1.0) 2
     1
    """)


def test_parse_raw_frames_counts_and_prefixes():
    stacks = parse_raw(RAW)
    assert [s.count for s in stacks] == [48, 8, 32, 3, 5, 2, 1]
    assert stacks[6].frames == ()  # py-spy writes " 1" for a sample without Python frames
    assert attribute(stacks).counts[CPU_OTHER] == 8 + 3 + 2 + 1
    a = stacks[0]
    assert a.frames == (Frame("<module>", "run.py", 4), Frame("encode", "diag/engine/tokenizer.py", 2))
    assert a.pid is None and a.thread is None
    assert stacks[2].thread == "2975"
    assert stacks[2].frames[-1] == Frame("JSONEncoder.iterencode", "json/encoder.py", 258)
    assert stacks[3].thread == "0x7f3a1c2d3740"
    assert stacks[3].frames[-1] == Frame("f", "a.py", None)  # --nolineno
    nested = stacks[4]
    assert nested.pid == 2975 and nested.thread == "2976"
    assert [f.func for f in nested.frames] == ["Thread._bootstrap", "Queue.get"]
    assert stacks[5].frames[-1] == Frame("PyEval_EvalFrame", "libpython3.11.so.1.0", None)


def test_parse_raw_rejects_a_line_without_count():
    with pytest.raises(ValueError, match=r"^prof\.txt: line 2: not 'frame;\.\.\.;frame COUNT'"):
        parse_raw("a (x.py:1) 3\na (x.py:1);b (y.py:2)\n", "prof.txt")
    assert parse_raw("") == [] and attribute([]).samples_total == 0


# --- the rules -----------------------------------------------------------------------------------


def stacks_text(*stacks: tuple[list[str], int]) -> str:
    return "\n".join(";".join(frames) + f" {count}" for frames, count in stacks) + "\n"


SERVER = "handle_chat (diag/engine/server.py:120)"
ENGINE = "Engine.step (diag/engine/engine.py:200)"

BUNDLED_CASES: list[tuple[list[str], str]] = [
    ([SERVER, "Tokenizer.encode (diag/engine/tokenizer.py:80)"], CPU_TOKENIZE),
    ([SERVER, "Tokenizer.apply_chat_template (diag/engine/tokenizer.py:90)", "Template.render (jinja2/environment.py:1301)"], CPU_TOKENIZE),
    ([ENGINE, "Tokenizer.decode (diag/engine/tokenizer.py:84)"], CPU_DETOKENIZE),  # first rule in the frame
    ([ENGINE, "IncrementalDetokenizer.add (diag/engine/tokenizer.py:130)", "IncrementalDetokenizer.add.<locals>.<listcomp> (diag/engine/tokenizer.py:131)"], CPU_DETOKENIZE),
    ([ENGINE, "sample (diag/engine/sampler.py:85)", "filter_logits (diag/engine/sampler.py:70)"], CPU_SAMPLE),
    ([ENGINE, "LlamaModel.forward (diag/engine/model.py:300)", "_rms_norm (diag/engine/model.py:236)"], CPU_FORWARD),
    ([ENGINE, "TensorParallelRunner.execute (diag/engine/tp.py:215)"], CPU_FORWARD),
    ([ENGINE, "TensorParallelRunner.execute (diag/engine/tp.py:215)", "TensorParallelRunner._all_reduce (diag/engine/tp.py:206)"], CPU_COMM),
    ([ENGINE, "LlamaModel.forward (diag/engine/model.py:300)", "all_reduce (torch/distributed/distributed_c10d.py:2050)"], CPU_COMM),
    ([ENGINE, "Scheduler.schedule (diag/engine/scheduler.py:280)", "BlockManager.allocate (diag/engine/kv_cache.py:80)"], CPU_SCHEDULER),  # kv_cache is transparent
    ([ENGINE], CPU_SCHEDULER),
    (["Engine.run (diag/engine/engine.py:150)", "Condition.wait (threading.py:327)"], CPU_IDLE),  # deepest wins
    ([SERVER, "dumps (json/__init__.py:231)", "JSONEncoder.encode (json/encoder.py:200)"], CPU_SERIALIZATION),
    ([SERVER], CPU_HTTP),
    (["RequestHandler.data_received (aiohttp/web_protocol.py:370)"], CPU_HTTP),
    (["BaseEventLoop._run_once (asyncio/base_events.py:1898)", "EpollSelector.select (selectors.py:468)"], CPU_IDLE),
    (["Thread.run (threading.py:975)", "_worker (concurrent/futures/thread.py:81)"], CPU_IDLE),  # leaf only
    (["_worker (concurrent/futures/thread.py:83)", "work (app.py:5)"], CPU_OTHER),
    (["BaseEventLoop._run_once (asyncio/base_events.py:1898)",
      "_SelectorSocketTransport._read_ready (asyncio/selector_events.py:1000)"], CPU_HTTP),
    (["Engine.run (diag/engine/engine.py:150)", "Poller.poll (zmq/sugar/poll.py:106)"], CPU_IDLE),
    (["Engine.run (diag/engine/engine.py:150)", "Queue.get (/usr/lib/python3.11/queue.py:171)"], CPU_IDLE),  # --full-filenames
    (["Engine.run (diag/engine/engine.py:150)", "Socket.recv (zmq/sugar/socket.py:300)"], CPU_SCHEDULER),  # not stdlib socket.py
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
    assert top == {"Tokenizer.decode (diag/engine/tokenizer.py)": 30,
                   "IncrementalDetokenizer.add.<locals>.<listcomp> (diag/engine/tokenizer.py)": 40}
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
    text = stacks_text((["sample (diag/engine/sampler.py:85)", "softmax (torch/nn/functional.py:2100)"], 3),
                       (["Engine.run (diag/engine/engine.py:150)", "Handle._run (asyncio/events.py:84)"], 2),
                       (["<module> (run.py:1)", "Handle._run (asyncio/events.py:84)"], 4))
    prof = attribute_raw(text, "bundled")
    assert prof.counts[CPU_SAMPLE] == 3 and prof.counts[CPU_SCHEDULER] == 2 and prof.counts[CPU_HTTP] == 4
    ps = P.pattern_set("bundled")
    frame = Frame("Handle._run", "asyncio/events.py", 84)
    assert ps.classify(frame) is None and ps.classify(frame, fallback=True) == CPU_HTTP


# --- failures and the executable -----------------------------------------------------------------


def test_explain_failure_lines():
    e = P.explain_failure(42, 1, "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n")
    assert isinstance(e, PySpyPermissionError)
    msg = str(e)
    assert "\n" not in msg and "PID 42" in msg
    assert "CAP_SYS_PTRACE" in msg and "--cap-add SYS_PTRACE" in msg and "ptrace_scope=0" in msg
    e = P.explain_failure(42, 1, "Error: Failed to find python version from target process\n\nStack backtrace:\n   0: x\n")
    assert type(e) is PySpyError and "not a running Python process" in str(e)
    e = P.explain_failure(42, 2, "Error: something odd happened\n\nStack backtrace:\n   0: anyhow\n")
    assert str(e) == "py-spy failed on PID 42 (exit 2): something odd happened"


def _fake_pyspy(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "py-spy"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_fake_pyspy_permission_denied(tmp_path):
    exe = _fake_pyspy(tmp_path, "echo \"Permission Denied: Try running again with elevated permissions\" >&2\nexit 1\n")
    with pytest.raises(PySpyPermissionError, match=r"ptrace not permitted; run as root, grant CAP_SYS_PTRACE"):
        PySpySampler(os.getpid(), duration_s=1, py_spy=exe).record()


def test_fake_pyspy_command_line_and_capture_files(tmp_path):
    raw = stacks_text(([SERVER, "Tokenizer.encode (diag/engine/tokenizer.py:80)"], 30),
                      (["Engine.run (diag/engine/engine.py:150)", "Condition.wait (threading.py:327)"], 10))
    (tmp_path / "canned.txt").write_text(raw)
    args_file = tmp_path / "args.txt"
    # writes the canned profile to the file after -o, records its arguments
    exe = _fake_pyspy(tmp_path, textwrap.dedent(f"""\
        echo "$@" > {args_file}
        while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then cp {tmp_path / 'canned.txt'} "$2"; fi; shift; done
        """))
    s = PySpySampler(os.getpid(), duration_s=1.2, rate_hz=250, gil=True, idle=True, nonblocking=True, native=True,
                     py_spy=exe)
    cap = tmp_path / "cap"
    assert isinstance(s, SeriesCollector)
    assert s.collect().empty and tuple(s.collect().columns) == S.SERIES_COLUMNS
    prof = s.record(cap)
    rows = s.collect().set_index("entity")
    assert tuple(s.collect().columns) == S.SERIES_COLUMNS and set(rows.source) == {"pyspy"}
    assert set(rows.series) == {P.SERIES_CPU_SAMPLES} and rows.ts_s.nunique() == 1
    assert rows.loc[f"pid{os.getpid()}/{CPU_TOKENIZE}", "value"] == 30.0
    assert rows.loc[f"pid{os.getpid()}/{CPU_IDLE}", "value"] == 10.0 and rows.value.sum() == 40.0
    args = args_file.read_text().split()
    assert args[:9] == ["record", "--pid", str(os.getpid()), "--duration", "2", "--rate", "250", "--format", "raw"]
    assert args[9] == "-o" and {"--gil", "--idle", "--nonblocking", "--native"} <= set(args[11:])
    assert prof.counts[CPU_TOKENIZE] == 30 and prof.counts[CPU_IDLE] == 10
    assert prof.shares[CPU_TOKENIZE] == pytest.approx(0.75) and prof.busy_shares()[CPU_TOKENIZE] == 1.0
    assert (cap / "profile" / "pyspy.raw.txt").read_text() == raw
    summary = json.loads((cap / "profile" / "pyspy.json").read_text())
    assert summary["counts"][CPU_TOKENIZE] == 30 and summary["pid"] == os.getpid()
    assert summary["options"]["gil"] is True and summary["options"]["native"] is True and summary["rate_hz"] == 250
    again = P.load_profile(cap)
    assert again.counts == prof.counts and again.engine == "bundled"
    assert P.load_profile(cap, "vllm").counts[CPU_OTHER] == 30  # re-attributed with vLLM's rules


def test_stop_keeps_a_failure_instead_of_raising(tmp_path):
    exe = _fake_pyspy(tmp_path, "echo \"Permission Denied: Try running again with elevated permissions\" >&2\nexit 1\n")
    s = PySpySampler(os.getpid(), duration_s=1, py_spy=exe)
    s.stop()  # never started: a no-op
    s.start()
    deadline = time.monotonic() + 10
    while s.running and time.monotonic() < deadline:  # let it fail on its own, not by our SIGINT
        time.sleep(0.01)
    s.stop()
    assert s.profile is None and "ptrace not permitted" in s.error and "\n" not in s.error
    assert s.collect().empty
    with pytest.raises(PySpyPermissionError, match="ptrace not permitted"):
        s.wait()


def test_pyspy_missing_gives_a_note(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    assert P.find_pyspy() is None
    s = PySpySampler(os.getpid())
    assert s.available is False
    assert s.note == "py-spy unavailable: the py-spy executable is not installed (pip install py-spy)"
    with pytest.raises(PySpyUnavailable, match="pip install py-spy"):
        s.record()


def test_find_pyspy_next_to_the_interpreter(monkeypatch, tmp_path):
    exe = _fake_pyspy(tmp_path, "exit 0\n")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert P.find_pyspy() == exe


def test_bad_arguments():
    with pytest.raises(ValueError):
        PySpySampler(1, duration_s=0)
    with pytest.raises(ValueError, match="unknown engine"):
        PySpySampler(1, engine="nope")


# --- py-spy for real (we run as root here) -------------------------------------------------------

needs_pyspy = pytest.mark.skipif(P.find_pyspy() is None, reason="py-spy not installed")

TOKENIZER_PY = '''\
def encode(text):
    out = []
    for word in text.split():
        out.append(sum(ord(c) for c in word) % 50000)
    return out
'''
MODEL_PY = '''\
import math
def forward(n):
    acc = 0.0
    for i in range(n):
        acc += math.sin(i) * math.cos(i)
    return acc
'''
MAIN_PY = '''\
import sys, time
from diag.engine.tokenizer import encode
from diag.engine.model import forward
text = "hello tokenizer world " * 200
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.monotonic()
    while time.monotonic() - t < 0.04:   # ~80% of the time in the tokenizer
        encode(text)
    t = time.monotonic()
    while time.monotonic() - t < 0.01:   # ~20% in the "forward"
        forward(2000)
'''


@pytest.fixture
def workload(tmp_path):
    pkg = tmp_path / "diag" / "engine"
    pkg.mkdir(parents=True)
    (tmp_path / "diag" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "tokenizer.py").write_text(TOKENIZER_PY)
    (pkg / "model.py").write_text(MODEL_PY)
    (tmp_path / "serve.py").write_text(MAIN_PY)
    procs: list[subprocess.Popen[str]] = []

    def start(seconds: float) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "serve.py", str(seconds)], cwd=tmp_path,
                             stdout=subprocess.PIPE, text=True, env={"PATH": os.environ.get("PATH", "")})
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


@needs_pyspy
def test_real_attach_attributes_the_dominant_stage(workload, tmp_path):
    proc = workload(30)
    s = PySpySampler(proc.pid, duration_s=2, rate_hz=200, engine="bundled")
    prof = s.record(tmp_path / "cap")
    assert prof.samples_total >= 100, prof.to_dict()
    assert prof.dominant() == CPU_TOKENIZE, prof.counts
    shares = prof.busy_shares()
    assert shares[CPU_TOKENIZE] > 0.5 and shares[CPU_FORWARD] > 0.05, shares
    assert shares[CPU_TOKENIZE] > 2 * shares[CPU_FORWARD]
    assert "encode (diag/engine/tokenizer.py)" in dict(prof.top_frames[CPU_TOKENIZE])
    assert (tmp_path / "cap" / "profile" / "pyspy.raw.txt").stat().st_size > 0
    assert json.loads((tmp_path / "cap" / "profile" / "pyspy.json").read_text())["pid"] == proc.pid


@needs_pyspy
def test_real_stop_ends_the_window_early(workload):
    proc = workload(30)
    s = PySpySampler(proc.pid, duration_s=60, rate_hz=100)
    t0 = time.monotonic()
    s.start()
    assert s.running
    time.sleep(1.5)
    s.stop()
    prof = s.profile
    assert time.monotonic() - t0 < 20
    assert prof is not None and not s.running and prof.samples_total > 20
    s.stop()
    assert s.profile is prof  # idempotent
    rows = s.collect()  # the protocol's view of the window: samples per stage
    assert isinstance(s, SeriesCollector) and rows.value.sum() == prof.samples_total
    assert rows.set_index("entity").loc[f"pid{proc.pid}/{CPU_TOKENIZE}", "value"] == prof.counts[CPU_TOKENIZE]


@needs_pyspy
def test_real_not_a_python_process():
    p = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(PySpyError, match="not a running Python process"):
            PySpySampler(p.pid, duration_s=1).record()
    finally:
        p.kill()
        p.wait()


@needs_pyspy
def test_real_target_exits_during_the_window(workload):
    proc = workload(1.5)
    prof = PySpySampler(proc.pid, duration_s=10, rate_hz=100).record()
    assert prof.samples_total > 20 and prof.dominant() == CPU_TOKENIZE
    assert prof.meta.get("note") == "the process exited during the window"


def test_no_such_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the PID is free now
    s = PySpySampler(p.pid, duration_s=1, py_spy=sys.executable)
    with pytest.raises(PySpyError, match=f"no process with PID {p.pid}"):
        s.start()


@needs_pyspy
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_real_ptrace_refused_for_an_unprivileged_user(workload, tmp_path):
    proc = workload(30)
    exe = P.find_pyspy()
    if not os.access(exe, os.X_OK) or not (os.stat(exe).st_mode & stat.S_IXOTH):
        pytest.skip("py-spy not executable by other users")
    wrapper = _fake_pyspy(tmp_path, f'exec setpriv --reuid=65534 --regid=65534 --clear-groups {exe} "$@"\n')
    os.chmod(tmp_path, 0o755)
    with pytest.raises(PySpyPermissionError) as info:
        PySpySampler(proc.pid, duration_s=1, py_spy=wrapper).record()
    assert "\n" not in str(info.value) and "ptrace_scope" in str(info.value)
