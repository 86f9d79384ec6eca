"""The bundled byte-level BPE tokenizer, its training script and incremental detokenizing."""

from __future__ import annotations

import json

import pytest

from diag.bundled_engine import train_tokenizer
from diag.bundled_engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer, TokenizerError

TEXTS = [
    "Why is time-to-first-token high? Because the queue is long.",
    "naïve café – “quotes” — 東京 ünïcödé ≤ ≥ → ✓ 🙂",
    "def f(x: int) -> int:\n    return x * 42\n",
    "  leading spaces and\ttabs\n\nnewlines  ",
]


def test_roundtrip_and_vocab():
    tok = Tokenizer.bundled()
    assert tok.vocab_size == train_tokenizer.DEFAULT_VOCAB_SIZE
    assert 0 in tok.eos_token_ids
    for t in TEXTS:
        ids = tok.encode(t)
        assert ids and max(ids) < tok.vocab_size
        assert tok.decode(ids) == t
    # BPE merges: common words are single tokens, far fewer tokens than bytes
    s = "the request and the server and the queue " * 10
    assert len(tok.encode(s)) < len(s.encode()) / 3


def test_incremental_detokenizer_matches_full_decode():
    tok = Tokenizer.bundled()
    for t in TEXTS:
        ids = tok.encode(t)
        d = tok.detokenizer()
        pieces = [d.add(i) for i in ids]
        assert "".join(pieces) + d.flush() == t
        assert all("\ufffd" not in p for p in pieces)


def test_eos_is_not_text_and_chat_template():
    tok = Tokenizer.bundled()
    d = tok.detokenizer()
    assert d.add(0) == ""
    prompt = tok.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok.encode(prompt)
    im_start = tok._hf.token_to_id("<|im_start|>")
    assert ids.count(im_start) == 3  # special tokens are recognised, not split into bytes


def test_training_script_reproduces_the_shipped_file(tmp_path):
    out = tmp_path / "tok.json"
    assert train_tokenizer.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(BUNDLED_TOKENIZER_PATH.read_text())


def test_bad_files(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_file(tmp_path / "nope.json")
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
        Tokenizer.from_file(tmp_path / "t.json")
