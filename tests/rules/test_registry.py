"""Every rule written is a rule that runs: each ``@rule`` in a ``rules/`` module is registered once
the rule engine is imported, with its category, the kind of time that category explains and the
features it needs; the category lists are the registry's.

``rules/runner.py`` imports the rule modules (the import registers their rules); a new module left
out of that list would silently never run. This test reads the sources, not the registry, so it
catches exactly that.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rules.runner  # imports every rule module it knows
from diag.analysis import analyze_paths
from rules.base import REGISTRY, checked_rule, rule
from rules.model import FAILURES, HEALTHY, INCONCLUSIVE, NO_DATA, Finding
from rules.overrides import apply_overrides
from rules.registry import Kind, categories, kind_of
from rules.verdict import is_candidate
from support.rulectx import new_ttft_rule

RULES_DIR = Path(rules.runner.__file__).resolve().parent


def _declared() -> dict[str, str]:
    """rule id -> the module that declares it with ``@rule("id", …)`` or ``checked_rule("id", …)``."""
    out: dict[str, str] = {}
    for path in sorted(RULES_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "checked_rule"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                out[str(node.args[0].value)] = path.name
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == "rule"
                            and dec.args and isinstance(dec.args[0], ast.Constant)):
                        out[str(dec.args[0].value)] = path.name
    return out


def test_every_declared_rule_is_registered() -> None:
    declared = _declared()
    assert len(declared) >= 15
    missing = {rid: mod for rid, mod in declared.items() if rid not in REGISTRY}
    assert not missing, f"rules declared but never registered (import their module in rules/runner.py): {missing}"


def test_every_rule_names_a_category_of_its_own_and_what_it_needs() -> None:
    """A rule's category is never one of the verdict's own states (healthy, no_data, inconclusive),
    which the engine sets without a rule."""
    for rid, r in REGISTRY.items():
        assert r.category not in (HEALTHY, NO_DATA, INCONCLUSIVE), (rid, r.category)
        assert r.needs and all(r.needs), rid  # at least one set of features, none empty


def test_the_category_lists_hold_each_cause_under_the_kind_of_time_it_explains() -> None:
    """The article's causes of TTFT are TTFT categories, decode and interference ITL ones; start-up
    and the load generator are neither. failures is a measurement outcome, in no list of
    bottleneck categories, though its rule's kind is OTHER too."""
    ttft, itl, other = (set(categories(k)) for k in (Kind.TTFT, Kind.ITL, Kind.OTHER))
    assert {"queue", "tokenize", "prefill_compute", "kv_cache", "comm", "network", "head_of_line",
            "pd_transfer"} <= ttft
    assert itl == {"decode", "interference"} and other == {"cold_start", "loadgen"}
    assert len(categories()) == len(set(categories())) and set(categories()) == ttft | itl | other
    assert FAILURES not in categories() and kind_of(FAILURES) is Kind.OTHER
    assert kind_of(HEALTHY) is None and kind_of(INCONCLUSIVE) is None


def test_every_rule_declares_a_kind_and_a_category_has_one() -> None:
    kinds: dict[str, set[Kind]] = {}
    for r in REGISTRY.values():
        assert isinstance(r.kind, Kind), (r.id, r.kind)
        kinds.setdefault(r.category, set()).add(r.kind)
    assert all(len(k) == 1 for k in kinds.values()), kinds


def test_a_registration_without_a_known_kind_or_against_its_category_s_is_refused() -> None:
    """The kind is stated at every registration, as a :class:`Kind`; a rule that gives its category
    another kind than the rules already registered for it is refused, and the registry stays as it was."""
    before = dict(REGISTRY)
    with pytest.raises(ValueError, match=r"category 'decode' explains Kind\.TTFT .* rule 'decode' .* Kind\.ITL"):
        rule("t_decode_as_ttft", "decode", needs=(("x",),), kind=Kind.TTFT)(lambda ctx: "")
    with pytest.raises(ValueError, match=r"kind='ttft': it must be one of Kind\.TTFT, Kind\.ITL, Kind\.OTHER"):
        checked_rule("t_bare", "t_bare", "a bare string for a kind", kind="ttft")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="kind"):
        checked_rule("t_none", "t_none", "no kind")  # type: ignore[call-arg]
    assert REGISTRY == before
    try:
        rule("t_decode_too", "decode", needs=(("x",),), kind=Kind.ITL)(lambda ctx: "")
        assert REGISTRY["t_decode_too"].kind is Kind.ITL
    finally:
        REGISTRY.pop("t_decode_too", None)


def test_a_new_rule_s_category_reaches_the_readers_of_the_registry() -> None:
    """The lists are read from the registry when used, never kept from before a rule registered: a
    category that a new rule brings is a TTFT category, a candidate for the verdict, and what the
    overrides table says of TTFT findings applies to it."""
    with new_ttft_rule() as cat:
        assert cat in categories() and cat in categories(Kind.TTFT) and kind_of(cat) is Kind.TTFT
        assert is_candidate(Finding(cat, cat, "t", 0.9, None, None, [], []), itl_broken=False)
        f = Finding(cat, cat, "t", 0.9, None, None, [], [])
        apply_overrides([f], all_met=False, ttft_met=True, general={"demote_factor": 0.5, "strong_confidence": 0.7})
        assert (f.confidence, f.tier, f.demoted_by) == (0.45, 3, ["slo"])  # slo_ttft_met: TTFT meets its SLO
        d = analyze_paths([RULES_DIR.parent / "samples" / "queue"]).diagnosis
        assert (d.verdict.category, d.verdict.weight) == (cat, 1.0)  # weighed as a TTFT finding and ranked first


def test_pass_reasons_are_templates_filled_by_diag_units() -> None:
    """A rule's sentence with numbers in it is ``reason(template, **values)`` (``diag.ground.units.fill``),
    never an f-string returned as it is built."""
    built: list[str] = []
    for path in sorted(RULES_DIR.glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Return) and node.value is not None and (
                        isinstance(node.value, ast.JoinedStr)
                        or (isinstance(node.value, ast.BinOp) and any(isinstance(n, ast.JoinedStr)
                                                                      for n in ast.walk(node.value)))):
                    built.append(f"{path.name}:{node.lineno} {fn.name}")
    assert not built, f"pass reasons built as f-strings (use rules.base.reason): {built}"


def test_every_threshold_a_check_reads_is_in_the_defaults() -> None:
    from rules.base import CHECKS
    from rules.config import load_thresholds

    th = load_thresholds(None)
    for rule_id, checks in CHECKS.items():
        if rule_id not in REGISTRY:
            continue
        for c in checks.values():
            for read in c.reads:
                table, _, key = read.rpartition(".")
                assert key in th[table or rule_id], (c.id, read)


def test_the_runner_tries_checks_in_their_declared_order_and_joins_what_passed() -> None:
    from rules.base import CHECKS, RuleContext, check, checks_of, finding, run_checks
    from rules.features import Features

    def fired(conf: float):
        return lambda ctx: finding(f"fired {conf}", conf, None, None, [], [])

    def declare(*paths: tuple) -> None:  # (path, before, judge, options), tried as declared below
        CHECKS.pop("t", None)
        for path, before, judge, opts in paths:
            check(f"t.{path}", needs=opts.pop("needs", ()), before=tuple(f"t.{b}" for b in before), **opts)(judge)

    ctx = RuleContext(Features(), {}, {}, {}, False)
    try:
        declare(("last", (), lambda ctx: "last passed", {}),
                ("weighed", ("last",), fired(0.4), {"weighed": True}),
                ("open", ("weighed",), lambda ctx: "open passed", {"final": lambda ctx: False}),
                ("never", ("open",), fired(1.0), {"needs": ("no_such_feature",)}))
        assert [c.id for c in checks_of("t")] == ["t.never", "t.open", "t.weighed", "t.last"]
        # t.never does not apply; t.open's pass lets the next try; the weighed finding lets the last try
        assert run_checks("t", ctx).title == "fired 0.4"
        declare(("last", (), fired(0.7), {}), ("weighed", ("last",), fired(0.4), {"weighed": True}))
        assert run_checks("t", ctx).title == "fired 0.7"  # the surer of the two
        declare(("last", (), lambda ctx: "last passed", {}),
                ("open", ("last",), lambda ctx: "open passed", {"final": lambda ctx: False}))
        assert run_checks("t", ctx) == "open passed; last passed"
        declare(("last", (), lambda ctx: "last passed", {}), ("first", ("last",), lambda ctx: "first passed", {}))
        assert run_checks("t", ctx) == "first passed"
        declare(("a", ("b",), lambda ctx: "", {}), ("b", ("a",), lambda ctx: "", {}))
        with pytest.raises(ValueError):
            checks_of("t")
        declare(("a", ("nobody",), lambda ctx: "", {}))
        with pytest.raises(ValueError):
            checks_of("t")
    finally:
        CHECKS.pop("t", None)


class _Reads(dict):
    """A rule table that notes each threshold read from it as ``table.key``."""

    def __init__(self, table: str, values: dict, seen: set[str]) -> None:
        super().__init__(values)
        self.table, self.seen = table, seen

    def __getitem__(self, key: str):
        self.seen.add(f"{self.table}.{key}")
        return super().__getitem__(key)

    def get(self, key: str, default=None):
        self.seen.add(f"{self.table}.{key}")
        return super().get(key, default)


def test_a_check_reads_only_the_thresholds_it_declares() -> None:
    from diag.analysis import analyze_paths
    from rules.base import CHECKS, RuleContext
    from rules.config import load_thresholds

    samples = Path(__file__).resolve().parents[2] / "samples"
    th = load_thresholds(None)
    tried = set()
    for sample in sorted(p for p in samples.iterdir() if p.is_dir()):
        dirs = sorted(m.parent for m in sample.rglob("meta.json"))
        if not dirs:
            continue
        feats = analyze_paths(dirs[:2]).diagnosis.features
        for rule_id, checks in CHECKS.items():
            if rule_id not in REGISTRY:
                continue
            for c in checks.values():
                seen: set[str] = set()
                tables = {t: _Reads(t, v, seen) for t, v in th.items()}
                ctx = RuleContext(feats, tables[rule_id], th["general"], {}, bool(feats.value("client_only")),
                                  all_th=tables)
                if not c.applies(ctx):
                    continue
                seen.clear()  # what deciding that it applies read is the when's, not the judge's
                c.judge(ctx)
                tried.add(c.id)
                declared = {r if "." in r else f"{rule_id}.{r}" for r in c.reads}
                assert seen <= declared, (c.id, sample.name, sorted(seen - declared))
    assert {"queue.spans", "queue.sweep", "queue.in_line", "pd_transfer.spans", "lora_adapters.server",
            "lora_adapters.design"} <= tried, tried


#: modules of rules/ that hold the machinery, or readings several rules share, not rules
MACHINERY: frozenset[str] = frozenset({"__init__.py", "base.py", "config.py", "evidence.py", "inconclusive.py",
                                       "long_ramp.py", "model.py", "overrides.py", "registry.py", "runner.py",
                                       "verdict.py"})


def test_every_rule_module_declares_a_rule() -> None:
    modules = {p.name for p in RULES_DIR.glob("*.py")} - MACHINERY
    idle = modules - set(_declared().values())
    assert not idle, f"rules/ modules that declare no rule (machinery goes in MACHINERY): {sorted(idle)}"


def test_a_rule_of_checks_needs_the_alternatives_no_other_check_needs_less_than() -> None:
    """A check that needs a superset of another's (or the same set again) never decides whether the
    rule runs: the rule's ``needs`` (what "skipped: needs ..." lists) leaves it out, in check order."""
    from rules.base import CHECKS, Rule, check

    CHECKS.pop("t", None)
    try:
        for path, needs in (("both", ("a", "b")), ("a", ("a",)), ("again", ("a",)), ("c", ("c", "d")),
                            ("d", ("d",))):
            check(f"t.{path}", needs=needs)(lambda ctx: "")
        assert Rule("t", "t", (), lambda ctx: "", Kind.OTHER).needs == (("a",), ("d",))
        assert Rule("t", "t", (("x",),), lambda ctx: "", Kind.OTHER).needs == (("x",),)
    finally:
        CHECKS.pop("t", None)
