"""What the users send, as ``ttft diagnose --workload`` takes it: lengths only, never text.

``ttft diagnose`` designs its own load, so some of what it measures holds for the server but not
necessarily for its users: that a repeated prefix is prefilled again matters only if their
prompts share one; that a short prompt waits behind a long one's prefill only if their prompt
lengths mix. When the user says what their prompts are like, those findings are judged for them
(measured) instead of conditional. Spec: comma-separated ``key=value``::

    prompt_tokens=MIN-MAX   the users' shortest and longest prompt (tokens); one number: all alike
    shared_prefix=N         tokens their prompts share at the start (a system prompt); 0: none
    concurrency=N           the most requests they have in flight at once: the verdict's "nothing
                            waits" is judged at that load; the ramp still finds the capacity above it
    response_format=schema  they send structured output with JSON schemas (``json``: json_object;
                            ``none``): the grammar follow-up tests a schema's first use against repeats
    lora=A+B+...            the LoRA adapters they ask for, by the names the server serves: the LoRA
                            follow-up tests requests for an adapter not in flight against the others

Recorded in the capture's ``meta.json`` as ``users_workload`` (the rules read it there). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEYS = ("prompt_tokens", "shared_prefix", "concurrency", "response_format", "lora")
RESPONSE_FORMATS = ("none", "json", "schema")


@dataclass(frozen=True)
class UsersWorkload:
    """The users' prompt lengths (tokens, inclusive), the prefix they share (tokens) and the most
    requests they keep in flight; None: not said."""

    prompt_tokens: tuple[int, int] | None = None
    shared_prefix_tokens: int | None = None
    concurrency: int | None = None
    #: what structured output they ask for: "none", "json" or "schema"; None: not said
    response_format: str | None = None
    #: the LoRA adapters they ask for (the server's model names); empty: not said
    lora: tuple[str, ...] = ()

    def to_meta(self) -> dict[str, Any]:
        """The ``meta.json`` ``users_workload`` block (only what was said)."""
        out: dict[str, Any] = {}
        if self.prompt_tokens is not None:
            out["prompt_tokens"] = list(self.prompt_tokens)
        if self.shared_prefix_tokens is not None:
            out["shared_prefix_tokens"] = self.shared_prefix_tokens
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        if self.response_format is not None:
            out["response_format"] = self.response_format
        if self.lora:
            out["lora"] = list(self.lora)
        return out

    @property
    def typical_prompt_tokens(self) -> int | None:
        """The middle of the users' prompt lengths (tokens), None when not said."""
        if self.prompt_tokens is None:
            return None
        lo, hi = self.prompt_tokens
        return max(1, round((lo + hi) / 2))

    def describe(self) -> str:
        parts = []
        if self.prompt_tokens is not None:
            lo, hi = self.prompt_tokens
            parts.append(f"prompts of {lo} tokens" if lo == hi else f"prompts of {lo}-{hi} tokens")
        if self.shared_prefix_tokens is not None:
            parts.append(f"a shared prefix of {self.shared_prefix_tokens} tokens" if self.shared_prefix_tokens
                         else "no shared prefix")
        if self.concurrency is not None:
            parts.append(f"up to {self.concurrency} in flight")
        if self.response_format is not None:
            parts.append({"none": "no structured output", "json": "JSON output (json_object)",
                          "schema": "JSON-schema output"}[self.response_format])
        if self.lora:
            parts.append(f"LoRA adapters {', '.join(self.lora)}")
        return ", ".join(parts) or "not given"


def _int(key: str, text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        what = "requests" if key == "concurrency" else "tokens"
        raise ValueError(f"--workload {key}={text}: expected a whole number of {what}") from None
    if v < 0:
        raise ValueError(f"--workload {key}={text}: must be >= 0")
    return v


def parse_users_workload(spec: str) -> UsersWorkload:
    """``prompt_tokens=MIN-MAX,shared_prefix=N,concurrency=N`` -> :class:`UsersWorkload`; ValueError
    with one line."""
    prompt: tuple[int, int] | None = None
    prefix: int | None = None
    concurrency: int | None = None
    response_format: str | None = None
    lora: tuple[str, ...] = ()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in KEYS:
            raise ValueError(f"--workload {part}: expected key=value with key one of {', '.join(KEYS)}")
        if key == "prompt_tokens":
            lo_s, dash, hi_s = value.partition("-")
            lo = _int(key, lo_s)
            hi = _int(key, hi_s) if dash else lo
            if lo < 1 or hi < lo:
                raise ValueError(f"--workload prompt_tokens={value}: expected MIN-MAX with 1 <= MIN <= MAX")
            prompt = (lo, hi)
        elif key == "response_format":
            if value not in RESPONSE_FORMATS:
                raise ValueError(f"--workload response_format={value}: expected one of {', '.join(RESPONSE_FORMATS)}")
            response_format = value
        elif key == "lora":
            lora = tuple(n.strip() for n in value.split("+"))
            if not all(lora) or len(set(lora)) != len(lora):
                raise ValueError(f"--workload lora={value}: expected adapter names joined by + (each once)")
        elif key == "concurrency":
            concurrency = _int(key, value)
            if concurrency < 1:
                raise ValueError(f"--workload concurrency={value}: must be >= 1")
        else:
            prefix = _int(key, value)
    return UsersWorkload(prompt, prefix, concurrency, response_format, lora)


def ramp_prompt_tokens(workload: UsersWorkload | None, given: int | None, default: int) -> int:
    """The prompt (tokens) of ttft diagnose's baseline and load ramp: ``given`` (``--input-tokens``)
    when said; else ``default``, or the users' typical prompt (``--workload prompt_tokens``) when
    theirs is shorter. A ramp on longer prompts than the users send puts prompt work (a tokenizer, a
    prefill) under load that their requests never carry, and its break is then no break of theirs;
    longer prompts than the default are the ladder's and the long ramp's to measure."""
    if given is not None:
        return given
    typical = workload.typical_prompt_tokens if workload is not None else None
    return min(default, typical) if typical is not None else default


__all__ = ["UsersWorkload", "parse_users_workload", "ramp_prompt_tokens"]
