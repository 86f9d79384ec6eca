"""Workloads for the probe: synthetic prompts of given token lengths, or a user JSONL file.

Length specs (input and output tokens): ``N`` or ``fixed:N``, ``uniform:A-B`` (inclusive),
``normal:MEAN,STD`` (rounded, clipped to >= 1).

Synthetic prompts start with a per-request nonce and random words so that a server's prefix
cache cannot hide prefill; ``shared_prefix_tokens`` puts a deliberate, identical prefix in
front of every prompt. With ``shared_prefix_repeats`` R (``--shared-prefix N:R``) the prompts
come in groups instead, so that a client alone can see whether a prefix cache works: a fresh
N-token prefix (its own nonce first) and suffix (``first``), the same prefix with R - 1 other
suffixes (``repeat``), then one prompt of the suffix's length alone (``control``: what a repeat
costs when its prefix is cached). Each item says its role and prefix length
(:attr:`PromptItem.prefix_role`), which the client records on its span (never the text). Prompt lengths are built with the user's tokenizer when one is given
(``tokenizers`` ``tokenizer.json``), otherwise from a words-per-token estimate; the capture
says which (``prompt_length_method``). A chat template adds a few tokens on the server side.

Threading: a :class:`Workload` is used by one thread (the event loop that draws from it).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collectors.probe.schemas import ResponseFormatSpec, SchemaDraws
from diag.ground.capture import CaptureError

#: Short common English words, each one BPE token (with its leading space) in the GPT-2,
#: Llama and Qwen vocabularies, so that one word ~ one token without a tokenizer.
_WORDS: tuple[str, ...] = tuple(
    """the of and to in is was for on that with as by at from his her an be this are were
    which or had not but have one all their they has more its also new after first two
    been other who when would time there can only into over some out world these year
    school city most many such between during about most state three film made later then
    under where since well both known while team same life part high use each several
    family name those early last being work four long people group south north east west
    house music found much game off five small three place area home water book could
    point day week line end set left right hand power great young back old war man woman
    light road river town field land sea air fire king stone tree bird horse car ship
    open close start stop turn run walk talk read write speak hear see look find give take
    make come go know think feel keep bring hold stand sit play move live show try ask call
    red blue green black white gold silver brown gray dark bright cold warm hot clean fast
    slow hard soft loud quiet rich poor strong weak full empty near far deep wide thin
    thick round flat sharp sweet sour bitter fresh safe free busy happy sad calm proud""".split()
)
#: Words per token when no tokenizer is given (the vocabulary above is one token a word).
WORDS_PER_TOKEN_ESTIMATE = 1.0


class WorkloadError(CaptureError):
    """A bad workload spec or prompts file (one line naming the spec or file:line)."""


# --- length specs ---------------------------------------------------------------------------

_FIXED = re.compile(r"^(?:fixed:)?(\d+)$")
_UNIFORM = re.compile(r"^uniform:(\d+)-(\d+)$")
_NORMAL = re.compile(r"^normal:(\d+(?:\.\d+)?),(\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class LengthSpec:
    """A token-length distribution: ``kind`` is fixed | uniform | normal."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str | int) -> LengthSpec:
        """Parse ``fixed:N`` / ``N`` / ``uniform:A-B`` / ``normal:MEAN,STD`` (raises WorkloadError)."""
        s = str(spec).strip().replace(" ", "")
        if m := _FIXED.match(s):
            n = int(m.group(1))
            if n < 1:
                raise WorkloadError(f"length spec {spec!r}: must be >= 1")
            return cls("fixed", n)
        if m := _UNIFORM.match(s):
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo < 1 or hi < lo:
                raise WorkloadError(f"length spec {spec!r}: need 1 <= A <= B in uniform:A-B")
            return cls("uniform", lo, hi)
        if m := _NORMAL.match(s):
            mean, std = float(m.group(1)), float(m.group(2))
            if mean < 1:
                raise WorkloadError(f"length spec {spec!r}: mean must be >= 1")
            return cls("normal", mean, std)
        raise WorkloadError(
            f"bad length spec {spec!r}: expected N, fixed:N, uniform:A-B or normal:MEAN,STD"
        )

    def sample(self, rng: random.Random) -> int:
        """One length in tokens (>= 1)."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return max(1, int(round(rng.gauss(self.a, self.b))))

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    @property
    def bounds(self) -> tuple[float, float]:
        """(shortest, longest) length in tokens it draws; normal: mean +- 2 std, at least 1."""
        if self.kind == "fixed":
            return self.a, self.a
        if self.kind == "uniform":
            return self.a, self.b
        return max(1.0, self.a - 2 * self.b), self.a + 2 * self.b

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}-{int(self.b)}"
        return f"normal:{self.a:g},{self.b:g}"


# --- one request's payload -------------------------------------------------------------------


@dataclass
class PromptItem:
    """What one request asks: a prompt (completions) or messages (chat), and token targets.

    ``input_tokens_est`` is the prompt's length in tokens as built (exact with a tokenizer,
    an estimate otherwise; None for user prompts without a tokenizer).
    """

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    input_tokens_est: int | None = None
    input_tokens_target: int | None = None
    #: the deliberate shared prefix in this prompt (tokens; 0 for none) and its role:
    #: "first" (its first use), "repeat", "control" (no prefix, the suffix's length); None: no design
    prefix_tokens: int = 0
    prefix_role: str | None = None
    #: ``--response-format``: the body's response_format element and its schema's key
    #: (:mod:`collectors.probe.schemas`); None: plain text
    response_format: dict[str, Any] | None = None
    schema_key: str | None = None
    #: ``--lora``: the adapter this request asks for (sent as its ``model``); None: the endpoint's model
    lora: str | None = None

    def text_for_completions(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(str(m.get("content", "")) for m in self.messages or ())

    def messages_for_chat(self) -> list[dict[str, Any]]:
        if self.messages is not None:
            return self.messages
        return [{"role": "user", "content": self.prompt or ""}]


class TokenCounter:
    """Wraps a ``tokenizers`` tokenizer.json; thread-safe for encode (the library is)."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise WorkloadError(f"--tokenizer needs the 'tokenizers' package: {exc}") from exc
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise WorkloadError(f"{p}: no such tokenizer file (expected a tokenizer.json)")
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as exc:
            raise WorkloadError(f"{p}: not a tokenizers tokenizer.json ({exc})") from exc
        self.path = str(p)

    def count(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens added)."""
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def ids(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))


# --- workloads ------------------------------------------------------------------------------


@dataclass
class WorkloadSpec:
    """What to send. ``prompts_file`` overrides the synthetic input lengths."""

    input_tokens: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", 256))
    output_tokens: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", 64))
    shared_prefix_tokens: int = 0
    prompts_file: str | None = None
    exact_output: bool = True  # ask for min_tokens = max_tokens and ignore_eos
    seed: int = 0
    #: R > 0: prompts in groups of a fresh prefix, R uses of it, one control (see the module doc)
    shared_prefix_repeats: int = 0
    #: ``--inject-long TOKENS:EVERY``: every EVERY-th request's prompt has TOKENS tokens instead (a long
    #: prompt among short ones: short requests' TTFT with a long one in flight vs without, head-of-line)
    inject_long_tokens: int = 0
    inject_long_every: int = 0
    #: send no max_tokens (the server's default applies; an engine that reserves KV for max_tokens
    #: then reserves its max length, NVIDIA/TensorRT-LLM#1012); output_tokens is then not asked for
    omit_max_tokens: bool = False
    #: ``--response-format``: structured-output requests (see :mod:`collectors.probe.schemas`)
    response_format: ResponseFormatSpec | None = None
    #: ``--lora A,B,...``: each request asks for one of these adapters, drawn at random (collectors.probe.lora)
    lora_adapters: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "input_tokens": None if self.prompts_file else str(self.input_tokens),
            "output_tokens": str(self.output_tokens),
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "shared_prefix_repeats": self.shared_prefix_repeats,
            "inject_long": f"{self.inject_long_tokens}:{self.inject_long_every}" if self.inject_long_every else None,
            "omit_max_tokens": self.omit_max_tokens,
            "response_format": self.response_format.describe() if self.response_format else None,
            "lora_adapters": list(self.lora_adapters) or None,
            "prompts_file": self.prompts_file,
            "exact_output_requested": self.exact_output,
            "seed": self.seed,
        }


class Workload:
    """Draws :class:`PromptItem` s; ``next_item()`` costs tens of microseconds.

    Synthetic text is a random slice of a fixed random-word corpus (token ids when a
    tokenizer is given) behind a per-request nonce, so building a 4k-token prompt never
    stalls the probe's event loop.
    """

    CORPUS_WORDS = 40_000

    def __init__(self, spec: WorkloadSpec, tokenizer: TokenCounter | None = None) -> None:
        if spec.shared_prefix_tokens < 0:
            raise WorkloadError("--shared-prefix must be >= 0")
        if spec.shared_prefix_repeats < 0 or (spec.shared_prefix_repeats and spec.shared_prefix_tokens < 1):
            raise WorkloadError("--shared-prefix N:R needs N >= 1 and R >= 1")
        if spec.inject_long_every < 0 or (spec.inject_long_every and (spec.inject_long_tokens < 1 or spec.inject_long_every < 2)):
            raise WorkloadError("--inject-long TOKENS:EVERY needs TOKENS >= 1 and EVERY >= 2")
        self._group_prefix = ""  # shared_prefix_repeats: the current group's prefix text
        self.spec = spec
        self.tokenizer = tokenizer
        self._rng = random.Random(spec.seed)
        self._counter = 0
        self._file_items: list[PromptItem] | None = None
        if spec.prompts_file:
            self._file_items = load_prompts_file(spec.prompts_file, tokenizer)
        corpus_rng = random.Random(20240601)
        self._words = [_WORDS[corpus_rng.randrange(len(_WORDS))] for _ in range(self.CORPUS_WORDS)]
        self._ids: list[int] | None = tokenizer.ids(" " + " ".join(self._words)) if tokenizer is not None else None
        self.words_per_token = WORDS_PER_TOKEN_ESTIMATE
        self.calibration: str | None = None
        self._shared_prefix = self._slice_text(0, spec.shared_prefix_tokens) if spec.shared_prefix_tokens else ""
        self._schemas = SchemaDraws(spec.response_format, spec.seed) if spec.response_format else None
        self._lora_rng = random.Random(spec.seed ^ 0x10AA)

    def calibrate(self, tokens_per_word: float, how: str) -> None:
        """Use a measured tokens-per-word ratio (e.g. from the server's usage) for lengths."""
        if self.tokenizer is None and 0.2 <= tokens_per_word <= 10:
            self.words_per_token = 1.0 / tokens_per_word
            self.calibration = f"{tokens_per_word:.2f} tokens/word {how}"
            if self.spec.shared_prefix_tokens:
                self._shared_prefix = self._slice_text(0, self.spec.shared_prefix_tokens)

    def calibration_text(self, n_words: int) -> str:
        """``n_words`` corpus words (for measuring the server's tokens per word)."""
        return " ".join(self._words[:n_words])

    @property
    def length_method(self) -> str:
        """How prompt lengths were built: the tokenizer, or the words-per-token estimate."""
        if self.tokenizer is not None:
            return f"tokenizer ({self.tokenizer.path})"
        if self.calibration:
            return f"estimate calibrated from the server's usage ({self.calibration}; no --tokenizer given)"
        return f"estimate ({WORDS_PER_TOKEN_ESTIMATE:g} word ~ 1 token; no --tokenizer given)"

    def with_input(self, input_tokens: LengthSpec, output_tokens: LengthSpec | None = None) -> Workload:
        """A copy drawing synthetic prompts of another input length (for prompt sweeps), and answers of
        ``output_tokens`` when given."""
        spec = replace(self.spec, input_tokens=input_tokens, output_tokens=output_tokens or self.spec.output_tokens,
                       prompts_file=None, seed=self._rng.randrange(1 << 30))
        clone = Workload.__new__(Workload)
        clone.__dict__.update(self.__dict__)
        clone.spec = spec
        clone._rng = random.Random(spec.seed)
        clone._file_items = None
        return clone

    def with_prefix(self, input_tokens: LengthSpec, prefix_tokens: int, repeats: int) -> Workload:
        """A copy drawing the ``--shared-prefix prefix_tokens:repeats`` design (prompts of
        ``input_tokens`` in all, the prefix included; see the module doc)."""
        clone = self.with_input(input_tokens)
        clone.spec = replace(clone.spec, shared_prefix_tokens=int(prefix_tokens), shared_prefix_repeats=int(repeats))
        clone._shared_prefix = ""  # groups draw a fresh prefix each
        clone._counter = 0
        return clone

    def with_long(self, input_tokens: LengthSpec, long_tokens: int, every: int,
                  output_tokens: LengthSpec | None = None) -> Workload:
        """A copy drawing ``input_tokens`` prompts (and ``output_tokens`` answers, when given) with
        every ``every``-th prompt ``long_tokens`` long (the ``--inject-long TOKENS:EVERY`` design)."""
        if long_tokens < 1 or every < 2:
            raise WorkloadError("--inject-long TOKENS:EVERY needs TOKENS >= 1 and EVERY >= 2")
        clone = self.with_input(input_tokens, output_tokens)
        clone.spec = replace(clone.spec, inject_long_tokens=int(long_tokens), inject_long_every=int(every))
        return clone

    def with_long_every(self, every: int) -> Workload:
        """A copy whose every ``every``-th prompt is the ``--inject-long`` one (0: none, the control);
        the short prompts' draws are this workload's."""
        if every and (every < 2 or self.spec.inject_long_tokens < 1):
            raise WorkloadError("--inject-long TOKENS:EVERY needs TOKENS >= 1 and EVERY >= 2")
        clone = self.with_input(self.spec.input_tokens)
        clone.spec = replace(clone.spec, inject_long_every=int(every))
        return clone

    def with_design(self, response_format: ResponseFormatSpec | None, lora: tuple[str, ...] = ()) -> Workload:
        """A copy that also asks for ``response_format`` (its own schema draws) and one of ``lora`` per
        request (the ``--response-format`` and ``--lora`` designs)."""
        clone = Workload.__new__(Workload)
        clone.__dict__.update(self.__dict__)
        clone.spec = replace(self.spec, response_format=response_format, lora_adapters=tuple(lora))
        clone._schemas = SchemaDraws(response_format, clone.spec.seed) if response_format else None
        clone._lora_rng = random.Random(clone.spec.seed ^ 0x10AA)
        return clone

    def _slice_text(self, start: int, n_tokens: int) -> str:
        """About ``n_tokens`` tokens of corpus from ``start`` (wrapping around)."""
        pool: list[Any] = self._ids if self._ids is not None else self._words
        n = max(0, int(math.ceil(n_tokens * (1.0 if self._ids is not None else self.words_per_token))))
        if n == 0:
            return ""
        start %= len(pool)
        part = pool[start : start + n]
        while len(part) < n:
            part = part + pool[: n - len(part)]
        if self._ids is not None and self.tokenizer is not None:
            return self.tokenizer.decode(part).strip()
        return " ".join(part)

    def next_item(self) -> PromptItem:
        """The next request's payload (file prompts cycle; synthetic ones are fresh), with its
        response_format and LoRA adapter when the spec asks for them."""
        item = self._next_prompt()
        if self._schemas is not None:
            item.response_format, item.schema_key = self._schemas.next()
        if self.spec.lora_adapters:
            item.lora = self._lora_rng.choice(self.spec.lora_adapters)
        return item

    def _next_prompt(self) -> PromptItem:
        spec = self.spec
        rng = self._rng
        out_len: int | None = spec.output_tokens.sample(rng)
        if spec.omit_max_tokens:
            out_len = None
        self._counter += 1
        if self._file_items is not None:
            base = self._file_items[(self._counter - 1) % len(self._file_items)]
            return PromptItem(base.prompt, base.messages, base.max_tokens or out_len, base.input_tokens_est, None)
        target = spec.input_tokens.sample(rng)
        if spec.inject_long_every and self._counter % spec.inject_long_every == 0:
            target = spec.inject_long_tokens  # the injected long prompt (the short ones' draws go on unchanged)
        # the nonce (a number, ~2-4 tokens) makes every prompt's first block unique
        nonce = f"{self._counter}{rng.randrange(10**6):06d}"
        nonce_tokens = max(1, round(3 / self.words_per_token)) if self.tokenizer is None else self.tokenizer.count(nonce)
        own = max(0, target - spec.shared_prefix_tokens - nonce_tokens)
        body = self._slice_text(rng.randrange(len(self._words)), own)
        text = f"{nonce} {body}" if body else nonce
        if spec.shared_prefix_repeats:
            return self._grouped_item(text, target, out_len)
        if self._shared_prefix:
            text = f"{self._shared_prefix} {text}"
            role = "first" if self._counter == 1 else "repeat"
            return PromptItem(prompt=text, max_tokens=out_len, input_tokens_est=target, input_tokens_target=target,
                              prefix_tokens=spec.shared_prefix_tokens, prefix_role=role)
        return PromptItem(prompt=text, max_tokens=out_len, input_tokens_est=target, input_tokens_target=target)

    def _grouped_item(self, suffix: str, target: int, out_len: int) -> PromptItem:
        """``--shared-prefix N:R``: the next item of the group first, repeat x (R - 1), control."""
        n, r = self.spec.shared_prefix_tokens, self.spec.shared_prefix_repeats
        pos = (self._counter - 1) % (r + 1)
        if pos == r:  # the control: the suffix alone
            est = max(1, target - n)
            return PromptItem(prompt=suffix, max_tokens=out_len, input_tokens_est=est, input_tokens_target=est,
                              prefix_tokens=0, prefix_role="control")
        if pos == 0:  # a fresh prefix: its own nonce first, so no earlier group's blocks match
            nonce = f"{self._counter}{self._rng.randrange(10**6):06d}"
            nonce_tokens = max(1, round(3 / self.words_per_token)) if self.tokenizer is None else self.tokenizer.count(nonce)
            body = self._slice_text(self._rng.randrange(len(self._words)), max(0, n - nonce_tokens))
            self._group_prefix = f"{nonce} {body}" if body else nonce
        return PromptItem(prompt=f"{self._group_prefix} {suffix}", max_tokens=out_len, input_tokens_est=target,
                          input_tokens_target=target, prefix_tokens=n, prefix_role="first" if pos == 0 else "repeat")


def load_prompts_file(path: str, tokenizer: TokenCounter | None = None) -> list[PromptItem]:
    """Read a JSONL file of ``{"prompt": str}`` or ``{"messages": [...]}`` (+ max_tokens)."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"{p}: no such prompts file")
    items: list[PromptItem] = []
    with open(p, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as exc:
                raise WorkloadError(f"{p}:{lineno}: not valid JSON ({exc.args[0] if exc.args else exc})") from exc
            if not isinstance(doc, dict):
                raise WorkloadError(f"{p}:{lineno}: expected a JSON object with 'prompt' or 'messages'")
            prompt = doc.get("prompt")
            messages = doc.get("messages")
            if prompt is None and messages is None:
                raise WorkloadError(f"{p}:{lineno}: needs a 'prompt' string or a 'messages' list")
            if prompt is not None and not isinstance(prompt, str):
                raise WorkloadError(f"{p}:{lineno}: 'prompt' must be a string")
            if messages is not None and (
                not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages)
            ):
                raise WorkloadError(f"{p}:{lineno}: 'messages' must be a list of objects with 'role' and 'content'")
            mt = doc.get("max_tokens")
            if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
                raise WorkloadError(f"{p}:{lineno}: 'max_tokens' must be a positive integer")
            item = PromptItem(prompt=prompt, messages=messages, max_tokens=mt)
            if tokenizer is not None:
                item.input_tokens_est = tokenizer.count(item.text_for_completions())
            items.append(item)
    if not items:
        raise WorkloadError(f"{p}: no prompts in file")
    return items
