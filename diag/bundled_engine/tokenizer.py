"""Byte-level BPE tokenizer (the ``tokenizers`` library), a chat template and incremental detokenizing.

The bundled tokenizer is ``data/tokenizer.json`` (trained by ``train_tokenizer.py``); a Hugging Face
checkpoint directory brings its own ``tokenizer.json``. Instances are safe to share between
threads for ``encode``/``decode`` (the Rust tokenizer is immutable once loaded);
:class:`IncrementalDetokenizer` holds per-request state and belongs to one thread at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer as _HFTokenizer

BUNDLED_TOKENIZER_PATH = Path(__file__).resolve().parent / "data" / "tokenizer.json"
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class TokenizerError(ValueError):
    """The tokenizer file is missing or unusable."""


class Tokenizer:
    """Text <-> token ids; knows its EOS ids and renders chat messages."""

    def __init__(self, hf: _HFTokenizer, eos_token_ids: Sequence[int], source: str) -> None:
        self._hf = hf
        self.eos_token_ids: frozenset[int] = frozenset(int(i) for i in eos_token_ids)
        self.source = source
        self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
        vocab = hf.get_vocab(with_added_tokens=True)
        self._chatml = IM_START in vocab and IM_END in vocab
        if self._chatml:
            self.eos_token_ids = self.eos_token_ids | {vocab[IM_END]}

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def bundled(cls) -> "Tokenizer":
        """The tokenizer shipped with the package (vocab 2048; EOS ``<|endoftext|>`` = id 0)."""
        return cls.from_file(BUNDLED_TOKENIZER_PATH)

    @classmethod
    def from_file(cls, path: str | Path, eos_token_ids: Sequence[int] | None = None) -> "Tokenizer":
        """Load a ``tokenizer.json``; EOS defaults to the ``<|endoftext|>``/``</s>`` token if present."""
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"{path}: tokenizer file not found")
        try:
            hf = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception
            raise TokenizerError(f"{path}: not a valid tokenizer.json ({exc})") from None
        if eos_token_ids is None:
            vocab = hf.get_vocab(with_added_tokens=True)
            eos_token_ids = [vocab[t] for t in (EOS_TOKEN, "</s>", "<|end_of_text|>", "<|eot_id|>") if t in vocab]
        return cls(hf, eos_token_ids, str(path))

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, eos_token_ids: Sequence[int] | None = None) -> "Tokenizer":
        """Load ``<ckpt_dir>/tokenizer.json`` with EOS ids from ``config.json`` when not given."""
        ckpt_dir = Path(ckpt_dir)
        if eos_token_ids is None:
            cfg_path = ckpt_dir / "config.json"
            if cfg_path.is_file():
                eos = json.loads(cfg_path.read_text()).get("eos_token_id")
                if isinstance(eos, int):
                    eos_token_ids = [eos]
                elif isinstance(eos, list):
                    eos_token_ids = [int(e) for e in eos]
        return cls.from_file(ckpt_dir / "tokenizer.json", eos_token_ids)

    # -- encode / decode ---------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added; special-token strings are recognised)."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; an incomplete UTF-8 tail shows as U+FFFD."""
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        """Render chat messages to one prompt string ending where the assistant's reply starts.

        The bundled tokenizer uses ChatML (``<|im_start|>role\\n...<|im_end|>``); a tokenizer
        without those tokens gets a plain ``role: content`` transcript.
        """
        parts: list[str] = []
        if self._chatml:
            for m in messages:
                parts.append(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n")
            parts.append(f"{IM_START}assistant\n")
        else:
            for m in messages:
                parts.append(f"{m['role']}: {m['content']}\n")
            parts.append("assistant:")
        return "".join(parts)

    def token_bytes(self) -> list[bytes | None]:
        """Each token id's bytes as it adds them to the output (None for special and added tokens).

        Byte-level BPE (the bundled tokenizer, GPT-2 style) maps its alphabet back to bytes;
        SentencePiece-style vocabularies turn ``▁`` into a space and ``<0xNN>`` into that byte;
        anything else is the token's decoded UTF-8 (None when it decodes to an incomplete
        character).
        """
        spec = json.loads(self._hf.to_str())
        decoder = spec.get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
        added = {int(t["id"]) for t in spec.get("added_tokens", [])}
        byte_level = "ByteLevel" in kinds
        inverse = {ch: b for b, ch in _gpt2_byte_chars().items()}
        out: list[bytes | None] = [None] * self.vocab_size
        for tok, i in self._hf.get_vocab(with_added_tokens=True).items():
            if i in added or i >= self.vocab_size:
                continue
            if byte_level:
                if all(ch in inverse for ch in tok):
                    out[i] = bytes(inverse[ch] for ch in tok)
                continue
            if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
                try:
                    out[i] = bytes([int(tok[3:5], 16)])
                    continue
                except ValueError:
                    pass
            if "▁" in tok:
                out[i] = tok.replace("▁", " ").encode("utf-8")
                continue
            text = self._hf.decode([i], skip_special_tokens=False)
            out[i] = text.encode("utf-8") if text and "\ufffd" not in text else None
        return out

    def detokenizer(self, prompt_ids: Sequence[int] = ()) -> "IncrementalDetokenizer":
        """A fresh incremental detokenizer for one request's output."""
        return IncrementalDetokenizer(self, list(prompt_ids[-4:]))


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas, holding back incomplete UTF-8.

    Keeps a small window of previous ids so that byte-level merges across token boundaries
    decode correctly. Owned by one thread (the engine's step loop).
    """

    tokenizer: Tokenizer
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0

    def __post_init__(self) -> None:
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        """Append one id; return the newly complete text (may be empty)."""
        if token_id in self.tokenizer.eos_token_ids:
            return ""
        self.ids.append(token_id)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Any held-back text at the end of the stream (replacement chars included)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""


def _gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte -> the printable character that stands for it."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}
