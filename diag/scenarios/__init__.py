"""Reproducible bottleneck scenarios on the bundled engine, and the diagnosis matrix.

Front door: :data:`SCENARIOS` (the catalog), :func:`calibrate`, :func:`run_scenario` and
:func:`check` (run + diagnose, server-side and client-only) with :func:`confusion_table`.
"""

from diag.scenarios.calibrate import Calibration, calibrate
from diag.scenarios.catalog import SCENARIOS, Scenario, get
from diag.scenarios.matrix import MODES, MatrixRow, Verdict, check, confusion_table, diagnose_run, rows_to_dict
from diag.scenarios.runner import ScenarioRun, run_scenario

__all__ = ["Calibration", "MODES", "MatrixRow", "SCENARIOS", "Scenario", "ScenarioRun", "Verdict", "calibrate", "check",
           "confusion_table", "diagnose_run", "get", "rows_to_dict", "run_scenario"]
