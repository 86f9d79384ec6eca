"""One pure-data module per external engine: what it names (spans, attributes, notes, py-spy
frames, its ``/metrics`` table ``METRICS``), each name with the file and commit of the engine's
source it was read from, and what to check next in its terms when a rule fires (``NEXT_CHECKS``:
rule id -> one line). Read by :mod:`diag.ground.external_spans`, :mod:`diag.ground.external_rows`,
:mod:`collectors.pyspy_engines`, :mod:`collectors.prometheus_adapters` (the ``METRICS`` tables,
built from :mod:`diag.ground.metric_sources`) and the rules (:func:`next_checks`); no I/O, any thread.

:mod:`diag.ground.external.bundled` is the bundled engine's (:mod:`diag.bundled_engine`, ``ttft serve``): not an
external engine, but its next checks and ``/metrics`` table sit beside the others' so that a rule
reads every engine's in one place. This module holds the shape of a frame rule the engine modules share and the engine
order.
"""

from __future__ import annotations

from importlib import import_module
from typing import NamedTuple

#: the engine modules of this package, in the order their next-check lines are listed (every
#: engine's, when a capture names none of them); each name is also what
#: :func:`rules.base.engine_checks` matches against the engines a capture names
ENGINES: tuple[str, ...] = ("vllm", "sglang", "llamacpp", "trtllm", "dynamo", "tgi", "transformers", "bundled")


def next_checks(rule_id: str) -> dict[str, str]:
    """Each engine's next-check line for rule ``rule_id`` (its ``NEXT_CHECKS``), ``{engine: line}``
    in :data:`ENGINES` order; engines without a line for the rule are left out."""
    lines: dict[str, str] = {}
    for name in ENGINES:
        line = import_module(f"{__name__}.{name}").NEXT_CHECKS.get(rule_id)
        if line is not None:
            lines[name] = line
    return lines

#: Python tokenizer decode functions (ids -> text), as py-spy prints them (``Class.method``)
DECODE_FUNCS = r"(^|\.)(decode\w*|batch_decode|_decode\w*|convert_ids_to_tokens|convert_tokens_to_string|id_to_token|detokeni\w*)$"


class FrameRule(NamedTuple):
    """One py-spy frame rule of an engine, as plain data: a frame whose file (py-spy's short file
    name) and function (``Class.method``) ``search``-match these regular expressions (None: any)
    is CPU ``stage`` (a name of :data:`diag.ground.stages.CPU_STAGES`); ``why`` says where it was read."""

    stage: str
    file: str | None = None
    func: str | None = None
    why: str = ""
