"""Structured output: a request's ``response_format`` as a grammar, compiled to per-state token masks.

:func:`~diag.bundled_engine.grammar_schema.grammar_source` checks a ``response_format`` (``text``,
``json_object`` or ``json_schema``) and returns a :class:`~diag.bundled_engine.grammar_schema.GrammarSource`:
the schema as a small tree of supported nodes and its cache key (``schema_key``). :func:`compile_grammar` does the work vLLM hands to xgrammar:

1. the JSON text the schema allows becomes a byte NFA (:mod:`diag.bundled_engine.automaton`), then a
   trimmed DFA;
2. every vocabulary token's bytes are walked through the DFA from every state (vectorised over
   states x tokens): a token is allowed in a state if the walk stays alive, the EOS tokens where
   the JSON is complete. The masks are kept bit-packed, identical rows once.

Its cost grows with the DFA's states x the vocabulary x the tokens' byte lengths. A
:class:`GrammarMatcher` follows one request's output through the DFA and gives the mask of its
next token.

The language: JSON with the schema's properties **in schema order** (optional ones may be left
out), no whitespace but one optional space after ``,`` and ``:`` (what ``json.dumps`` writes);
``enum``/``const`` values as ``json.dumps(value, ensure_ascii=False)`` writes them; ``pattern``
in the subset of :func:`diag.bundled_engine.automaton.parse_pattern`, matched against the
whole string; integer bounds exact; number bounds kept by allowing a fraction only where every
fraction stays in bounds; ``json_object`` and schemas without properties: any JSON object,
nested at most :data:`~diag.bundled_engine.grammar_schema.GENERIC_DEPTH` levels.

Threading: ``grammar_source`` runs on the server's loop; :func:`compile_grammar` on a grammar
worker thread (numpy releases the GIL in its gathers); a :class:`CompiledGrammar` is read-only and
shared; a :class:`GrammarMatcher` belongs to the engine's step loop.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from diag.bundled_engine.automaton import (DIGITS, JSON_SAFE_ASCII, PAD, AutomatonTooLarge, Dfa, Frag, Nfa, byte_chars,
                                   byte_range, determinize, pattern_fragment)
from diag.bundled_engine.grammar_schema import Arr, GrammarError, GrammarSource, Int, Literals, Node, Num, Obj, Str

#: NFA and DFA states a grammar may have; past them the compile fails (the request gets a 400)
MAX_NFA_STATES = 400_000
MAX_DFA_STATES = 40_000
#: states x tokens per gather while computing masks (bounds the compile's memory: int32 each)
_MASK_BLOCK = 1 << 21


# --- nodes -> NFA ------------------------------------------------------------------------------

_UTF8_CONT = byte_range(0x80, 0xBF)
_HEX = DIGITS | byte_range(0x41, 0x46) | byte_range(0x61, 0x66)


class _Builder:
    """Turns nodes into fragments of one NFA."""

    def __init__(self, nfa: Nfa) -> None:
        self.n = nfa

    def node(self, node: Node) -> Frag:
        n = self.n
        if isinstance(node, Literals):
            return n.alt(*(n.lit(t) for t in node.texts))
        if isinstance(node, Str):
            if node.atoms is not None:
                return n.seq(n.lit(b'"'), pattern_fragment(n, list(node.atoms)), n.lit(b'"'))
            return n.seq(n.lit(b'"'), n.repeat(self._char, node.min_len, node.max_len), n.lit(b'"'))
        if isinstance(node, Int):
            return self._int(node.lo, node.hi)
        if isinstance(node, Num):
            return self._num(node.lo, node.hi)
        if isinstance(node, Arr):
            return n.seq(n.lit(b"["), n.sep_list(lambda: self.node(node.items), self._comma, node.min_items,
                                                 node.max_items), n.lit(b"]"))
        if isinstance(node, Obj):
            return self._object(node)
        return self._any(node.depth, node.object_only)

    # -- pieces ------------------------------------------------------------------------------

    def _comma(self) -> Frag:
        return self.n.seq(self.n.lit(b","), self.n.opt(self.n.lit(b" ")))

    def _colon(self) -> Frag:
        return self.n.seq(self.n.lit(b":"), self.n.opt(self.n.lit(b" ")))

    def _char(self) -> Frag:
        """One character of a JSON string: safe ASCII, a UTF-8 sequence or an escape."""
        n = self.n
        escape = n.seq(n.lit(b"\\"), n.alt(n.cls(byte_chars('"\\/bfnrt')),
                                          n.seq(n.lit(b"u"), *(n.cls(_HEX) for _ in range(4)))))
        utf8 = n.alt(n.seq(n.cls(byte_range(0xC2, 0xDF)), n.cls(_UTF8_CONT)),
                     n.seq(n.cls(byte_range(0xE0, 0xEF)), n.cls(_UTF8_CONT), n.cls(_UTF8_CONT)),
                     n.seq(n.cls(byte_range(0xF0, 0xF4)), n.cls(_UTF8_CONT), n.cls(_UTF8_CONT), n.cls(_UTF8_CONT)))
        return n.alt(n.cls(JSON_SAFE_ASCII), utf8, escape)

    def _digits_range(self, lo: int, hi: int | None) -> Frag:
        """Decimal text (no sign, no leading zero) of the integers ``lo..hi`` (None: unbounded), lo >= 0."""
        n = self.n
        if hi is None:  # lo..99..9 of lo's width, then any longer number
            k = len(str(lo))
            longer = n.seq(n.cls(byte_range(0x31, 0x39)), n.repeat(lambda: n.cls(DIGITS), k, None))
            return n.alt(self._digits_range(lo, 10 ** k - 1), longer)
        return n.alt(*(n.seq(*(n.cls(byte_range(0x30 + a, 0x30 + b)) for a, b in run)) for run in _range_runs(lo, hi)))

    def _int(self, lo: int | None, hi: int | None) -> Frag:
        n = self.n
        parts = []
        if hi is None or hi >= 0:
            parts.append(self._digits_range(0 if lo is None else max(lo, 0), hi))
        if lo is None or lo < 0:
            top = None if lo is None else -lo
            bottom = 1 if hi is None or hi >= 0 else -hi
            if top is None or top >= bottom:
                parts.append(n.seq(n.lit(b"-"), self._digits_range(bottom, top)))
        return n.alt(*parts)

    def _num(self, lo: float | None, hi: float | None) -> Frag:
        n = self.n
        frac = lambda: n.seq(n.lit(b"."), n.repeat(lambda: n.cls(DIGITS), 1, None))  # noqa: E731
        if lo is None and hi is None:
            exp = n.seq(n.cls(byte_chars("eE")), n.opt(n.cls(byte_chars("+-"))), n.repeat(lambda: n.cls(DIGITS), 1, None))
            return n.seq(n.opt(n.lit(b"-")), self._digits_range(0, None), n.opt(frac()), n.opt(exp))
        ilo = None if lo is None else math.ceil(lo)
        ihi = None if hi is None else math.floor(hi)
        parts = []
        if ilo is None or ihi is None or ilo <= ihi:
            parts.append(self._int(ilo, ihi))  # whole numbers in bounds
        # k.f in [k, k+1) for k >= 0: in bounds when k >= lo and k + 1 <= hi
        plo = 0 if lo is None else max(0, math.ceil(lo))
        phi = None if hi is None else math.floor(hi) - 1
        if phi is None or plo <= phi:
            parts.append(n.seq(self._digits_range(plo, phi), frac()))
        # -m.f in (-(m+1), -m] for m >= 0: in bounds when -m <= hi and -(m+1) >= lo
        mlo = 0 if hi is None else max(0, math.ceil(-hi))
        mhi = None if lo is None else math.floor(-lo) - 1
        if mhi is None or mlo <= mhi:
            parts.append(n.seq(n.lit(b"-"), self._digits_range(mlo, mhi), frac()))
        return n.alt(*parts)

    def _object(self, node: Obj) -> Frag:
        """Properties in order, optional ones skippable; ``a`` tracks "none written yet"."""
        n = self.n
        start = n.state()
        a, b = start, n.state()  # before property i: nothing written yet / something written
        for name, sub, required in node.props:
            key = json.dumps(name, ensure_ascii=False).encode("utf-8")
            body = n.seq(n.lit(key), self._colon(), self.node(sub))
            comma = self._comma()
            n.link(a, body[0])
            n.link(b, comma[0])
            n.link(comma[1], body[0])
            na, nb = n.state(), n.state()
            n.link(body[1], nb)
            if not required:
                n.link(a, na)
                n.link(b, nb)
            a, b = na, nb
        end = n.state()
        close = n.lit(b"}")
        n.link(a, close[0])
        n.link(b, close[0])
        n.link(close[1], end)
        open_ = n.lit(b"{")
        n.link(open_[1], start)
        return open_[0], end

    def _any(self, depth: int, object_only: bool = False) -> Frag:
        n = self.n
        string = lambda: self.node(Str())  # noqa: E731
        if object_only or depth > 0:
            inner = max(depth - 1, 0)
            member = lambda: n.seq(string(), self._colon(), self._any(inner))  # noqa: E731
            obj = n.seq(n.lit(b"{"), n.sep_list(member, self._comma, 0, None), n.lit(b"}"))
            if object_only:
                return obj
            arr = n.seq(n.lit(b"["), n.sep_list(lambda: self._any(inner), self._comma, 0, None), n.lit(b"]"))
            return n.alt(obj, arr, string(), self._num(None, None), self.node(Literals((b"true", b"false", b"null"))))
        return n.alt(string(), self._num(None, None), self.node(Literals((b"true", b"false", b"null"))))


def _range_runs(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Digit runs (per position: lowest, highest digit) whose decimal texts are exactly lo..hi."""
    out: list[list[tuple[int, int]]] = []
    if lo > hi:
        return out
    width = len(str(lo))
    while lo <= hi:
        top = min(hi, 10 ** width - 1)
        if lo <= top:
            out.extend(_same_width(str(lo), str(top)))
        lo, width = 10 ** width, width + 1
    return out


def _same_width(a: str, b: str) -> list[list[tuple[int, int]]]:
    """Runs for ``a..b``, decimal texts of one width (``a <= b``)."""
    if a == b:
        return [[(int(c), int(c)) for c in a]]
    if a[0] == b[0]:
        return [[(int(a[0]), int(a[0]))] + r for r in _same_width(a[1:], b[1:])]
    rest = len(a) - 1
    out: list[list[tuple[int, int]]] = []
    first, last = int(a[0]), int(b[0])
    if a[1:] != "0" * rest:  # a .. a[0]99..9
        out += _same_width(a, a[0] + "9" * rest)
        first += 1
    tail: list[list[tuple[int, int]]] = []
    if b[1:] != "9" * rest:  # b[0]00..0 .. b
        tail = _same_width(b[0] + "0" * rest, b)
        last -= 1
    if first <= last:
        out.append([(first, last)] + [(0, 9)] * rest)
    return out + tail


# --- the vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenVocab:
    """The tokens' bytes as the mask computation reads them. ``order`` lists the grammar tokens
    (not special, non-empty) longest first; ``byte_table[i, j]`` is byte ``j`` of token
    ``order[i]`` or :data:`PAD`; ``lengths`` in bytes, same order."""

    size: int  # the model's vocabulary (logit columns)
    token_bytes: tuple[bytes | None, ...]  # by id; None = never allowed by a grammar
    eos_ids: frozenset[int]
    order: np.ndarray  # int64 [n]
    byte_table: np.ndarray  # int64 [n, max length]
    lengths: np.ndarray  # int64 [n]

    @classmethod
    def build(cls, token_bytes: Sequence[bytes | None], size: int, eos_ids: frozenset[int]) -> "TokenVocab":
        tb = tuple(list(token_bytes[:size]) + [None] * max(0, size - len(token_bytes)))
        ids = [i for i, b in enumerate(tb) if b and i not in eos_ids]
        ids.sort(key=lambda i: -len(tb[i] or b""))
        width = max((len(tb[i] or b"") for i in ids), default=1)
        table = np.full((len(ids), width), PAD, dtype=np.int64)
        for row, i in enumerate(ids):
            data = tb[i] or b""
            table[row, :len(data)] = np.frombuffer(data, dtype=np.uint8)
        lengths = np.asarray([len(tb[i] or b"") for i in ids], dtype=np.int64)
        return cls(size, tb, frozenset(i for i in eos_ids if i < size), np.asarray(ids, dtype=np.int64), table, lengths)


# --- the compiled grammar ---------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledGrammar:
    """A grammar ready to constrain decoding: its DFA and, per DFA state, the allowed tokens
    (``mask_rows[state_row[s]]``, bit-packed over the vocabulary). ``compile_s``: seconds the
    compile took; ``ready_ns``: Unix ns when it finished."""

    key: str
    dfa: Dfa
    mask_rows: np.ndarray  # uint8 [unique rows, ceil(vocab / 8)]
    state_row: np.ndarray  # int32 [num_states + 1]
    vocab: TokenVocab
    compile_s: float
    ready_ns: int

    @property
    def num_states(self) -> int:
        return self.dfa.num_states

    def allowed(self, state: int) -> np.ndarray:
        """bool [vocab]: the tokens allowed next in ``state``."""
        return np.unpackbits(self.mask_rows[self.state_row[state]], count=self.vocab.size).astype(bool)

    def accepts(self, text: str | bytes) -> bool:
        """Whether ``text`` is a whole output of this grammar."""
        return self.dfa.accepts(text.encode("utf-8") if isinstance(text, str) else text)

    def nbytes(self) -> int:
        """Bytes the grammar holds (DFA table, masks, state index)."""
        return int(self.dfa.table.nbytes + self.mask_rows.nbytes + self.state_row.nbytes)


def token_masks(dfa: Dfa, vocab: TokenVocab) -> np.ndarray:
    """bool [DFA states + 1, vocab]: token allowed in state (its bytes keep the walk alive; EOS
    where the state accepts). The work: every state x every token x its bytes, longest first, in
    blocks of at most ``_MASK_BLOCK`` state-token pairs."""
    num = dfa.table.shape[0]
    dead = dfa.dead
    n_tok = len(vocab.order)
    out = np.zeros((num, vocab.size), dtype=bool)
    if n_tok:
        table = dfa.table
        classes = dfa.byte_class[vocab.byte_table]  # [tokens, max length]: each byte's class in this DFA
        lengths = vocab.lengths
        # tokens longer than j bytes are the first active[j] (longest first)
        active = [int(np.count_nonzero(lengths > j)) for j in range(vocab.byte_table.shape[1])]
        rows_per_block = max(1, _MASK_BLOCK // n_tok)
        for r0 in range(0, num, rows_per_block):
            r1 = min(num, r0 + rows_per_block)
            cur = np.repeat(np.arange(r0, r1, dtype=np.int64)[:, None], n_tok, axis=1)
            for j, k in enumerate(active):
                if k == 0:
                    break
                cur[:, :k] = table[cur[:, :k], classes[None, :k, j]]
            out[r0:r1, vocab.order] = cur != dead
    out[dead] = False
    eos = sorted(vocab.eos_ids)
    if eos:
        out[np.ix_(np.nonzero(dfa.accepting)[0], np.asarray(eos))] = True
    return out


def compile_grammar(source: GrammarSource, vocab: TokenVocab) -> CompiledGrammar:
    """Build the DFA of ``source`` and its per-state token masks; GrammarError (one line) when
    the grammar is too large. Runs on the caller's thread."""
    t0 = time.perf_counter()
    try:
        nfa = Nfa(MAX_NFA_STATES)
        frag = _Builder(nfa).node(source.root)
        dfa = determinize(nfa, frag, MAX_DFA_STATES)
    except AutomatonTooLarge as exc:
        raise GrammarError(f"response_format: cannot compile the grammar: {exc}") from None
    masks = token_masks(dfa, vocab)
    packed = np.packbits(masks, axis=1)
    rows, inverse = np.unique(packed, axis=0, return_inverse=True)
    compile_s = time.perf_counter() - t0
    return CompiledGrammar(source.key, dfa, rows, inverse.reshape(-1).astype(np.int32), vocab, compile_s,
                           time.time_ns())


class GrammarMatcher:
    """One request's place in its grammar (loop thread only): the DFA state after its output."""

    def __init__(self, grammar: CompiledGrammar) -> None:
        self.grammar = grammar
        self.state = 0

    def allowed(self) -> np.ndarray:
        """bool [vocab]: tokens allowed next (EOS alone, or nothing but EOS, once complete)."""
        mask = self.grammar.allowed(self.state)
        if not mask.any():  # cannot happen on a trimmed DFA with single-byte tokens; never leave no choice
            mask = mask.copy()
            mask[sorted(self.grammar.vocab.eos_ids)] = True
        return mask

    def advance(self, token_id: int) -> None:
        """Move past ``token_id`` (EOS leaves the state as it is)."""
        vocab = self.grammar.vocab
        if token_id in vocab.eos_ids:
            return
        data = vocab.token_bytes[token_id] if 0 <= token_id < vocab.size else None
        self.state = self.grammar.dfa.walk(self.state, data) if data else self.grammar.dfa.dead

    @property
    def complete(self) -> bool:
        """The output so far is a whole match and nothing may follow it."""
        dfa = self.grammar.dfa
        return bool(dfa.accepting[self.state]) and not bool(dfa.exits[self.state])


__all__ = ["CompiledGrammar", "GrammarMatcher", "TokenVocab", "compile_grammar", "token_masks"]
