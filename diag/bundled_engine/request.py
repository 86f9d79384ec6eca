"""One request's state inside the bundled engine, from submission to its end.

:class:`EngineRequest` is created on the submitting thread and, once it is in the engine's inbox,
read and written only by the step-loop thread. Times are Unix ns (``time.time_ns``) unless a
name ends in ``_s`` (seconds).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from collectors.spans import RequestTrace
from diag.bundled_engine.grammar import GrammarMatcher
from diag.bundled_engine.grammar_cache import GrammarTicket
from diag.bundled_engine.outputs import EventCallback
from diag.bundled_engine.scheduler_types import Sequence as Seq
from diag.bundled_engine.tokenizer import IncrementalDetokenizer

#: the ``ttft.engine`` attribute and the capture's ``engine`` of the bundled engine
ENGINE_NAME = "bundled"


@dataclass
class EngineRequest:
    """One request's sequence, event callback, trace, detokenizer and timestamps (loop thread once queued)."""

    seq: Seq
    on_event: EventCallback
    trace: RequestTrace | None
    detok: IncrementalDetokenizer
    arrival_ns: int
    queue_start_ns: int
    first_sched_ns: int | None = None
    requeue_ns: int | None = None
    prefill_comm_s: float = 0.0
    prefill_bubble_s: float = 0.0  # pipeline idle seconds of its prefill steps (pp > 1)
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    grammar: GrammarTicket | None = None  # a response_format's grammar (None: unconstrained)
    matcher: GrammarMatcher | None = None  # set once the grammar is ready
    lora_wait_ns: int = 0  # waits for a LoRA slot that ended (ns)
    lora_wait_since_ns: int | None = None  # the plan that found it waiting for a slot (a wait under way)
    lora_load_s: float = 0.0  # its adapter's loads in the steps that admitted it


def new_request_id() -> str:
    """A fresh request id: 24 hex digits."""
    return uuid.uuid4().hex[:24]


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its message (or type name), newlines folded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text
