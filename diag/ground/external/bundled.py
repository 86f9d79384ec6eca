"""The bundled engine (:mod:`diag.bundled_engine`, ``ttft serve``): what to check next in its terms (its
command-line flags) when a rule fires.

Not an external engine: it lives beside them so that every engine's next checks are read in one
place (:func:`diag.ground.external.next_checks`). Its spans are the canonical names of
:mod:`diag.ground.stages`; its ``/metrics`` table (:data:`METRICS`) is vLLM V1's names under
``ttft_engine:`` (:func:`diag.ground.external.vllm.vllm_style`). Pure data.
"""

from __future__ import annotations

from diag.ground.external.vllm import vllm_style
from diag.ground.metric_sources import EngineAdapter

#: what to check next in the bundled engine's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "frontend": "the bundled server: --http-workers, --tokenizer-workers",
    "head_of_line": ("the bundled engine: --admission skip-blocked (admit what fits past a blocked head) and "
                     "--max-partial-prefills N with --policy chunked"),
    "kv_reservation": "the bundled engine: --kv-admission on-demand",
    "prefix_cache": ("the bundled engine: ttft serve --enable-prefix-caching, and --kv-blocks large enough that the "
                     "shared prefix survives between uses"),
}

#: the /metrics table: vLLM V1's names under ``ttft_engine:`` onto the canonical series
METRICS = EngineAdapter(
    engine="bundled",
    prefixes=("ttft_engine:",),
    maps=tuple(vllm_style("ttft_engine:")),
    entity_labels=("engine", "rank", "role"),  # role: each side of --pd, as two instances would report
    source="this repository: diag/bundled_engine (vLLM V1's names under ttft_engine:)",
)
