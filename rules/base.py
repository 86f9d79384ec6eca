"""The rule protocol, its registration and the helpers rules share (confidence, evidence).

A rule is declarative in spirit: an id, a category, the kind of time that category explains
(:class:`rules.registry.Kind`), the features it needs (alternatives: the rule runs when every
feature of at least one alternative is available, else it is "skipped: needs …"), and an
``evaluate(ctx)`` that returns a :class:`Finding`, or a string saying why it did not fire.

A rule reads as the article's triage row: it holds one :class:`Triage`, and each check is one
call — :meth:`Triage.crossed` (value at or past a threshold), :meth:`Triage.below` (at or under
one), :meth:`Triage.judged` (a row shown either way), :meth:`Triage.context` (a number without
a threshold) — that adds the evidence row (numeric ``threshold`` with its ``op`` and whether it
``crossed``), its strength, and the reason when it did not cross. The rule builds its result with
:func:`finding`, or its pass reason with :func:`reason`; the engine fills the finding's ``rule_id``
and ``category`` from the decorator.

A rule with several paths is declared as checks (:func:`checked_rule`, :func:`check`): one small
function per path with what it needs, which paths it is tried before and the thresholds it reads;
:func:`run_checks` picks the path.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.ground.units import fill
from rules.evidence import FIT_ALONE_SHARE, name_of
from rules.features import Features
from rules.model import Evidence, Finding
from rules.registry import REGISTRY, Kind, register

Outcome = Finding | str  # a finding, or the reason it did not fire


@dataclass
class RuleContext:
    """What a rule sees: features, its own thresholds, the general ones, the SLO."""

    features: Features
    th: Mapping[str, Any]
    general: Mapping[str, Any]
    slo: Mapping[str, float]
    black_box: bool
    #: every rule's thresholds by table (for a rule that defers to another rule's judgement)
    all_th: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def th_of(self, table: str) -> Mapping[str, Any]:
        """Another table's thresholds (``[queue]`` …); the defaults when the engine gave none."""
        if table in self.all_th:
            return self.all_th[table]
        from rules.config import load_thresholds

        return load_thresholds(None)[table]

    def v(self, name: str, default: Any = None) -> Any:
        return self.features.value(name, default)

    def has(self, name: str) -> bool:
        return self.features.available(name)

    @property
    def ttft_p95_s(self) -> float | None:
        return self.v("ttft_p95_s")

    def explained(self, share: float | None) -> tuple[float | None, float | None]:
        """(seconds, % of TTFT p95) for a share of TTFT among the slowest requests."""
        p95 = self.ttft_p95_s
        if share is None or p95 is None:
            return None, None
        share = min(max(float(share), 0.0), 1.0)
        return share * p95, share * 100.0

    def stage_population(self, names: tuple[str, ...]) -> float | None:
        """The named stages' share of every steady request's TTFT, summed (feature
        ``stage_shares_all``): a finding's ``population_share`` when its cause is those stages."""
        shares = self.v("stage_shares_all")
        return sum(float(shares.get(n, 0.0)) for n in names) if shares else None

    @property
    def series_only(self) -> bool:
        """No request has a TTFT: the features come from the engine's metrics alone."""
        return bool(self.v("series_only"))

    def sample_factor(self, n_requests: float | None = None) -> float:
        """sqrt(n / min_requests) capped at 1, n the completed requests (or ``n_requests``: a rule
        whose sample is another set, e.g. every request sent); series-only captures without a
        request count use the scrape windows instead (sqrt(windows / min_series_windows))."""
        n_req = self.v("requests_n") if n_requests is None else n_requests
        if n_req is None and self.series_only:
            n = float(self.v("metrics_windows_n", 0) or 0)
            need = float(self.general.get("min_series_windows", 6))
        else:
            n = float(n_req or 0)
            need = float(self.general.get("min_requests", 20))
        return 1.0 if n >= need else math.sqrt(max(n, 0.0) / need)

    def black_box_scale(self, designed: bool = False) -> float:
        """The confidence factor of client-only evidence: ``[general] black_box_scale`` for a
        load the client happened to send, ``designed_scale`` when the load was ``ttft diagnose``'s
        designed experiment (feature ``designed_by_diagnose``): each step varies one thing (prompt
        length at 1 in flight, then load at short prompts, then the follow-up that tells the
        leading candidates apart), so what changes with it is measured, not read from a mixture; and
        likewise for the probe's own designs (feature ``designed_probe``: a sweep, a shared prefix, long
        prompts injected among short ones). ``designed``: the rule found its evidence designed-like in
        the load itself (one thing varied, nothing else in flight), and says so in its finding."""
        key = ("designed_scale" if designed or self.v("designed_by_diagnose") or self.v("designed_probe")
               else "black_box_scale")
        return float(self.general.get(key, self.general.get("black_box_scale", 0.6)))

    def confidence(self, directness: float, strengths: list[float], black_box: bool = False,
                   n_requests: float | None = None, designed: bool = False) -> float:
        """directness (how directly the evidence measures the cause) x mean strength x the sample's
        weight, x the black-box scale for evidence seen only from the client (:meth:`black_box_scale`).

        The sample's weight is :meth:`sample_factor` ``f`` of ``n_requests`` for evidence at its
        thresholds (mean strength 0.5), rising to ``f (2 - f)`` for evidence twice past them (1.0):
        a few requests can show an effect many times its threshold, not one at its edge."""
        s = sum(strengths) / len(strengths) if strengths else 0.5
        f = self.sample_factor(n_requests)
        margin = min(max((s - 0.5) / 0.5, 0.0), 1.0)
        c = directness * s * (f + (1.0 - f) * f * margin)
        if black_box:
            c *= self.black_box_scale(designed)
        return round(min(max(c, 0.0), 1.0), 3)


def strength(value: float | None, threshold: float, higher_is_worse: bool = True, bound: float | None = None) -> float:
    """How far a value is past its threshold: 0.5 at the threshold, 1.0 at 2x (or 1/2x), 0 below.

    ``bound`` is the most a bounded measure can reach (1 for a share or an R²). When 2x the
    threshold lies past it (a share judged at 60%), the value could never be 2x: full strength is
    at the bound instead, linear from the threshold (an R² of 0.98 against 0.6 is as strong as a
    fit gets, not 0.85 of it)."""
    if value is None or threshold is None:
        return 0.0
    v, t = float(value), float(threshold)
    if higher_is_worse and bound is not None and t > 0 and t < bound < 2.0 * t:
        return 0.0 if v < t else min(1.0, 0.5 + 0.5 * (v - t) / (bound - t))
    if not higher_is_worse:
        v, t = (1.0 / v if v > 0 else math.inf), (1.0 / t if t > 0 else math.inf)
    if t <= 0:
        return 1.0 if v > 0 else 0.0
    if v < t:
        return 0.0
    return min(1.0, 0.5 + 0.5 * math.log2(v / t)) if math.isfinite(v) else 1.0


#: the bound of a measure by its evidence unit (a share of TTFT, of time, of requests is at most 1)
BOUND_BY_UNIT: dict[str, float] = {"share": 1.0}


def check_strength(value: Any, threshold: Any, op: str, unit: str, bound: float | None = None) -> float:
    """:func:`strength` of one check as an evidence row states it: ``op`` says which way is worse,
    ``bound`` defaults to the unit's (:data:`BOUND_BY_UNIT`)."""
    return strength(value, threshold, higher_is_worse=op in (">=", ">"),
                    bound=BOUND_BY_UNIT.get(unit) if bound is None else bound)


_OPS: dict[str, Callable[[Any, Any], bool]] = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


@dataclass
class Triage:
    """One rule's evidence as it is read: rows in order, the strength of each check that counts,
    and the reasons of the checks that did not cross.

    ``row`` is the evidence row's key (:mod:`rules.evidence`, which names it). ``key`` names the
    rule's threshold (``ctx.th[key]``); ``threshold`` gives the number instead
    (an SLO target, another table's value). A value of None never crosses and adds no row to
    :meth:`crossed`. Strength: :func:`strength` of value against threshold, higher is worse for
    ``>=``/``>``, lower for ``<=``/``<``. One rule evaluation, one thread.
    """

    ctx: RuleContext
    evidence: list[Evidence] = field(default_factory=list)
    strengths: list[float] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    def _limit(self, key: str | None, threshold: float | None) -> Any:
        if threshold is not None:
            return threshold
        if key is None:
            raise ValueError("a check needs a threshold key or a threshold")
        return self.ctx.th[key]

    def _weigh(self, value: Any, limit: Any, op: str, unit: str, bound: float | None) -> None:
        self.strengths.append(check_strength(value, limit, op, unit, bound))

    def crossed(self, row: str, value: Any, key: str | None, unit: str, meaning: str, *, op: str = ">=",
                threshold: float | None = None, miss: str | None = None, weigh: bool = True,
                bound: float | None = None) -> bool:
        """When ``value op threshold``: a crossed row and (``weigh``) its strength; True. Else False,
        and ``miss`` (a ``str.format`` template of ``value`` and ``threshold``) joins the pass
        reason when the value is known. ``bound``: the most the measure can be (:func:`strength`;
        a ``share`` row's is 1 without saying)."""
        limit = self._limit(key, threshold)
        hit = value is not None and _OPS[op](value, limit)
        if hit:
            self.evidence.append(Evidence(name_of(row), value, limit, unit, meaning, op=op, crossed=True, key=row))
            if weigh:
                self._weigh(value, limit, op, unit, bound)
        elif value is not None and miss is not None:
            self.misses.append(fill(miss, value=value, threshold=limit))
        return hit

    def below(self, row: str, value: Any, key: str | None, unit: str, meaning: str, *, op: str = "<=",
              threshold: float | None = None, miss: str | None = None, weigh: bool = True) -> bool:
        """:meth:`crossed` for a value that fires at or under its threshold (lower is worse)."""
        return self.crossed(row, value, key, unit, meaning, op=op, threshold=threshold, miss=miss, weigh=weigh)

    def judged(self, row: str, value: Any, key: str | None, unit: str, meaning: str, *, op: str = ">=",
               threshold: float | None = None, weigh: bool = False, bound: float | None = None) -> bool:
        """A row shown whether or not ``value op threshold`` (``crossed`` says which); its strength
        only when ``weigh`` (``bound`` as for :meth:`crossed`). Returns whether it crossed."""
        limit = self._limit(key, threshold)
        hit = value is not None and _OPS[op](value, limit)
        self.evidence.append(Evidence(name_of(row), value, limit, unit, meaning, op=op, crossed=hit, key=row))
        if weigh:
            self._weigh(value, limit, op, unit, bound)
        return hit

    def context(self, row: str, value: Any, unit: str, meaning: str) -> None:
        """A row without a threshold: what the number says about the cause."""
        self.evidence.append(Evidence(name_of(row), value, None, unit, meaning, key=row))

    def context_of(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """A context row for each (row key, feature, meaning) whose feature is known, in the
        feature's catalogued unit; unknown features are left out."""
        for row, feature, meaning in rows:
            value = self.ctx.v(feature)
            if value is not None:
                self.context(row, value, self.ctx.features.get(feature).unit, meaning)

    def add(self, row: Evidence, strength_: float | None = None) -> None:
        """A hand-built row (e.g. an SLO with its target as text), with a strength when it counts."""
        self.evidence.append(row)
        if strength_ is not None:
            self.strengths.append(strength_)

    def add_strength(self, value: float) -> None:
        """A strength that no single row gives (a flag, a max over rows)."""
        self.strengths.append(value)

    def pass_reason(self, default: str = "") -> str:
        """Why the rule did not fire: the misses joined, else ``default``."""
        return "; ".join(self.misses) or default

    def confidence(self, directness: float, black_box: bool = False, n_requests: float | None = None,
                   designed: bool = False) -> float:
        """:meth:`RuleContext.confidence` over the strengths collected."""
        return self.ctx.confidence(directness, self.strengths, black_box=black_box, n_requests=n_requests,
                                   designed=designed)


#: the share of a designed group that chance alone puts above its control's 90th percentile
ABOVE_P90_CHANCE = 0.10


def beyond_chance(share: float | None, chance: float, n: float | None, p_max: float) -> bool:
    """Whether ``share`` of ``n`` trials is more than ``chance`` alone gives: the one-sided
    binomial tail P(X >= hits | n, chance) is at most ``p_max``. Unlike a ratio to chance, this
    holds at any base rate (a share can never be 2x a chance of 60%) and weighs the sample size."""
    if share is None or not n or n <= 0:
        return False
    n = int(round(n))  # a count, though features carry it as a float
    hits = int(round(share * n))
    if hits == 0:
        return False
    p0 = min(max(float(chance), 0.0), 1.0)
    if p0 <= 0.0:
        return True
    if p0 >= 1.0:
        return False
    tail = sum(math.comb(n, k) * p0 ** k * (1.0 - p0) ** (n - k) for k in range(hits, n + 1))
    return tail <= p_max


def more_often_p(hits_a: int, n_a: int, hits_b: int, n_b: int) -> float | None:
    """One-sided Fisher exact test: the chance that group A (``n_a`` trials) holds ``hits_a`` or more
    of the ``hits_a + hits_b`` hits were they spread over both groups' trials at random (the
    hypergeometric tail). Unlike :func:`beyond_chance` it weighs group B's own count, not a rate
    taken as known: 2 of 5 against 0 of 51 is rare, against 0 of 3 it is not. None when either
    group is empty."""
    if n_a <= 0 or n_b <= 0:
        return None
    n, k = n_a + n_b, hits_a + hits_b
    total = math.comb(n, n_a)
    return sum(math.comb(k, x) * math.comb(n - k, n_a - x) for x in range(hits_a, min(k, n_a) + 1)) / total


def chance_row(t: Triage, row: str, share: float | None, n: float | None, chance: float, p_max: float,
               meaning: str) -> None:
    """When ``share`` of ``n`` is beyond ``chance`` (:func:`beyond_chance` at ``p_max``), a crossed row at full
    strength: a designed A/B whose effect is no spread of its control (``meaning`` says of what)."""
    if beyond_chance(share, chance, n, p_max):
        t.add(Evidence(name_of(row), share, f"beyond {chance:.0%} chance (p <= {p_max:g})", "share",
                       f"{share * n:.0f} of {n:.0f}: {meaning}", crossed=True, key=row), 1.0)


#: the note's tail when :func:`lone_sweep` holds
LONE_SWEEP_NOTE = "; the requests arrived alone, so their prompts' spread is a prompt sweep (designed-like)"


def lone_sweep(t: Triage, alone_min: float) -> bool:
    """Whether the prompt fit's requests arrived alone in flight (feature ``ttft_prompt_fit_alone_frac``
    at least ``alone_min``): a workload's spread of prompts at one in flight varies one thing, as a
    designed prompt sweep does. Adds the share as a context row when it is known."""
    alone = t.ctx.v("ttft_prompt_fit_alone_frac")
    lone = alone is not None and alone >= alone_min
    if alone is not None:
        t.context(FIT_ALONE_SHARE, alone, "share",
                  "nothing else in flight when they arrived: the spread of their prompts is a prompt sweep"
                  if lone else "some met other requests in flight")
    return lone


def reason(template: str, /, **values: Any) -> str:
    """Why a rule did not fire, or fired at another's door: ``template`` (a sentence with named
    ``str.format`` fields) filled with ``values`` by :func:`diag.ground.units.fill`, the one formatter of
    the rules' sentences (a missing value reads ``-``)."""
    return fill(template, **values)


def finding(title: str, confidence: float, explained_s: float | None, explained_pct: float | None,
            evidence: list[Evidence], next_checks: list[str], **kw: Any) -> Finding:
    """The running rule's :class:`Finding`; the engine fills ``rule_id`` and ``category`` from the
    rule's decorator (``@rule(id, category, …)``)."""
    return Finding("", "", title, confidence, explained_s, explained_pct, evidence, next_checks, **kw)


def engine_checks(ctx: RuleContext, by_engine: Mapping[str, str], common: Sequence[str] = ()) -> list[str]:
    """What to check next in the terms of the engines the capture came from (feature
    ``engines_seen``): their lines of ``by_engine`` (``{engine: line}`` of one rule, as
    :func:`diag.ground.external.next_checks` gives it; an engine key matches a named engine that contains
    it, ``ttft-engine`` is ``bundled``), in ``by_engine``'s order, then ``common``. Every engine's
    line when the capture names none of them (client only, or an engine with no line)."""
    seen = [str(s).lower().replace(".", "").replace("-", "").replace("_", "") for s in (ctx.v("engines_seen") or {})]
    seen = ["bundled" if s.startswith("ttftengine") else s for s in seen]
    names = [k for k in by_engine if any(k in s for s in seen)]
    return [by_engine[k] for k in (names or list(by_engine))] + list(common)


@dataclass(frozen=True)
class Rule:
    """A registered rule: ``evaluate`` is its function (:func:`rule`) or the runner of its declared
    checks (:func:`checked_rule`); ``kind`` is the kind of time its category explains."""

    id: str
    category: str
    declared_needs: tuple[tuple[str, ...], ...]
    evaluate: Callable[[RuleContext], Outcome]
    kind: Kind
    description: str = ""
    tier: int = 2
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def needs(self) -> tuple[tuple[str, ...], ...]:
        """Alternative feature sets, one of which must be available: as declared, or for a rule of
        checks each check's ``needs`` in the order the checks are tried, less those that hold
        another's (a check that needs more than another is never the one that lets the rule run:
        ``("a", "b")`` beside ``("a",)``, or the same set twice, is left out)."""
        if self.declared_needs:
            return self.declared_needs
        alts = [c.needs for c in checks_of(self.id)]
        return tuple(a for i, a in enumerate(alts)
                     if not any(set(b) <= set(a) and (len(set(b)) < len(set(a)) or j < i)
                                for j, b in enumerate(alts) if j != i))


@dataclass(frozen=True)
class Check:
    """One path of a rule, ``<rule id>.<path>``: applicable when every feature in ``needs`` is
    available and ``when`` (if given) holds; tried before the checks named in ``before``.
    ``reads`` names the thresholds it judges by (``key`` of its rule's table, ``table.key`` of
    another's). ``judge`` returns a :class:`Finding` or its pass reason.

    The first applicable check answers for the rule, except: a pass whose ``final`` is False (or a
    callable of the context that says False) lets the next applicable check be tried, the reasons
    joined by "; "; a finding of a ``weighed`` check lets the next one be tried too, and the surer
    finding of those that fired answers."""

    id: str
    needs: tuple[str, ...]
    judge: Callable[[RuleContext], Outcome]
    before: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    when: Callable[[RuleContext], bool] | None = None
    final: bool | Callable[[RuleContext], bool] = True
    weighed: bool = False

    @property
    def rule_id(self) -> str:
        return self.id.partition(".")[0]

    def applies(self, ctx: RuleContext) -> bool:
        return all(ctx.has(n) for n in self.needs) and (self.when is None or self.when(ctx))

    def is_final(self, ctx: RuleContext) -> bool:
        return self.final(ctx) if callable(self.final) else self.final


#: rule id -> its checks by id, in declaration order
CHECKS: dict[str, dict[str, Check]] = {}


def check(id: str, needs: tuple[str, ...], *, before: tuple[str, ...] = (), reads: tuple[str, ...] = (),
          when: Callable[[RuleContext], bool] | None = None, final: bool | Callable[[RuleContext], bool] = True,
          weighed: bool = False) -> Callable[[Callable[[RuleContext], Outcome]], Callable[[RuleContext], Outcome]]:
    """Declare ``fn`` as check ``id`` (``<rule id>.<path>``) of a rule registered with
    :func:`checked_rule` (decorator; fields as :class:`Check`)."""

    def deco(fn: Callable[[RuleContext], Outcome]) -> Callable[[RuleContext], Outcome]:
        rule_id, dot, _ = id.partition(".")
        if not dot or id in CHECKS.get(rule_id, {}):
            raise ValueError(f"a check id is '<rule id>.<path>', declared once: {id!r}")
        CHECKS.setdefault(rule_id, {})[id] = Check(id, tuple(needs), fn, tuple(before), tuple(reads), when, final,
                                                    weighed)
        return fn

    return deco


def checks_of(rule_id: str) -> list[Check]:
    """``rule_id``'s checks in the order they are tried: each before the ones its ``before`` names,
    otherwise in declaration order. ValueError on an unknown name or a cycle in ``before``."""
    declared = CHECKS.get(rule_id, {})
    after: dict[str, set[str]] = {cid: set() for cid in declared}  # check -> the checks it must follow
    for c in declared.values():
        for later in c.before:
            if later not in declared:
                raise ValueError(f"{c.id} is tried before {later!r}, which {rule_id} does not declare")
            after[later].add(c.id)
    order: list[Check] = []
    while len(order) < len(declared):
        ready = [cid for cid, deps in after.items() if not deps and declared[cid] not in order]
        if not ready:
            raise ValueError(f"the checks of {rule_id} are tried before each other in a cycle")
        order.append(declared[ready[0]])
        for deps in after.values():
            deps.discard(ready[0])
    return order


def run_checks(rule_id: str, ctx: RuleContext) -> Outcome:
    """Try ``rule_id``'s checks in order (:class:`Check` says which answers): the surer finding of
    those that fired, else the pass reasons of those tried, joined by "; " ("" when none applied)."""
    reasons: list[str] = []
    found: list[Finding] = []
    for c in checks_of(rule_id):
        if not c.applies(ctx):
            continue
        out = c.judge(ctx)
        if isinstance(out, Finding):
            found.append(out)
            if not c.weighed:
                break
        else:
            reasons.append(out)
            if c.is_final(ctx):
                break
    if found:
        return max(found, key=lambda f: f.confidence)
    return "; ".join(r for r in reasons if r)


def checked_rule(id: str, category: str, description: str, tier: int = 2, *, kind: Kind) -> None:
    """Register rule ``id`` whose paths are its declared checks (:func:`check`, ids ``<id>.<path>``):
    the runner tries them (:func:`run_checks`) and its ``needs`` are theirs. ``kind``: the kind of
    time ``category`` explains (:func:`rules.registry.register` checks it)."""
    register(Rule(id, category, (), lambda ctx: run_checks(id, ctx), kind, description, tier))


def _first_sentence(doc: str) -> str:
    """A docstring's first sentence (up to ". " or its first blank line), on one line."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    head, dot, _ = para.partition(". ")
    return head + "." if dot else para


def rule(id: str, category: str, needs: tuple[tuple[str, ...], ...], description: str = "", tier: int = 2, *,
         kind: Kind) -> Callable[[Callable[[RuleContext], Outcome]], Callable[[RuleContext], Outcome]]:
    """Register ``fn`` as a rule (decorator); ``kind`` as for :func:`checked_rule`."""

    def deco(fn: Callable[[RuleContext], Outcome]) -> Callable[[RuleContext], Outcome]:
        register(Rule(id, category, needs, fn, kind, description or _first_sentence(fn.__doc__ or ""), tier))
        return fn

    return deco


def missing_reason(rule_: Rule, features: Features) -> str | None:
    """None when some alternative of ``needs`` is fully available, else "skipped: needs …"."""
    if not rule_.needs:
        return None
    parts = []
    for alt in rule_.needs:
        missing = [n for n in alt if not features.available(n)]
        if not missing:
            return None
        by_reason: dict[str, list[str]] = {}
        for n in missing:
            by_reason.setdefault(str(features.get(n).reason), []).append(n)
        parts.append(" and ".join(f"{' + '.join(ns)} ({why})" for why, ns in by_reason.items()))
    return "skipped: needs " + "; or ".join(parts)
