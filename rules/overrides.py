"""Which finding overrides which: a declared table (winner, losers, why), applied by one loop.

A row's *winner* is a finding's category (it applies when that finding fired) or a state of
the diagnosis:

* ``"slo_ttft_met"`` — the TTFT SLOs are met and another SLO is broken (the article's
  "TTFT fine, ITL bad" row);
* ``"ttft_strong"`` — a TTFT finding at least ``general.strong_confidence`` sure (TTFT is not
  fine), unless a TTFT SLO is met; the winner is the first such finding;
* ``"ttft_not_fine"`` — ``ttft_strong``, or a TTFT SLO broken;
* ``"slo_all_met"`` — every SLO given is met.

Each loser (a finding whose category, or the :class:`rules.registry.Kind` of time that category
explains, is in ``losers``) is demoted (confidence x
``general.demote_factor``, ``demoted_by`` and a note saying ``why``) and/or pushed down to at
least ``tier``; a row may spare losers that stand without client timing (:func:`timing_free`). Rows apply in order and each winner is judged when its row applies, so a row
sees the demotions of the rows above it. Runs on the engine's thread, on its own findings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rules import evidence
from rules.model import Finding
from rules.registry import Kind, kind_of

#: the server's causes: every category of TTFT or ITL time
_SERVER: frozenset[str | Kind] = frozenset({Kind.TTFT, Kind.ITL})
#: keys of rows whose numbers do not depend on when the client read its chunks: counts of streams
#: decoding at once (answers start and end together when a late client shifts them)
TIMING_FREE_ROWS: frozenset[str] = frozenset({evidence.LONG_RAMP_SHIFT, evidence.LONG_RAMP_CAP})


#: causes whose evidence holds the client's timing even with the server's joined: the client-server
#: gap (network, a front end's gap by load) and the token gaps the client read (decode)
CLIENT_TIMED: frozenset[str] = frozenset({"network", "frontend", "decode"})


def timing_free(f: Finding) -> bool:
    """Whether ``f`` stands without client timing: measured by the server (its spans, its /metrics)
    and not from the client-server gap (:data:`CLIENT_TIMED`), or on a row that counts streams
    rather than timing them (:data:`TIMING_FREE_ROWS`)."""
    return (not f.black_box and f.category not in CLIENT_TIMED) or any(e.key in TIMING_FREE_ROWS for e in f.evidence)


@dataclass(frozen=True)
class Override:
    """One row: when ``winner`` holds, every finding of a ``losers`` category is demoted and/or re-tiered
    (``losers`` names categories, and kinds that stand for every category of that kind)."""

    winner: str
    losers: frozenset[str | Kind]
    why: str
    demote: bool = True
    tier: int | None = None  #: losers rank at this tier or later
    black_box_only: bool = False  #: only losers inferred from client timing (Finding.black_box)
    winner_row: str | None = None  #: a finding winner counts only when it carries the evidence row of this key
    spare_timing_free: bool = False  #: losers that stand without client timing (:func:`timing_free`) are spared

    def loses(self, f: Finding) -> bool:
        """Whether ``f``'s category is one of ``losers``, by name or by its kind."""
        return f.category in self.losers or kind_of(f.category) in self.losers


OVERRIDES: tuple[Override, ...] = (
    # the load generator: the server-blaming findings read from client timing are unreliable; what the
    # server measured, and counts of streams, stand
    Override("loadgen", _SERVER, "the load generator was saturated, so this server-side blame is unreliable",
             spare_timing_free=True),
    # waiting for KV blocks is queue time: the KV finding owns it
    Override("kv_cache", frozenset({"queue"}), "the queue time here is waiting for KV-cache space (see kv_cache)"),
    # from the client, TTFT that grows with the prompt is prefill at one request in flight; under load
    # a KV limit makes longer prompts wait for others to end: the KV finding owns that time
    Override("kv_cache", frozenset({"prefill_compute"}),
             "under load, longer prompts wait here for KV-cache space (see kv_cache), beyond their own prefill",
             black_box_only=True, winner_row=evidence.LONG_RAMP_SHIFT),
    # ... and so does a limit in requests the long ramp showed (at most N decode at once at any length)
    Override("queue", frozenset({"prefill_compute"}),
             "under load, requests wait here to be admitted (see queue: a limit in requests), beyond their own prefill",
             black_box_only=True, winner_row=evidence.LONG_RAMP_SHIFT),
    # queue time that free capacity could have served: admission order / reservations own it
    Override("head_of_line", frozenset({"queue", "kv_reservation"}),
             "the queue time here is short requests held behind long prompts ahead of them (see head_of_line)"),
    # from the client, TTFT that grows with the prompt is prefill compute, a cost every prompt pays; short
    # prompts that wait for a long one's whole prefill pay another's: the scheduler's order owns that time
    Override("head_of_line", frozenset({"prefill_compute"}),
             "short prompts here wait for a long prompt's whole prefill ahead of them, beyond their own (see "
             "head_of_line)", black_box_only=True),
    # prefill stretched by idle pipeline stages: the bubble owns that prefill time
    Override("pipeline_bubble", frozenset({"prefill_compute"}),
             "the prefill time here is pipeline stages idling while the pipeline fills and drains (see pipeline_bubble)"),
    # prefill of a prefix the cache should have served: the misses own that prefill time
    Override("prefix_cache", frozenset({"prefill_compute"}),
             "the prefill time here is a shared prefix computed again on every repeat (see prefix_cache)"),
    Override("kv_reservation", frozenset({"queue"}),
             "the queue time here is waiting for KV reservations while blocks are free (see kv_reservation)"),
    # the wait was before the engine: its queue was empty, the gap that grew with load was not the network
    Override("frontend", frozenset({"queue", "network"}),
             "the time is spent before the engine sees the request, in its front end (see frontend)"),
    # from the client, requests waiting behind a slow (serial) tokenizer look like a queue: the
    # inferred queue is demoted, not one the engine measured
    Override("tokenize", frozenset({"queue"}), "TTFT rising with load here can be requests waiting behind the slow "
             "tokenizer (see tokenize): from the client the two look alike", black_box_only=True),
    # the engine's loop idle between steps: requests queue for a step that has not started, tokens wait
    # for the next step; the loop's overhead owns that time
    Override("engine_overhead", frozenset({"queue", "decode"}),
             "the time here is the engine's step loop idle between steps (see engine_overhead)"),
    # requests parked until their grammar compiles: the queue time is the compile's, the loop has
    # nothing to step while they wait, and waiting with KV low and batch slots free is what a
    # reservation looks like too
    Override("grammar_compile", frozenset({"queue", "engine_overhead", "kv_reservation"}),
             "the time here is requests waiting for their grammar to compile (see grammar_compile)"),
    # requests deferred until their adapter has a slot: that queue time is the adapters'
    # (requests deferred while KV and the batch have room look like a reservation: the deferral owns it)
    Override("lora_adapters", frozenset({"queue", "kv_reservation"}),
             "the time here is requests waiting for a LoRA adapter slot (see lora_adapters)"),
    # the decode side's admission wait is a queue span: the hand-off owns it; a KV pool that holds it up
    # is the decode instance's, which the admission finding names
    Override("pd_transfer", frozenset({"queue"}),
             "the queue time here is the decode instance admitting requests after their KV arrived (see pd_transfer)"),
    Override("pd_transfer", frozenset({"kv_cache"}),
             "the KV pool that holds requests here is the decode instance's, after their transfer (see pd_transfer)",
             winner_row=evidence.PD_ADMISSION_SHARE),
    # ITL spikes explained by prefills are not a decode problem
    Override("interference", frozenset({"decode"}), "the slow tokens are stalls behind other requests' prefills"),
    # TTFT findings say where TTFT goes, not what is wrong; the broken (ITL) SLO's findings come first
    Override("slo_ttft_met", frozenset({Kind.TTFT}), "TTFT meets its SLO: this is where TTFT goes, not the problem",
             tier=3),
    Override("ttft_not_fine", frozenset({"decode"}), "TTFT is not fine, so slow tokens are not the main story"),
    # TTFT is not fine: ITL findings come after the TTFT ones
    Override("ttft_strong", frozenset({Kind.ITL}), "TTFT is not fine: ITL findings rank after the TTFT ones",
             demote=False, tier=3),
    Override("slo_all_met", _SERVER, "every SLO given is met: this is where the time goes, not a problem"),
)


def demote(f: Finding, by: str, why: str, factor: float) -> None:
    """Lower ``f``'s confidence by ``factor``, record who did it and why."""
    f.confidence = round(f.confidence * factor, 3)
    f.demoted_by.append(by)
    f.add_note(f"demoted: {why}")


def winner(name: str, findings: list[Finding], all_met: bool | None, ttft_met: bool | None,
           strong: float, row: str | None = None) -> str | None:
    """Who wins row ``name`` now (the ``demoted_by`` name), or None when the row does not apply;
    ``row``: a finding winner must carry the evidence row of this key (:mod:`rules.evidence`)."""
    if kind_of(name) is not None:  # a rule's category; a conditional finding (the tool's own test) overrides nothing
        return name if any(f.category == name and not f.conditional
                           and (row is None or any(e.key == row for e in f.evidence)) for f in findings) else None
    if name == "slo_ttft_met":
        return "slo" if ttft_met and not all_met else None
    if name in ("ttft_strong", "ttft_not_fine"):
        bad = [] if ttft_met else [f for f in findings if kind_of(f.category) is Kind.TTFT and f.confidence >= strong]
        if bad:
            return bad[0].category
        return "slo" if name == "ttft_not_fine" and ttft_met is False else None
    if name == "slo_all_met":
        return "slo" if all_met else None
    raise ValueError(f"unknown override winner {name!r}")


def rank_after_winners(findings: list[Finding]) -> None:
    """Move each finding demoted by another one present to just after it, in place (``findings``
    already ranked): the winner of an override owns the time, so its loser never ranks above it,
    whatever their tiers and scores."""
    for _ in range(len(findings)):  # a chain of demotions settles in at most this many passes
        moved = False
        for f in list(findings):
            at = [i for i, g in enumerate(findings) if g is not f and g.category in f.demoted_by]
            if at and findings.index(f) < max(at):
                findings.remove(f)
                findings.insert(max(at), f)  # the winner moved up by one when f left
                moved = True
        if not moved:
            return


def apply_overrides(findings: list[Finding], all_met: bool | None, ttft_met: bool | None,
                    general: Mapping[str, Any], table: tuple[Override, ...] = OVERRIDES) -> None:
    """Apply ``table`` to ``findings`` in place (``all_met``/``ttft_met``: the SLO state, None when none applies)."""
    factor = float(general["demote_factor"])
    strong = float(general["strong_confidence"])
    for row in table:
        by = winner(row.winner, findings, all_met, ttft_met, strong, row.winner_row)
        if by is None:
            continue
        for f in findings:
            if not row.loses(f) or (row.black_box_only and not f.black_box):
                continue
            if row.spare_timing_free and timing_free(f):
                continue
            if row.demote:
                demote(f, by, row.why, factor)
            if row.tier is not None:
                f.tier = max(f.tier, row.tier)
