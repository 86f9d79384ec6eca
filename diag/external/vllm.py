"""vLLM: what its request spans carry, read from vllm-project/vllm at the commits cited beside each name.

Pure data (``docs/engines.md`` has the table); the span names and attributes the request table
also reads are in :mod:`diag.stages` (``VLLM_*``). The ``/metrics`` names are in
:mod:`collectors.adapters.vllm`, the py-spy frames in :mod:`collectors.pyspy_engines`.
"""

from __future__ import annotations

#: the engine's name in request rows and notes
NAME = "vllm"

#: span attribute keys (diag.stages holds the ones the request table also reads)
INFERENCE = "gen_ai.latency.time_in_model_inference"
LATENCY_PREFIX = "gen_ai.latency."
#: vLLM's TTFT starts at ``arrival_time``, set in ``InputProcessor.process_inputs``
#: (``vllm/v1/engine/input_processor.py`` @a1799180) after the OpenAI layer has applied the chat
#: template and tokenized, and ends at ``IterationStats.iteration_timestamp``, taken when the
#: output batch reaches the API server, before ``process_outputs`` detokenizes it
#: (``vllm/v1/metrics/stats.py`` @28ed1fb8, ``vllm/v1/engine/output_processor.py`` @d0782260).
#: Queue and prefill are engine-core intervals (first QUEUED -> first SCHEDULED -> first token).
LUMPED_NOTE = (
    "input processing after arrival + API server <-> engine core IPC + engine-core bookkeeping before QUEUED "
    "(= server TTFT - queue - prefill); tokenization, the chat template and the first detokenize are outside "
    "vLLM's TTFT"
)
#: What client TTFT - server TTFT holds for an engine whose TTFT starts after the front end's
#: tokenization: it is not network alone, so :func:`diag.external_spans.fold_client_gap` moves it into ``lumped``.
GAP_NOTE = (
    "with a client capture joined, lumped also holds client TTFT - server TTFT: network, HTTP, the API server's "
    "chat template and tokenization (before arrival_time) and the first detokenize (after TTFT's end); "
    "vLLM does not time them apart (split them with ttft instrument or a py-spy profile)"
)
#: vLLM span attribute: prompt tokens served from the prefix cache (``vllm/tracing/utils.py`` @0bf3270f;
#: not emitted by vLLM 0.32.0)
CACHED_TOKENS = "gen_ai.usage.cached_tokens"
#: which of our stages its spans cannot separate (shown next to its verdicts)
NOTE = (
    "vLLM separates queue, prefill and decode (engine-core clock). Its TTFT (API server clock) starts "
    "after the chat template and tokenization and ends before the first detokenize, so lumped (TTFT - queue - "
    "prefill) is input processing + IPC + engine-core bookkeeping; tokenization and the first detokenize land "
    "in client TTFT - server TTFT, which is therefore lumped too when a client capture is joined, not called "
    "network. No tokenize/comm/sample/detokenize spans."
)
