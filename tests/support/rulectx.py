"""A rule's context for a rule test, with the default thresholds: from hand-set features, or from
the features of saved capture directories; which of a rule's declared checks apply to it; and a
rule of a new category, registered for the length of a test."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from rules.base import REGISTRY, Outcome, RuleContext, checks_of, finding, rule
from rules.config import load_thresholds
from rules.features import Feature, Features
from rules.registry import Kind


def features_of(values: Mapping[str, object], source: str | None = None) -> Features:
    """Features set by hand: each value unitless, available unless None, from ``source``."""
    feats = Features()
    for name, value in values.items():
        feats.add(Feature(name, value, "", value is not None, source=source))  # type: ignore[arg-type]
    return feats


def rule_context(rule_id: str, features: Features, client_only: bool | None = None) -> RuleContext:
    """``rule_id``'s context over ``features`` with the default thresholds (every table, for the
    rules it defers to); ``client_only`` defaults to the features' own ``client_only``."""
    th = load_thresholds(None)
    black_box = bool(features.value("client_only")) if client_only is None else client_only
    return RuleContext(features, th[rule_id], th["general"], {}, black_box, all_th=th)


def capture_context(rule_id: str, dirs: Sequence[str | os.PathLike[str]]) -> RuleContext:
    """``rule_id``'s context over the features of the captures in ``dirs`` (joined when several)."""
    from diag.analysis import analyze_paths

    return rule_context(rule_id, analyze_paths(list(dirs)).diagnosis.features)


def applying(rule_id: str, ctx: RuleContext) -> list[str]:
    """The ids of ``rule_id``'s checks that apply to ``ctx``, in the order they are tried."""
    return [c.id for c in checks_of(rule_id) if c.applies(ctx)]


@contextmanager
def new_ttft_rule(category: str = "t_new") -> Iterator[str]:
    """A rule of ``category`` (its id too: a category no other rule has), of TTFT time, registered while
    the block runs as a new rule module would register it: it fires on every capture with a TTFT,
    explaining all of it. Yields the category."""

    @rule(category, category, needs=(("ttft_p95_s",),), kind=Kind.TTFT)
    def _fires(ctx: RuleContext) -> Outcome:
        return finding("a new cause", 0.99, ctx.ttft_p95_s, 100.0, [], [])

    try:
        yield category
    finally:
        REGISTRY.pop(category, None)
