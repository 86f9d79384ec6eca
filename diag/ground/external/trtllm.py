"""TensorRT-LLM (``trtllm-serve``): what to check next in its terms when a rule fires.

Pure data; its ``/metrics`` names are in :mod:`collectors.adapters.trtllm` (``docs/engines.md``
has the table).
"""

from __future__ import annotations

#: what to check next in TensorRT-LLM's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "kv_reservation": ("TensorRT-LLM: capacity_scheduler_policy -- GUARANTEED_NO_EVICT admits a request only if KV "
                       "holds its whole max_tokens (the model's max sequence length when unset); MAX_UTILIZATION "
                       "admits on what is used now (NVIDIA/TensorRT-LLM#1012, #2866)"),
    "prefix_cache": ("TensorRT-LLM: KvCacheConfig enable_block_reuse=True (trtllm-serve --extra_llm_api_options); "
                     "trtllm_kv_cache_hit_rate"),
}
