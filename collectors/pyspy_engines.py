"""Per-engine py-spy frame tables: which of an engine's own files and functions are which CPU stage.

Each :class:`~collectors.pyspy_frames.PatternSet` is the engine's rules (for an external engine, its
``FRAMES`` in :mod:`diag.ground.external`: ``vllm``, ``sglang``, ``transformers``), then the shared
:data:`~collectors.pyspy_frames.COMMON_RULES` and :data:`~collectors.pyspy_frames.FALLBACK_RULES`
(the walk that picks a sample's stage is in :mod:`collectors.pyspy_frames`). Engines:
``bundled`` (diag/bundled_engine), ``vllm``, ``sglang``, ``transformers`` (``transformers serve``, plain and
``--continuous-batching``) and ``generic`` (shared frames plus naming conventions, for an engine
with no table). Immutable; thread-safe.
"""

from __future__ import annotations

from collectors.pyspy_frames import (
    COMMON_RULES, CPU_COMM, CPU_DETOKENIZE, CPU_FORWARD, CPU_HTTP, CPU_SAMPLE, CPU_SCHEDULER, CPU_TOKENIZE,
    FALLBACK_RULES, GENERIC, PatternSet, Rule, _r,
)
from diag.ground.external import FrameRule, sglang, transformers, vllm

_SHARED = COMMON_RULES + FALLBACK_RULES


def _rules(frames: tuple[FrameRule, ...]) -> tuple[Rule, ...]:
    """An engine's frame rules (plain data, :mod:`diag.ground.external`) as compiled rules, in order."""
    return tuple(_r(f.stage, f.file, f.func, why=f.why) for f in frames)

_BUNDLED = r"(^|/)(diag/)?bundled_engine/"
BUNDLED = PatternSet("bundled", (
    _r(CPU_DETOKENIZE, _BUNDLED + r"tokenizer\.py$",
       r"^IncrementalDetokenizer\.|(^|\.)(decode\w*|_decode\w*|detokeni\w*)$",
       why="diag/bundled_engine/tokenizer.py decode / IncrementalDetokenizer"),
    _r(CPU_TOKENIZE, _BUNDLED + r"tokenizer\.py$", why="diag/bundled_engine/tokenizer.py (encode, chat template)"),
    _r(CPU_DETOKENIZE, _BUNDLED, r"(^|\.)_?detokeni\w*$", why="a detokenize function in the engine"),
    _r(CPU_TOKENIZE, _BUNDLED, r"(^|\.)_?tokeni[sz]e\w*$", why="a tokenize function in the engine"),
    _r(CPU_SAMPLE, _BUNDLED + r"sampler\.py$", why="diag/bundled_engine/sampler.py"),
    _r(CPU_COMM, _BUNDLED + r"tp\.py$", r"(^|\.)_?(all_reduce|all_gather\w*|broadcast\w*|barrier|reduce_scatter\w*)$",
       why="diag/bundled_engine/tp.py collectives"),
    _r(CPU_FORWARD, _BUNDLED + r"(model|model_config|tp)\.py$",
       why="diag/bundled_engine/model.py forward, model_config.py weights, tp.py runners"),
    _r(CPU_SCHEDULER, _BUNDLED + r"scheduler(_types)?\.py$", why="diag/bundled_engine/scheduler.py, scheduler_types.py"),
    _r(CPU_HTTP, _BUNDLED + r"(server|openai_protocol|delayed_writer)\.py$",
       why="diag/bundled_engine/server.py (HTTP, SSE), openai_protocol.py, delayed_writer.py"),
    _r(CPU_SCHEDULER, _BUNDLED + r"(engine|engine_load|step_loop|request_outputs|request)\.py$",
       why="diag/bundled_engine/engine.py, step_loop.py, request_outputs.py, engine_load.py: step loop bookkeeping"),
) + _SHARED)

VLLM = PatternSet(vllm.NAME, _rules(vllm.FRAMES) + _SHARED)

SGLANG = PatternSet(sglang.NAME, _rules(sglang.FRAMES) + _SHARED)
TRANSFORMERS = PatternSet(transformers.NAME, _rules(transformers.FRAMES) + _SHARED)


PATTERN_SETS: dict[str, PatternSet] = {p.engine: p for p in (BUNDLED, VLLM, SGLANG, TRANSFORMERS, GENERIC)}


def pattern_set(engine: str | PatternSet) -> PatternSet:
    """The rules for ``engine`` ("bundled", "vllm", "sglang", "transformers", "generic") or the set itself."""
    if isinstance(engine, PatternSet):
        return engine
    try:
        return PATTERN_SETS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(PATTERN_SETS)}") from None

