"""Token sampling: greedy, temperature, top-k, top-p (nucleus), per-request seeds, token masks
(structured output); stop rules.

Threading: :func:`sample` runs on the engine's step loop thread; each request's
``torch.Generator`` lives in its :class:`SamplerState` and is only touched there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

MAX_TOKENS_LIMIT = 1 << 20


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks for. ``temperature == 0`` means greedy; ``top_k <= 0`` means off."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False

    def validate(self) -> None:
        """Raise ValueError with a one-line message naming the bad field."""
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.max_tokens > MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens must be <= {MAX_TOKENS_LIMIT}, got {self.max_tokens}")
        if not (0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class SamplerState:
    """Per-request sampling state: the seeded generator (created on first use)."""

    params: SamplingParams
    default_seed: int
    _gen: torch.Generator | None = field(default=None, repr=False)

    @classmethod
    def resume(cls, params: SamplingParams, default_seed: int, generator: torch.Generator | None) -> "SamplerState":
        """A state that continues where another process's left off (``generator``: its state, or None
        when it had drawn nothing yet)."""
        return cls(params, default_seed, generator)

    def generator_if_started(self) -> torch.Generator | None:
        """The generator when a draw created it, else None (greedy requests never create one)."""
        return self._gen

    def generator(self) -> torch.Generator:
        if self._gen is None:
            self._gen = torch.Generator().manual_seed(
                self.params.seed if self.params.seed is not None else self.default_seed
            )
        return self._gen


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature-scaled logits ``[vocab]`` with everything outside top-k / top-p set to -inf."""
    x = logits / max(temperature, 1e-5)
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, idx = torch.sort(x, descending=True)
        probs = sorted_x.softmax(-1)
        cum = probs.cumsum(-1)
        # drop a token when the mass before it already reaches top_p (always keep the first)
        drop = (cum - probs) >= top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(0, idx, sorted_x)
    return x


def apply_masks(logits: torch.Tensor, masks: Sequence[Any]) -> torch.Tensor:
    """A copy of ``logits`` ``[n, vocab]`` with each row's disallowed tokens at -inf; ``masks[i]``
    is a bool array ``[vocab]`` (numpy or torch; True = allowed) or None (row unconstrained)."""
    out = logits.float().clone()
    for i, m in enumerate(masks):
        if m is not None:
            allowed = torch.as_tensor(m, dtype=torch.bool).to(out.device)
            out[i].masked_fill_(~allowed, float("-inf"))
    return out


def sample(logits: torch.Tensor, states: Sequence[SamplerState], masks: Sequence[Any] | None = None) -> list[int]:
    """One token id per row of ``logits`` ``[n, vocab]`` (float32, any device); ``masks`` (one per
    row or None) restrict a row to its allowed tokens (structured output, :func:`apply_masks`)."""
    if masks is not None:
        logits = apply_masks(logits, masks)
    out: list[int] = []
    if all(s.params.greedy for s in states):
        return logits.argmax(-1).tolist()
    cpu = logits.float().cpu()
    for row, st in zip(cpu, states):
        p = st.params
        if p.greedy:
            out.append(int(row.argmax()))
            continue
        probs = filter_logits(row, p.temperature, p.top_k, p.top_p).softmax(-1)
        out.append(int(torch.multinomial(probs, 1, generator=st.generator())))
    return out


def stop_reason(
    token_id: int, num_output_tokens: int, total_tokens: int, params: SamplingParams, eos_ids: frozenset[int], max_context_tokens: int
) -> str | None:
    """``"stop"`` on EOS, ``"length"`` at max_tokens or the context limit, else None."""
    if not params.ignore_eos and token_id in eos_ids:
        return "stop"
    if num_output_tokens >= params.max_tokens or total_tokens >= max_context_tokens:
        return "length"
    return None
