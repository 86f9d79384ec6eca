"""Byte-level automata for structured output: an NFA built from fragments, its DFA, and the regex
subset a JSON schema's ``pattern`` may use.

A set of bytes is a Python int used as a 256-bit mask (bit ``b`` = byte ``b``). :class:`Nfa`
builds Thompson fragments (``(start, end)`` state pairs) joined by epsilon edges;
:func:`determinize` turns one into a :class:`Dfa` by subset construction over the byte classes
the NFA distinguishes, and drops every state from which no accepting state can be reached, so a
walk that stays alive can always be completed. The DFA is a dense table over byte classes
(``table[state, byte_class[byte]]``) with one more column that maps each state to itself, the
class of the padding symbol :data:`PAD`: the form the token-mask computation in
:mod:`diag.bundled_engine.grammar` gathers from.

Threading: an :class:`Nfa` belongs to the thread building it; a :class:`Dfa` is read-only once
built and safe to share.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

#: the padding symbol after a token's bytes: its class maps every state to itself
PAD = 256

Frag = tuple[int, int]  # (start state, end state) of an NFA fragment


class AutomatonTooLarge(ValueError):
    """The automaton would pass its state limit; the message is one line."""


def byte_range(lo: int, hi: int) -> int:
    """The mask of bytes ``lo..hi`` (inclusive)."""
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)


def byte_chars(text: str) -> int:
    """The mask of the (ASCII) characters of ``text``."""
    m = 0
    for ch in text.encode("ascii"):
        m |= 1 << ch
    return m


DIGITS = byte_range(0x30, 0x39)
#: printable ASCII a JSON string holds unescaped: space..~ without ``"`` and ``\``
JSON_SAFE_ASCII = byte_range(0x20, 0x7E) & ~byte_chars('"\\')


class Nfa:
    """A byte NFA under construction: numbered states, byte-set edges and epsilon edges."""

    def __init__(self, max_states: int) -> None:
        self.max_states = max_states
        self.edges: list[list[tuple[int, int]]] = []  # state -> [(byte mask, target)]
        self.eps: list[list[int]] = []  # state -> [target]

    def state(self) -> int:
        """A new state (AutomatonTooLarge past ``max_states``)."""
        if len(self.edges) >= self.max_states:
            raise AutomatonTooLarge(f"the grammar needs more than {self.max_states} automaton states")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def link(self, a: int, b: int) -> None:
        """An epsilon edge ``a -> b``."""
        self.eps[a].append(b)

    # -- fragments -----------------------------------------------------------------------------

    def empty(self) -> Frag:
        s, e = self.state(), self.state()
        self.link(s, e)
        return s, e

    def cls(self, mask: int) -> Frag:
        """One byte out of ``mask``."""
        s, e = self.state(), self.state()
        self.edges[s].append((mask, e))
        return s, e

    def lit(self, data: bytes) -> Frag:
        """Exactly the bytes ``data`` (the empty fragment for ``b""``)."""
        if not data:
            return self.empty()
        s = cur = self.state()
        for b in data:
            nxt = self.state()
            self.edges[cur].append((1 << b, nxt))
            cur = nxt
        return s, cur

    def seq(self, *frags: Frag) -> Frag:
        """The fragments one after another."""
        if not frags:
            return self.empty()
        for (_, e), (s, _) in zip(frags, frags[1:]):
            self.link(e, s)
        return frags[0][0], frags[-1][1]

    def alt(self, *frags: Frag) -> Frag:
        """One of the fragments."""
        s, e = self.state(), self.state()
        for fs, fe in frags:
            self.link(s, fs)
            self.link(fe, e)
        return s, e

    def opt(self, frag: Frag) -> Frag:
        """The fragment or nothing."""
        s, e = self.alt(frag)
        self.link(s, e)
        return s, e

    def star(self, frag: Frag) -> Frag:
        """The fragment repeated zero or more times."""
        s, e = self.opt(frag)
        self.link(frag[1], frag[0])
        return s, e

    def repeat(self, make: Callable[[], Frag], lo: int, hi: int | None) -> Frag:
        """``lo`` to ``hi`` (None: unbounded) copies of the fragment ``make()`` builds."""
        parts = [make() for _ in range(lo)]
        if hi is None:
            parts.append(self.star(make()))
        else:
            tail: Frag | None = None
            for _ in range(hi - lo):
                f = make()
                tail = self.opt(f if tail is None else self.seq(f, tail))
            if tail is not None:
                parts.append(tail)
        return self.seq(*parts)

    def sep_list(self, make: Callable[[], Frag], sep: Callable[[], Frag], lo: int, hi: int | None) -> Frag:
        """``lo`` to ``hi`` (None: unbounded) copies of ``make()`` with ``sep()`` between them."""
        if hi == 0:
            return self.empty()
        if hi is None:
            parts = [make()]
            for _ in range(max(lo, 1) - 1):
                parts += [sep(), make()]
            body = self.seq(self.seq(*parts), self.star(self.seq(sep(), make())))
            return self.opt(body) if lo == 0 else body
        tail: Frag | None = None
        for k in range(hi, 0, -1):
            item = make() if k == 1 else self.seq(sep(), make())
            f = item if tail is None else self.seq(item, tail)
            tail = self.opt(f) if k > lo else f
        assert tail is not None
        return tail


# --- the DFA ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dfa:
    """A trimmed byte DFA. ``table[s, byte_class[b]]`` is the next state after byte ``b``
    (``dead`` = rejected; the class of :data:`PAD`, the last column, maps ``s`` to itself);
    ``accepting[s]``: the bytes so far are a whole match; ``exits[s]``: some byte continues from
    ``s``. State 0 starts; ``dead`` is the last row."""

    table: np.ndarray  # int32 [num_states + 1, classes + 1]
    byte_class: np.ndarray  # int64 [257]: bytes 0..255 and PAD
    accepting: np.ndarray  # bool [num_states + 1]
    exits: np.ndarray  # bool [num_states + 1]

    @property
    def dead(self) -> int:
        return self.table.shape[0] - 1

    @property
    def num_states(self) -> int:
        """Live states, the dead state not counted."""
        return self.table.shape[0] - 1

    def walk(self, state: int, data: bytes) -> int:
        """The state after ``data`` from ``state`` (``dead`` once rejected)."""
        t, bc, dead = self.table, self.byte_class, self.dead
        for b in data:
            state = int(t[state, bc[b]])
            if state == dead:
                return dead
        return state

    def accepts(self, data: bytes) -> bool:
        """Whether ``data`` as a whole is in the language."""
        return bool(self.accepting[self.walk(0, data)])


def _byte_classes(nfa: Nfa) -> tuple[list[int], list[int]]:
    """The partition of the 256 bytes that no edge mask splits: (class of each byte, a
    representative byte of each class)."""
    masks = sorted({m for edges in nfa.edges for m, _ in edges})
    sig_to_class: dict[tuple[int, ...], int] = {}
    class_of = [0] * 256
    reps: list[int] = []
    for b in range(256):
        sig = tuple((m >> b) & 1 for m in masks)
        c = sig_to_class.get(sig)
        if c is None:
            c = sig_to_class[sig] = len(reps)
            reps.append(b)
        class_of[b] = c
    return class_of, reps


def determinize(nfa: Nfa, frag: Frag, max_states: int) -> Dfa:
    """The trimmed DFA of ``frag`` (its end state accepts); AutomatonTooLarge past ``max_states``."""
    start, accept = frag
    class_of, reps = _byte_classes(nfa)
    num_classes = len(reps)
    # each NFA edge as a bitmask over byte classes
    class_edges: list[list[tuple[int, int]]] = []
    for edges in nfa.edges:
        out = []
        for m, t in edges:
            cm = 0
            for c, b in enumerate(reps):
                if (m >> b) & 1:
                    cm |= 1 << c
            out.append((cm, t))
        class_edges.append(out)
    closure_memo: dict[int, frozenset[int]] = {}

    def closure1(s: int) -> frozenset[int]:
        got = closure_memo.get(s)
        if got is None:
            seen = {s}
            stack = [s]
            while stack:
                for t in nfa.eps[stack.pop()]:
                    if t not in seen:
                        seen.add(t)
                        stack.append(t)
            got = closure_memo[s] = frozenset(seen)
        return got

    def closure(states: set[int]) -> frozenset[int]:
        out: set[int] = set()
        for s in states:
            out |= closure1(s)
        return frozenset(out)

    first = closure({start})
    index: dict[frozenset[int], int] = {first: 0}
    sets = [first]
    trans: list[list[int]] = []  # state -> next state per class (-1 = none)
    queue = deque([0])
    while queue:
        d = queue.popleft()
        targets: list[set[int]] = [set() for _ in range(num_classes)]
        for s in sets[d]:
            for cm, t in class_edges[s]:
                while cm:
                    low = cm & -cm
                    targets[low.bit_length() - 1].add(t)
                    cm ^= low
        row = [-1] * num_classes
        for c, tset in enumerate(targets):
            if not tset:
                continue
            nxt = closure(tset)
            k = index.get(nxt)
            if k is None:
                if len(sets) >= max_states:
                    raise AutomatonTooLarge(f"the grammar needs more than {max_states} automaton states")
                k = index[nxt] = len(sets)
                sets.append(nxt)
                queue.append(k)
            row[c] = k
        trans.append(row)
    accepting = [accept in s for s in sets]
    # trim: keep the states from which an accepting state is reachable
    rev: list[list[int]] = [[] for _ in sets]
    for d, row in enumerate(trans):
        for k in row:
            if k >= 0:
                rev[k].append(d)
    live = [False] * len(sets)
    stack = [d for d, a in enumerate(accepting) if a]
    for d in stack:
        live[d] = True
    while stack:
        for p in rev[stack.pop()]:
            if not live[p]:
                live[p] = True
                stack.append(p)
    if not live[0]:
        raise AutomatonTooLarge("the grammar matches nothing")
    new_id = np.cumsum(live) - 1
    n = int(new_id[-1]) + 1
    dead = n
    table = np.full((n + 1, num_classes + 1), dead, dtype=np.int32)
    for d, row in enumerate(trans):
        if live[d]:
            table[new_id[d], :num_classes] = [int(new_id[k]) if k >= 0 and live[k] else dead for k in row]
    table[:, num_classes] = np.arange(n + 1, dtype=np.int32)  # PAD: stay
    acc = np.zeros(n + 1, dtype=bool)
    for d, a in enumerate(accepting):
        if live[d] and a:
            acc[new_id[d]] = True
    exits = (table[:, :num_classes] != dead).any(axis=1)
    byte_class = np.asarray(class_of + [num_classes], dtype=np.int64)
    return Dfa(table, byte_class, acc, exits)


# --- the pattern subset ---------------------------------------------------------------------

#: one pattern atom: (byte mask, fewest repeats, most repeats or None)
PatternAtom = tuple[int, int, "int | None"]

_CLASS_ESCAPES = {
    "d": DIGITS,
    "w": byte_range(0x30, 0x39) | byte_range(0x41, 0x5A) | byte_range(0x61, 0x7A) | byte_chars("_"),
    "s": byte_chars(" "),
}
_MAX_REPEAT = 256


class PatternError(ValueError):
    """A ``pattern`` outside the supported subset; the message is one line."""


def parse_pattern(pattern: str, allowed: int = JSON_SAFE_ASCII) -> list[PatternAtom]:
    """A regex of the supported subset as atoms, matched against the whole string.

    The subset: literal characters, ``.``, ``\\d \\w \\s`` (and ``\\D \\W \\S``), escaped
    punctuation, character classes ``[a-z0-9_]`` (negated with ``^``), each with an optional
    ``? * + {n} {n,} {n,m}``; a leading ``^`` and a trailing ``$`` are allowed (the match is whole
    anyway). Characters are printable ASCII without ``"`` and ``\\`` (``allowed``). No groups,
    alternation, lazy quantifiers, anchors inside or back-references (PatternError).
    """
    atoms: list[PatternAtom] = []
    i, n = 0, len(pattern)
    if pattern.startswith("^"):
        i = 1
    if pattern.endswith("$") and not pattern.endswith("\\$") and n > i:
        n -= 1

    def char_mask(ch: str) -> int:
        if len(ch.encode("utf-8")) != 1 or not (allowed >> ord(ch)) & 1:
            raise PatternError(f"pattern: character {ch!r} is not supported (printable ASCII without '\"' and '\\\\')")
        return 1 << ord(ch)

    def escape(ch: str) -> int:
        if ch in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[ch] & allowed
        if ch.lower() in _CLASS_ESCAPES and ch.isupper():
            return allowed & ~_CLASS_ESCAPES[ch.lower()]
        if ch.isalnum():
            raise PatternError(f"pattern: escape '\\{ch}' is not supported")
        return char_mask(ch)

    while i < n:
        ch = pattern[i]
        if ch in "()|":
            raise PatternError("pattern: groups and alternation are not supported (use literals, classes and quantifiers)")
        if ch in "^$":
            raise PatternError("pattern: anchors are only supported at the ends")
        if ch in "*+?{":
            raise PatternError(f"pattern: quantifier {ch!r} at position {i} follows nothing")
        if ch == ".":
            mask, i = allowed, i + 1
        elif ch == "\\":
            if i + 1 >= n:
                raise PatternError("pattern: ends with a lone backslash")
            mask, i = escape(pattern[i + 1]), i + 2
        elif ch == "[":
            mask, i = _parse_class(pattern, i + 1, n, char_mask, escape, allowed)
        else:
            mask, i = char_mask(ch), i + 1
        lo, hi, i = _parse_quantifier(pattern, i, n)
        if not mask:
            raise PatternError("pattern: a character class matches no supported character")
        atoms.append((mask, lo, hi))
    return atoms


def _parse_class(p: str, i: int, n: int, char_mask: Callable[[str], int], escape: Callable[[str], int],
                 allowed: int) -> tuple[int, int]:
    negate = i < n and p[i] == "^"
    if negate:
        i += 1
    mask = 0
    first = True
    while True:
        if i >= n:
            raise PatternError("pattern: unterminated character class")
        ch = p[i]
        if ch == "]" and not first:
            i += 1
            break
        first = False
        if ch == "\\":
            if i + 1 >= n:
                raise PatternError("pattern: unterminated character class")
            m, i = escape(p[i + 1]), i + 2
            mask |= m
            continue
        if i + 2 < n and p[i + 1] == "-" and p[i + 2] != "]":
            a, b = ch, p[i + 2]
            if ord(a) > ord(b):
                raise PatternError(f"pattern: bad range {a}-{b}")
            for c in range(ord(a), ord(b) + 1):
                if c < 128 and (allowed >> c) & 1:
                    mask |= 1 << c
            i += 3
            continue
        mask |= char_mask(ch)
        i += 1
    return (allowed & ~mask if negate else mask), i


def _parse_quantifier(p: str, i: int, n: int) -> tuple[int, int | None, int]:
    if i >= n:
        return 1, 1, i
    ch = p[i]
    if ch == "?":
        lo, hi, i = 0, 1, i + 1
    elif ch == "*":
        lo, hi, i = 0, None, i + 1
    elif ch == "+":
        lo, hi, i = 1, None, i + 1
    elif ch == "{":
        j = p.find("}", i)
        if j < 0:
            raise PatternError("pattern: unterminated {n,m} quantifier")
        body = p[i + 1:j]
        try:
            if "," in body:
                a, b = body.split(",", 1)
                lo, hi = int(a), (int(b) if b.strip() else None)
            else:
                lo = hi = int(body)
        except ValueError:
            raise PatternError(f"pattern: bad quantifier {{{body}}}") from None
        if lo < 0 or (hi is not None and hi < lo) or max(lo, hi or 0) > _MAX_REPEAT:
            raise PatternError(f"pattern: quantifier {{{body}}} must satisfy 0 <= n <= m <= {_MAX_REPEAT}")
        i = j + 1
    else:
        return 1, 1, i
    if i < n and p[i] in "?+*{":
        raise PatternError("pattern: lazy, possessive or stacked quantifiers are not supported")
    return lo, hi, i


def pattern_fragment(nfa: Nfa, atoms: list[PatternAtom]) -> Frag:
    """The NFA fragment of parsed pattern atoms (the bytes inside the JSON string's quotes)."""
    return nfa.seq(*(nfa.repeat(lambda m=mask: nfa.cls(m), lo, hi) for mask, lo, hi in atoms))
