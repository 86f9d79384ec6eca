"""The rule engine: from a capture's tables to a named bottleneck with its evidence.

Front door::

    from rules import run_rules
    d = run_rules(tables, rules_file=None, slo={"ttft_p99": 2.0})
    d.verdict.category, d.verdict.confidence, d.to_dict()  # text: diag.analysis.report.text.format_diagnosis(d)

The numbers rules read are computed by :mod:`rules.features` (one module per theme, one
catalogue of feature names and units). Rules live in small modules (``queueing``, ``kv_cache``,
``compute``, ``itl``, ``edges``), read as triage rows through :class:`rules.base.Triage`, and
register themselves in :data:`REGISTRY`; which finding overrides which is the table in
:mod:`rules.overrides`; thresholds and feature parameters come from ``defaults.toml``,
overridden by a user TOML file. The rule engine does no I/O other than reading that file.
"""

from __future__ import annotations

from rules.base import Rule, RuleContext
from rules.config import RulesFileError, default_thresholds, load_thresholds
from rules.runner import run_rules
from rules.model import FAILURES, HEALTHY, INCONCLUSIVE, NO_DATA, OUTCOMES, Diagnosis, Evidence, Finding, Passed, Skipped
from rules.registry import REGISTRY, Kind, categories, kind_of

__all__ = [
    "FAILURES", "HEALTHY", "INCONCLUSIVE", "NO_DATA", "OUTCOMES", "Diagnosis", "Evidence", "Finding", "Passed", "Skipped", "Rule", "RuleContext",
    "Kind", "REGISTRY", "RulesFileError", "categories", "kind_of", "default_thresholds", "load_thresholds", "run_rules",
]
