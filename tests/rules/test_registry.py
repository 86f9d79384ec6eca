"""Every rule written is a rule that runs: each ``@rule`` in a ``rules/`` module is registered once
the rule engine is imported, with a known category and the features it needs.

``rules/runner.py`` imports the rule modules (the import registers their rules); a new module left
out of that list would silently never run. This test reads the sources, not the registry, so it
catches exactly that.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rules.runner  # imports every rule module it knows
from rules.base import REGISTRY
from rules.model import CATEGORIES, FAILURES

RULES_DIR = Path(rules.runner.__file__).resolve().parent


def _declared() -> dict[str, str]:
    """rule id -> the module that declares it with ``@rule("id", …)``."""
    out: dict[str, str] = {}
    for path in sorted(RULES_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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


def test_every_rule_names_a_known_category_and_what_it_needs() -> None:
    for rid, r in REGISTRY.items():
        assert r.category in CATEGORIES or r.category == FAILURES, (rid, r.category)
        assert r.needs and all(r.needs), rid  # at least one set of features, none empty
