"""Continuous-batching scheduler: which sequences run in the next engine step, and how many tokens.

Policies (``SchedulerConfig.policy``):

- ``prefill-first``: when waiting prompts can be admitted, the step is prefill-only (whole
  prompts, FIFO, under the token budget); running decodes pause for that step. Good TTFT,
  decode stalls (prefill-decode interference) under load.
- ``decode-first``: every step runs all running decodes; waiting prompts are admitted whole
  into the same step only while the remaining token budget covers them. Smooth ITL, longer
  queueing for long prompts.
- ``chunked``: every step runs all running decodes, then prefill chunks (continuing partial
  prefills first, then new prompts) up to ``chunk_size_tokens`` prefill tokens per step and the
  token budget. Bounded step time.

Memory: blocks are taken for every token a step computes. When a running sequence cannot
grow, the most recently admitted running sequence is preempted by recompute (its blocks are
freed and it goes back to the front of the waiting queue with prompt + output so far).
Admission never preempts. ``max_running`` caps running sequences.

Prefix caching (a :class:`BlockManager` built with ``prefix_caching``): a sequence admitted
with nothing computed first takes its cached full blocks (:meth:`BlockManager.match_prefix`);
only the uncached tokens count for compute and the token budget, ``num_computed_tokens``
starts at the cached length (at least one token is left, so a logit exists), and every block
a step fills is indexed for later requests.

Threading: owned by the engine's step loop thread; not thread-safe.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from diag.engine.kv_cache import BlockManager, blocks_needed
from diag.engine.prefix_cache import NO_HIT
from diag.engine.sampler import SamplerState, SamplingParams

POLICIES: tuple[str, ...] = ("prefill-first", "decode-first", "chunked")


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

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} unknown; expected one of {', '.join(POLICIES)}")
        for name in ("chunk_size_tokens", "max_num_batched_tokens", "max_running", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")


class Scheduler:
    """Waiting queue + running list over one :class:`BlockManager`."""

    def __init__(self, cfg: SchedulerConfig, blocks: BlockManager) -> None:
        cfg.validate()
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions_total = 0

    # -- admission checks ----------------------------------------------------------------------

    def check_admissible(self, prompt_tokens: int, max_tokens: int) -> None:
        """RequestRejected (one line) when a request can never run here."""
        ctx = self.cfg.max_context_tokens
        if prompt_tokens < 1:
            raise RequestRejected("prompt is empty (0 tokens)")
        if prompt_tokens >= ctx:
            raise RequestRejected(
                f"prompt is {prompt_tokens} tokens; this model's maximum context length is {ctx} tokens"
            )
        if prompt_tokens + max_tokens > ctx:
            raise RequestRejected(
                f"this model's maximum context length is {ctx} tokens; you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the completion)"
            )
        need = blocks_needed(prompt_tokens + max_tokens, self.blocks.block_size)
        if need > self.blocks.num_blocks:
            raise RequestRejected(
                f"request needs {need} KV-cache blocks ({prompt_tokens} + {max_tokens} tokens) but the cache "
                f"holds {self.blocks.num_blocks}"
            )

    # -- queue changes -------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Append a new sequence to the waiting queue."""
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out (finish or abort) and free its blocks."""
        if seq.status is SeqStatus.RUNNING:
            try:
                self.running.remove(seq)
            except ValueError:
                pass
        elif seq.status is SeqStatus.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        seq.status = SeqStatus.FINISHED
        self.blocks.free(seq.seq_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)

    def _grow_or_preempt(self, seq: Sequence, total_tokens: int, plan: StepPlan) -> bool:
        """Make room for ``seq`` to hold ``total_tokens``, preempting newer running sequences.

        Returns False if ``seq`` itself had to be preempted.
        """
        while not self.blocks.can_grow(seq.seq_id, total_tokens):
            victim = self.running[-1]
            self._preempt(victim, plan)
            if victim is seq:
                return False
        self.blocks.allocate(seq.seq_id, total_tokens)
        return True

    # -- planning ------------------------------------------------------------------------------

    def _schedule_running(self, plan: StepPlan, budget: int, prefill_budget: int) -> tuple[int, int]:
        """Decodes (and, chunked, partial prefills) of running sequences; returns budgets left."""
        scheduled: set[int] = set()
        # decodes first, oldest first; growth may preempt newer sequences
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING or seq.num_pending_tokens != 1 or budget < 1:
                continue
            if self._grow_or_preempt(seq, seq.num_tokens, plan):
                plan.items.append(ScheduledSeq(seq, seq.num_computed_tokens, 1, is_prefill=False))
                scheduled.add(id(seq))
                budget -= 1
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING or id(seq) in scheduled or seq.num_pending_tokens <= 1:
                continue
            n = min(seq.num_pending_tokens, budget, prefill_budget)
            if n < 1:
                break
            if self._grow_or_preempt(seq, seq.num_computed_tokens + n, plan):
                plan.items.append(ScheduledSeq(seq, seq.num_computed_tokens, n, is_prefill=True))
                budget -= n
                prefill_budget -= n
        # a preempted sequence cannot stay in this step's plan
        if plan.preempted:
            gone = {id(s) for s in plan.preempted}
            plan.items = [i for i in plan.items if id(i.seq) not in gone]
        return budget, prefill_budget

    def _admit(self, plan: StepPlan, budget: int, prefill_budget: int, allow_partial: bool, allow_oversize: bool) -> None:
        """Move waiting sequences into running, FIFO, while budget, blocks and max_running allow."""
        preempted_now = {id(s) for s in plan.preempted}
        while self.waiting and len(self.running) < self.cfg.max_running:
            seq = self.waiting[0]
            if id(seq) in preempted_now:
                break
            need = seq.num_pending_tokens
            hit = NO_HIT  # prefix caching: cached blocks count neither as compute nor budget
            if self.blocks.prefix_cache is not None and seq.num_computed_tokens == 0:
                hit = self.blocks.match_prefix(seq.seq_id, seq.token_slice(0, seq.num_tokens))
                need -= hit.num_tokens
            n = min(need, budget, prefill_budget)
            if n < need and not allow_partial:
                if not (allow_oversize and not plan.items and not self.running):
                    break
                n = need  # a lone prompt larger than the budget still runs, alone
            if n < 1:
                break
            start = seq.num_computed_tokens + hit.num_tokens
            if not self.blocks.can_grow(seq.seq_id, start + n, hit):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq.seq_id, start + n, hit)
            if self.blocks.prefix_cache is not None and seq.num_computed_tokens == 0:
                self.blocks.prefix_cache.record_lookup(seq.num_tokens, hit)
                if seq.preemptions == 0:
                    seq.num_cached_tokens = hit.num_tokens
            seq.num_computed_tokens = start
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            plan.items.append(ScheduledSeq(seq, seq.num_computed_tokens, n, is_prefill=True))
            budget -= n
            prefill_budget -= n

    def schedule(self) -> StepPlan:
        """Plan the next step (mutates queues and block tables). An empty plan means idle."""
        plan = StepPlan()
        budget = self.cfg.max_num_batched_tokens
        policy = self.cfg.policy
        if policy == "prefill-first":
            self._admit(plan, budget, budget, allow_partial=False, allow_oversize=True)
            if plan.items:
                return plan
            self._schedule_running(plan, budget, 0)
        elif policy == "decode-first":
            budget, _ = self._schedule_running(plan, budget, 0)
            self._admit(plan, budget, budget, allow_partial=False, allow_oversize=True)
        else:  # chunked
            budget, prefill_budget = self._schedule_running(plan, budget, self.cfg.chunk_size_tokens)
            self._admit(plan, budget, prefill_budget, allow_partial=True, allow_oversize=False)
        return plan

    def on_step_done(self, item: ScheduledSeq) -> None:
        """Record that ``item``'s tokens are now in the cache (call before appending a sampled token)."""
        item.seq.num_computed_tokens = item.start_pos + item.num_new_tokens
        self.blocks.cache_full_blocks(item.seq.seq_id, item.seq.num_computed_tokens, item.seq.token_slice)
