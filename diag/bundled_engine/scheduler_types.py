"""The scheduler's plain types: a sequence and its status, one step's plan, the scheduling settings,
the policies and the reasons a sequence waits.

What the engine and the scheduler (:mod:`diag.bundled_engine.scheduler`) hand each other; token counts in
tokens. A :class:`Sequence` and a :class:`StepPlan` belong to the engine's step-loop thread.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from diag.bundled_engine.sampler import SamplerState, SamplingParams

POLICIES: tuple[str, ...] = ("prefill-first", "decode-first", "chunked")
ADMISSIONS: tuple[str, ...] = ("fcfs", "skip-blocked")
KV_ADMISSIONS: tuple[str, ...] = ("on-demand", "reserve")

#: why a sequence is still waiting after a plan (``Scheduler.waiting_reasons`` keys)
WAIT_KV_BLOCKS = "kv_blocks"  # its next chunk needs more free blocks than there are
WAIT_KV_RESERVATION = "kv_reservation"  # reserve: its worst case does not fit beside the reservations
WAIT_MAX_RUNNING = "max_running"  # the running batch is full
WAIT_TOKEN_BUDGET = "token_budget"  # the step's token budget is spent
WAIT_PARTIAL_PREFILLS = "partial_prefills"  # the cap on concurrent partial prefills is reached
WAIT_HEAD_OF_LINE = "head_of_line"  # fcfs: it would fit, but waits behind a head that does not
WAIT_PREEMPTED = "preempted"  # preempted while this step was planned
WAIT_GRAMMAR = "grammar"  # deferred: its grammar is still compiling
WAIT_LORA = "lora"  # deferred: its adapter needs a LoRA slot and the running batch holds max_loras others
WAIT_REASONS: tuple[str, ...] = (WAIT_KV_BLOCKS, WAIT_KV_RESERVATION, WAIT_MAX_RUNNING, WAIT_TOKEN_BUDGET,
                                 WAIT_PARTIAL_PREFILLS, WAIT_HEAD_OF_LINE, WAIT_PREEMPTED, WAIT_GRAMMAR, WAIT_LORA)


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class RequestRejected(ValueError):
    """A request that can never run (too long for the context or the cache); maps to HTTP 400."""


@dataclass
class Sequence:
    """One request's state inside the engine. Token counts are in tokens; times Unix ns."""

    seq_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sampler: SamplerState
    output_ids: list[int] = field(default_factory=list)
    #: tokens whose K/V are in the cache
    num_computed_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING
    preemptions: int = 0
    #: prompt tokens served from the prefix cache at the first admission (0: none, or caching off)
    num_cached_tokens: int = 0
    #: set by the engine
    queue_start_ns: int = 0
    finish_reason: str | None = None
    #: the request gave max_tokens (else it is the server's default; ``kv_admission="reserve"``
    #: then reserves up to the context limit)
    max_tokens_given: bool = True
    #: waiting for something outside the scheduler (its grammar): admission passes over it
    deferred: bool = False
    #: the LoRA adapter it runs with (None: the base model)
    lora: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    def token_slice(self, start: int, end: int) -> list[int]:
        """Token ids at positions ``start..end-1`` of prompt + output."""
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        return (self.prompt_ids + self.output_ids)[start:end]


@dataclass
class ScheduledSeq:
    """One sequence's work in a step: ``num_new_tokens`` tokens from ``start_pos``."""

    seq: Sequence
    start_pos: int
    num_new_tokens: int
    is_prefill: bool

    @property
    def completes(self) -> bool:
        """True when the step yields logits for the sequence's next token."""
        return self.start_pos + self.num_new_tokens == self.seq.num_tokens


@dataclass
class StepPlan:
    """What one engine step runs, plus the sequences preempted while planning it."""

    items: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(i.num_new_tokens for i in self.items if i.is_prefill)

    @property
    def num_prefill_seqs(self) -> int:
        return sum(1 for i in self.items if i.is_prefill)

    @property
    def num_decode_seqs(self) -> int:
        return sum(1 for i in self.items if not i.is_prefill)

    @property
    def num_tokens(self) -> int:
        return sum(i.num_new_tokens for i in self.items)


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling limits. Token budgets in tokens per step."""

    policy: str = "prefill-first"
    chunk_size_tokens: int = 256
    max_num_batched_tokens: int = 2048
    max_running: int = 32
    max_waiting: int = 256
    max_context_tokens: int = 2048
    admission: str = "fcfs"
    #: chunked only: most sequences in prefill per step (None = no cap)
    max_partial_prefills: int | None = None
    kv_admission: str = "on-demand"
    #: distinct LoRA adapters the running batch may hold (None: no LoRA slots, no limit)
    max_loras: int | None = None

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} unknown; expected one of {', '.join(POLICIES)}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission {self.admission!r} unknown; expected one of {', '.join(ADMISSIONS)}")
        if self.kv_admission not in KV_ADMISSIONS:
            raise ValueError(f"kv admission {self.kv_admission!r} unknown; expected one of {', '.join(KV_ADMISSIONS)}")
        if self.max_partial_prefills is not None:
            if self.max_partial_prefills < 1:
                raise ValueError(f"--max-partial-prefills must be >= 1, got {self.max_partial_prefills}")
            if self.policy != "chunked":
                raise ValueError("--max-partial-prefills needs --policy chunked (only chunked prefill has partial prefills)")
        for name in ("chunk_size_tokens", "max_num_batched_tokens", "max_running", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.max_loras is not None and self.max_loras < 1:
            raise ValueError(f"--max-loras must be >= 1, got {self.max_loras}")
