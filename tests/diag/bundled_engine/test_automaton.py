"""Byte automata: fragments, the DFA (trimmed, padded), and the pattern subset."""

from __future__ import annotations

import re

import pytest

from diag.bundled_engine.automaton import (PAD, AutomatonTooLarge, Nfa, PatternError, byte_chars, determinize, parse_pattern,
                                   pattern_fragment)


def _dfa(build, max_states: int = 10_000):
    nfa = Nfa(100_000)
    return determinize(nfa, build(nfa), max_states)


def test_fragments_make_the_language_they_say():
    d = _dfa(lambda n: n.seq(n.lit(b"a"), n.opt(n.lit(b"b")), n.star(n.cls(byte_chars("xy"))), n.lit(b"!")))
    for ok in (b"a!", b"ab!", b"axyx!", b"abyy!"):
        assert d.accepts(ok), ok
    for bad in (b"", b"a", b"b!", b"abb!", b"az!", b"a!!"):
        assert not d.accepts(bad), bad


@pytest.mark.parametrize("lo,hi", [(0, 0), (0, 1), (1, 3), (2, 2), (0, None), (2, None)])
def test_separated_lists_count_their_items(lo, hi):
    d = _dfa(lambda n: n.sep_list(lambda: n.lit(b"x"), lambda: n.lit(b","), lo, hi))
    for k in range(6):
        text = b",".join([b"x"] * k)
        assert d.accepts(text) == (k >= lo and (hi is None or k <= hi)), (lo, hi, k)
    assert not d.accepts(b"x,") and not d.accepts(b",x")


def test_dfa_is_trimmed_padded_and_knows_its_exits():
    d = _dfa(lambda n: n.alt(n.lit(b"ab"), n.seq(n.lit(b"ac"), n.cls(0))))  # "ac" leads nowhere: trimmed
    s = d.walk(0, b"a")
    assert d.walk(s, b"c") == d.dead and d.walk(s, b"b") != d.dead
    assert (d.table[:, d.byte_class[PAD]] == list(range(d.table.shape[0]))).all()  # padding keeps every state
    assert d.table.shape[1] < 10  # columns are byte classes, not bytes
    end = d.walk(0, b"ab")
    assert d.accepting[end] and not d.exits[end] and d.exits[0]
    assert not d.accepting[d.dead] and (d.table[d.dead] == d.dead).all()


def test_state_limits_fail_with_one_line():
    with pytest.raises(AutomatonTooLarge, match="more than 5 automaton states"):
        Nfa(5).lit(b"abcdefgh")
    with pytest.raises(AutomatonTooLarge, match="more than 3 automaton states"):
        _dfa(lambda n: n.lit(b"abcdef"), max_states=3)


@pytest.mark.parametrize("pattern,good,bad", [
    ("^[a-z]{2,4}$", ["ab", "abcd"], ["a", "abcde", "aB", ""]),
    (r"\d{3}-\d{2}", ["123-45"], ["12-345", "123-4a"]),
    (r"[A-Z][a-z]*\.?", ["A", "Abc", "Abc."], ["abc", "A.b"]),
    (r"[^0-9 ]+", ["abc", "x_y"], ["a b", "a1", ""]),
    (r"\w+@\w+\.com", ["me@x.com"], ["me@x.org", "@x.com"]),
    ("plain", ["plain"], ["plai", "plainx"]),
])
def test_the_pattern_subset_matches_like_re_fullmatch(pattern, good, bad):
    atoms = parse_pattern(pattern)
    d = _dfa(lambda n: pattern_fragment(n, atoms))
    for text in good:
        assert d.accepts(text.encode()) and re.fullmatch(pattern, text), text
    for text in bad:
        assert not d.accepts(text.encode()) and not re.fullmatch(pattern, text), text


@pytest.mark.parametrize("pattern,msg", [
    ("(ab)+", "groups and alternation"),
    ("a|b", "groups and alternation"),
    ("a+?", "lazy"),
    ('say "hi"', "not supported"),
    ("[a-z", "unterminated"),
    ("a{3,1}", "quantifier"),
    ("a^b", "anchors"),
    (r"\p", "escape"),
])
def test_patterns_outside_the_subset_are_refused(pattern, msg):
    with pytest.raises(PatternError, match=re.escape(msg)):
        parse_pattern(pattern)
