"""Reproducible bottleneck scenarios on the bundled engine, and the diagnosis matrix.

Front door: :data:`SCENARIOS` (the catalog), :func:`calibrate`, :func:`run_scenario` and
:func:`check` (run + diagnose, server-side and client-only) with :func:`confusion_table`;
the random matrix: :func:`draw` (a scenario drawn from wide ranges, a pure function of seed and
index) and :func:`near_miss_draw` (the near-miss space: the mechanism present, not the cause),
:func:`check_random` and :class:`RandomResult` (accuracy, outcomes per family under the verdict
contract, reliability, flip rate and agreement, misses).
"""

from diag.analysis.scenarios.calibrate import Calibration, calibrate
from diag.analysis.scenarios.catalog import SCENARIOS, Scenario, get
from diag.analysis.scenarios.matrix import MODES, MatrixRow, Verdict, check, confusion_table, diagnose_run, rows_to_dict
from diag.analysis.scenarios.random_draws import Draw, draw, draws, near_miss_draw
from diag.analysis.scenarios.random_matrix import RandomResult, check_random
from diag.analysis.scenarios.runner import ScenarioRun, run_scenario

__all__ = ["Calibration", "Draw", "MODES", "MatrixRow", "RandomResult", "SCENARIOS", "Scenario", "ScenarioRun", "Verdict",
           "calibrate", "check", "check_random", "confusion_table", "diagnose_run", "draw", "draws", "get",
           "near_miss_draw", "rows_to_dict", "run_scenario"]
