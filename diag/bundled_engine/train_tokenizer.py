"""Train the bundled byte-level BPE tokenizer once and write ``diag/bundled_engine/data/tokenizer.json``.

Run: ``python -m diag.bundled_engine.train_tokenizer [--vocab-size 2048] [--out PATH]``.

The training text is generated deterministically here (a fixed word list, sentence templates and
a seeded ``random.Random``), so re-running the script gives the same tokenizer on any machine.
The result is shipped as package data; the engine never trains at run time.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

#: Special tokens, in id order: the end-of-text / EOS token gets id 0.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
DEFAULT_VOCAB_SIZE = 2048
DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "tokenizer.json"

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no what "
    "can more about time up out them into only other some could new these two may first then do "
    "any like my now over such our man me even most made after also did many before must through "
    "back years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three model token tokens request requests server client "
    "queue prefill decode latency throughput batch cache memory block blocks kernel attention "
    "layer layers head heads tensor parallel gpu cpu network stream streaming first second "
    "time-to-first-token scheduler policy chunk chunked preemption sample sampling temperature "
    "engine trace span spans metric metrics histogram counter gauge bottleneck diagnosis prompt "
    "response answer question user assistant system hello world python torch compute bandwidth "
    "value number table row column file line error warning report check threshold evidence"
).split()
_TEMPLATES = (
    "{A} {b} {c} {d}.",
    "{A} {b} {c}, {d} {e} {f}.",
    "Why is the {b} {c} so {d}? Because {e} {f} {g}.",
    "{A} {b} {n} {c} in {m} ms, and {d} {e} at {x:.2f} per second.",
    "The {b} has {n} {c}; {d} {e} {f} {g} {h}.",
    '"{A} {b}," said the {c}. "{D} {e} {f}!"',
    "{A}: {b} = {n}, {c} = {m}; ratio {x:.3f}.",
    "def {b}_{c}({d}: int) -> int:\n    return {d} * {n} + {m}\n",
    "- {A} {b} {c} ({n} %)\n- {D} {e} {f} ({m} %)\n",
    "{A} {b} {c} {d} {e} {f} {g} {h} {i}.",
)


def generate_corpus(num_lines: int = 40_000, seed: int = 1234) -> list[str]:
    """Return ``num_lines`` deterministic lines of English-like text, numbers, code and markup."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(9)]
        fields = {k: w for k, w in zip("bcdefghi", words[1:])}
        fields["A"] = words[0].capitalize()
        fields["D"] = words[2].capitalize()
        fields["n"] = rng.randint(0, 4096)
        fields["m"] = rng.randint(0, 999)
        fields["x"] = rng.random() * 100
        lines.append(rng.choice(_TEMPLATES).format(**fields))
    # a little non-ASCII so multi-byte characters have merges too
    lines.extend(["naïve café – “quotes” — 東京 ünïcödé ≤ ≥ → ✓"] * 50)
    return lines


def train(vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE tokenizer on the generated corpus."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(generate_corpus(), trainer=trainer)
    return tok


def main(argv: list[str] | None = None) -> int:
    """CLI entry: train and write the tokenizer JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ns = ap.parse_args(argv)
    tok = train(ns.vocab_size)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(ns.out))
    print(f"wrote {ns.out} (vocab={tok.get_vocab_size()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
