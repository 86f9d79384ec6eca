"""llama.cpp server (``llama-server``): what to check next in its terms when a rule fires.

Pure data; its ``/metrics`` names are in :mod:`collectors.adapters.llamacpp` (``docs/engines.md``
has the table).
"""

from __future__ import annotations

#: what to check next in llama.cpp's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "frontend": "llama.cpp: --threads-http (below --parallel slots, requests stall before a slot)",
    "prefix_cache": ("llama.cpp: \"cache_prompt\": true in the request (the chat endpoint once ignored it, "
                     "ggml-org/llama.cpp#4329) and enough slots/--ctx-size that a slot keeps its prompt; "
                     "timings.cache_n per response"),
}
