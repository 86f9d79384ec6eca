"""One pure-data module per external engine: what it names (spans, attributes, notes, py-spy
frames), each name with the file and commit of the engine's source it was read from. Read by
:mod:`diag.external_spans`, :mod:`diag.external_frames` and :mod:`collectors.pyspy_engines`; no
I/O, any thread. This module holds the shape of a frame rule the engine modules share.
"""

from __future__ import annotations

from typing import NamedTuple

#: Python tokenizer decode functions (ids -> text), as py-spy prints them (``Class.method``)
DECODE_FUNCS = r"(^|\.)(decode\w*|batch_decode|_decode\w*|convert_ids_to_tokens|convert_tokens_to_string|id_to_token|detokeni\w*)$"


class FrameRule(NamedTuple):
    """One py-spy frame rule of an engine, as plain data: a frame whose file (py-spy's short file
    name) and function (``Class.method``) ``search``-match these regular expressions (None: any)
    is CPU ``stage`` (a name of :data:`diag.stages.CPU_STAGES`); ``why`` says where it was read."""

    stage: str
    file: str | None = None
    func: str | None = None
    why: str = ""
