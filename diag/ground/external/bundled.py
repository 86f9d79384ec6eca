"""The bundled engine (:mod:`diag.bundled_engine`, ``ttft serve``): what to check next in its terms (its
command-line flags) when a rule fires.

Not an external engine: it lives beside them so that every engine's next checks are read in one
place (:func:`diag.ground.external.next_checks`). Its spans and metrics are the canonical names of
:mod:`diag.ground.stages`. Pure data.
"""

from __future__ import annotations

#: what to check next in the bundled engine's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "frontend": "the bundled server: --http-workers, --tokenizer-workers",
    "head_of_line": ("the bundled engine: --admission skip-blocked (admit what fits past a blocked head) and "
                     "--max-partial-prefills N with --policy chunked"),
    "kv_reservation": "the bundled engine: --kv-admission on-demand",
    "prefix_cache": ("the bundled engine: ttft serve --enable-prefix-caching, and --kv-blocks large enough that the "
                     "shared prefix survives between uses"),
}
