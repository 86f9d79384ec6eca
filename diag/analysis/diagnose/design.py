"""The settings and the step type of ``ttft diagnose``'s design: :class:`PlanConfig` (what the
plan works within, and the break lines it reads from the rules' thresholds), :class:`Step` (one
step to run, as a catalog :class:`~diag.analysis.scenarios.catalog.ProbeStep`), :class:`Decision`, and
small readings of :class:`~diag.analysis.diagnose.points.Point` s shared by the ladder and the ramp.
Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.analysis.diagnose.points import Point
from diag.analysis.scenarios.catalog import ProbeStep
from rules import default_thresholds



#: the prompt of the baseline and the ramp unless --input-tokens says, or the users' are shorter (tokens)
DEFAULT_INPUT_TOKENS = 64


@dataclass(frozen=True)
class PlanConfig:
    """What the plan works within. Lengths in tokens; ``budget_s`` of probing; ``ramp`` is
    ``"concurrency"`` (closed loop) or ``"rate"`` (open loop, capped at ``max_concurrency``)."""

    input_tokens: int = DEFAULT_INPUT_TOKENS
    output_tokens: int = 32
    max_concurrency: int = 32
    max_prompt_tokens: int = 4096
    context_limit_tokens: int | None = None
    budget_s: float = 120.0
    max_requests: int = 1000
    ramp: str = "concurrency"
    baseline_requests: int = 8
    rung_requests: int = 4
    #: the users' tightest ITL target (s; from ``--slo itl_pNN``), None when none is given
    itl_target_s: float | None = None
    #: the prefix the users' prompts share (tokens; ``--workload shared_prefix``; 0: none), None: not said
    users_shared_prefix_tokens: int | None = None
    #: the users' structured output (``--workload response_format``: "none", "json", "schema"), None: not said
    users_response_format: str | None = None
    #: the LoRA adapters the users ask for (``--workload lora``); empty: not said
    users_lora: tuple[str, ...] = ()
    #: the grammar follow-up's schema: the users' own (``--schema FILE``), else a generated one of
    #: ``schema_properties`` fields (``--schema-properties``)
    schema_file: str | None = None
    schema_properties: int = 24
    thresholds: Mapping[str, Any] = field(default_factory=default_thresholds)

    def __post_init__(self) -> None:
        if self.ramp not in ("concurrency", "rate"):
            raise ValueError(f"unknown ramp {self.ramp!r}: expected concurrency or rate")
        for name in ("input_tokens", "output_tokens", "max_concurrency", "max_prompt_tokens", "max_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.budget_s <= 0:
            raise ValueError("budget must be > 0 s")

    # the break lines, from the rules' thresholds (full strength = twice the threshold)
    @property
    def ttft_break_x(self) -> float:
        """TTFT at a level / the lone request's, at which the ramp has seen enough."""
        return 2.0 * float(self.thresholds["queue"]["bb_ttft_rise_min"])

    @property
    def decode_break_x(self) -> float:
        """Per-stream time per token at a level / the lone stream's, at which decode broke."""
        return 1.0 / float(self.thresholds["decode"]["decode_hold_max"])

    @property
    def knee_x(self) -> float:
        return float(self.thresholds["kv_cache"]["knee_jump_min"])

    @property
    def flat_x(self) -> float:
        return float(self.thresholds["features"]["flat_factor"])

    @property
    def long_prompt_tokens(self) -> int:
        """The prompt of the long ramp: :data:`LONG_PROMPT_X` x :attr:`step_base_tokens`, below the limit."""
        return int(min(LONG_PROMPT_X * self.step_base_tokens, self.prompt_limit_tokens))

    @property
    def step_base_tokens(self) -> int:
        """What the ladder doubles from and the long ramp multiplies: the ramp's prompt, at least
        :data:`DEFAULT_INPUT_TOKENS`. A ramp on the users' very short prompts keeps the ladder's and
        the long ramp's lengths: rungs of a few dozen tokens would measure the fixed part only, and
        a long ramp of them leaves each request holding mostly its answer."""
        return max(self.input_tokens, DEFAULT_INPUT_TOKENS)

    @property
    def prompt_limit_tokens(self) -> int:
        """The longest prompt the ladder may send: below the context limit, room for the output."""
        top = self.max_prompt_tokens
        if self.context_limit_tokens:
            top = min(top, self.context_limit_tokens - self.output_tokens - 8)
        return top


#: ``long`` follow-up: its prompts are this many times the ramp's (more tokens held per request)
LONG_PROMPT_X = 4
#: ``longout`` follow-up: the long prompt with longer answers, at this many in flight
LONG_OUT_CONCURRENCY = 8

#: ``mixed`` follow-up: every this-many-th request carries the long prompt, at this many in flight
MIXED_EVERY = 4
MIXED_CONCURRENCY = 4

#: ``prefix`` follow-up: uses of each fresh prefix (the first and R - 1 repeats), then one control
PREFIX_REPEATS = 3
#: ``grammar`` follow-up: uses of each fresh JSON schema (the probe's --response-format schema:R), one at a time
GRAMMAR_USES = 4
#: ``lora`` follow-up: requests in flight (at most --max-concurrency), asking for one of the users'
#: adapters, then for one of all of them
LORA_CONCURRENCY = 4


@dataclass(frozen=True)
class Step:
    """One step to run: ``kind`` as :data:`diag.analysis.diagnose.points.KINDS`, ``value`` the prompt
    length, concurrency, rate or shared-prefix tokens, ``stage`` the part of the design, ``reason``
    the printed why."""

    kind: str
    value: float
    requests: int
    stage: str
    reason: str

    def probe_step(self, cfg: PlanConfig) -> ProbeStep:
        """The step as a catalog :class:`ProbeStep`, run through the scenario runner's translation
        (:func:`diag.analysis.scenarios.runner.step_chunks`), as the demo's phases are."""
        out = f"fixed:{cfg.output_tokens}"
        inp = f"fixed:{cfg.input_tokens}"
        if self.kind == "baseline":
            return ProbeStep(concurrency=1, requests=self.requests, input_tokens=inp, output_tokens=out,
                             segment=segment_of(self.kind, self.value))
        if self.kind == "long":  # the long ramp: closed loop at the long prompt
            return ProbeStep(concurrency=int(self.value), requests=self.requests,
                             input_tokens=f"fixed:{cfg.long_prompt_tokens}", output_tokens=out,
                             segment=segment_of(self.kind, self.value))
        if self.kind == "longout":  # the long prompt again, answers of ``value`` tokens: longer decode windows
            return ProbeStep(concurrency=min(LONG_OUT_CONCURRENCY, cfg.max_concurrency), requests=self.requests,
                             input_tokens=f"fixed:{cfg.long_prompt_tokens}", output_tokens=f"fixed:{int(self.value)}",
                             segment=segment_of(self.kind, self.value))
        if self.kind == "mixed":  # short streams with a long prompt among them (the probe's --inject-long);
            # outputs of mixed lengths, so the streams end apart and a long prompt meets streams mid-way
            # (equal ones end in lockstep, and the closed loop then sends the next round all at once)
            o = cfg.output_tokens
            return ProbeStep(concurrency=min(MIXED_CONCURRENCY, cfg.max_concurrency), requests=self.requests,
                             input_tokens=inp, output_tokens=f"uniform:{max(1, o // 2)}-{max(1, 3 * o // 2)}",
                             segment=segment_of(self.kind, self.value),
                             inject_long=(int(self.value), MIXED_EVERY))
        if self.kind == "grammar":  # one at a time: groups of a fresh schema, its first use and repeats
            return ProbeStep(concurrency=1, requests=self.requests, input_tokens=inp, output_tokens=out,
                             segment=segment_of(self.kind, self.value), response_format=f"schema:{int(self.value)}",
                             schema_properties=cfg.schema_properties, schema_file=cfg.schema_file)
        if self.kind == "lora":  # the first ``value`` of the users' adapters, one drawn per request, a few in flight
            return ProbeStep(concurrency=min(LORA_CONCURRENCY, cfg.max_concurrency), requests=self.requests,
                             input_tokens=inp, output_tokens=out, segment=segment_of(self.kind, self.value),
                             lora=cfg.users_lora[: int(self.value)])
        if self.kind == "prefix":  # one at a time: groups of a fresh prefix, its repeats and a control
            return ProbeStep(concurrency=1, requests=self.requests,
                             input_tokens=f"fixed:{int(self.value) + cfg.input_tokens}", output_tokens=out,
                             segment=segment_of(self.kind, self.value),
                             shared_prefix=(int(self.value), PREFIX_REPEATS))
        return ProbeStep(sweep=self.kind, sweep_values=(self.value,), requests_per_point=self.requests,
                         input_tokens=inp, output_tokens=out)

    def chosen_prompt_tokens(self, cfg: PlanConfig) -> int | None:
        """The longest prompt (tokens) this step sends at a length the design chose past the users'
        own (a ladder rung, the long ramp's, the mixed follow-up's long one, a prefix and its
        suffix), or None for the baseline and the ramp, which send the users' length: a refusal
        of a chosen length as longer than the context is the experiment's limit, one of the
        users' length a failure."""
        if self.kind in ("prompt", "mixed"):
            return int(self.value)
        if self.kind in ("long", "longout"):
            return cfg.long_prompt_tokens
        if self.kind == "prefix":
            return int(self.value) + cfg.input_tokens
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "requests": self.requests, "stage": self.stage,
                "reason": self.reason}


def segment_of(kind: str, value: float) -> str:
    """The capture segment of a step: the baseline is the ramp's first level (``concurrency=1``),
    so the rules see it as a point of the concurrency curve; the others as ``ttft probe --sweep``
    labels them."""
    return "concurrency=1" if kind == "baseline" else f"{kind}={value:g}"


@dataclass(frozen=True)
class Decision:
    """The plan's answer: the next step, or None with ``done`` saying why the design ended."""

    step: Step | None
    done: str | None = None
    learned: dict[str, Any] = field(default_factory=dict)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def base_point(points: Sequence[Point]) -> Point | None:
    return next((p for p in points if p.kind == "baseline"), None)


def tokens_of(p: Point, cfg: PlanConfig) -> float:
    return p.input_tokens_mean or (p.value if p.kind == "prompt" else float(cfg.input_tokens))


def steps_of(p: Point) -> str:
    n = ratio(p.ttft_p50_s, p.itl_p50_s)
    return f" = {n:.1f} decode steps" if n is not None else ""


__all__ = ["DEFAULT_INPUT_TOKENS", "Decision", "LONG_OUT_CONCURRENCY", "LONG_PROMPT_X", "MIXED_CONCURRENCY", "MIXED_EVERY", "PlanConfig", "Step", "base_point", "ratio", "segment_of", "steps_of", "tokens_of"]
