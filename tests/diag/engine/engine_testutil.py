"""Helpers shared by the engine tests (a uniquely named module: other test folders have conftests)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from diag import stages


def finished_spans(engine) -> list[Any]:
    """Every span the engine's in-memory sink has finished so far."""
    engine.sink.force_flush()
    return list(engine.sink.memory.get_finished_spans())


def spans_by_request(spans) -> dict[int, dict[str, list[Any]]]:
    """trace id -> span name -> spans (request spans under stages.SPAN_REQUEST)."""
    out: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for s in spans:
        out[s.context.trace_id][s.name].append(s)
    return {k: v for k, v in out.items() if stages.SPAN_REQUEST in v}
