"""The registry of rules, and the kind of time each category explains.

A rule registers (:func:`rules.base.rule`, :func:`rules.base.checked_rule`) with its category and
the :class:`Kind` of time that category's findings explain; :func:`register` holds every rule of a
category to one kind. The categories (:func:`categories`) and their kinds (:func:`kind_of`) are
read from :data:`REGISTRY` when called: importing ``rules`` imports ``rules/runner.py``, which
imports every rule module, so a caller outside the package sees every rule. Call them where the
answer is needed; a module-level constant built from them in a module that a rule module imports
would hold only the rules registered before it.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from rules.model import OUTCOMES

if TYPE_CHECKING:
    from rules.base import Rule


class Kind(Enum):
    """What kind of time a category's findings explain."""

    #: the time to the first token (queue, prefill, the network …): the verdict's candidates
    TTFT = "ttft"
    #: the gaps between tokens after the first (decode, interference)
    ITL = "itl"
    #: neither: the server's start-up (cold_start), the load generator (loadgen), failed requests (failures)
    OTHER = "other"


#: rule id -> rule, in the order the rules register (``rules/runner.py``'s imports): ties rank in it
REGISTRY: dict[str, Rule] = {}


def register(r: Rule) -> None:
    """Put ``r`` in :data:`REGISTRY` under its id. ValueError when its ``kind`` is not a :class:`Kind`,
    or when another rule of its category declared another kind: a category explains one kind of time."""
    if not isinstance(r.kind, Kind):
        raise ValueError(f"rule {r.id!r} declares kind={r.kind!r}: it must be one of "
                         + ", ".join(f"Kind.{k.name}" for k in Kind))
    other = next((o for o in REGISTRY.values() if o.category == r.category and o.id != r.id and o.kind is not r.kind),
                 None)
    if other is not None:
        raise ValueError(f"rule {r.id!r} declares that category {r.category!r} explains Kind.{r.kind.name} time, "
                         f"but rule {other.id!r} of the same category declares Kind.{other.kind.name}")
    REGISTRY[r.id] = r


def kind_of(category: str) -> Kind | None:
    """The kind of time ``category``'s findings explain; None for a category no rule has (healthy,
    inconclusive, no_data)."""
    return next((r.kind for r in REGISTRY.values() if r.category == category), None)


def categories(kind: Kind | None = None) -> tuple[str, ...]:
    """The rules' bottleneck categories (those of ``kind`` when given), each once, in the order their
    rules register; the measurement's outcomes (:data:`rules.model.OUTCOMES`: failures) are not among them."""
    return tuple(dict.fromkeys(r.category for r in REGISTRY.values()
                               if r.category not in OUTCOMES and (kind is None or r.kind is kind)))
