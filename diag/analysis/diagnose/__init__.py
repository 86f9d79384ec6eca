"""``ttft diagnose URL``: an adaptive, designed sequence of probes against any OpenAI-compatible
server, stopping as soon as the verdict is confident or the budget is spent.

Front door::

    from diag.analysis.diagnose import DiagnoseConfig, PlanConfig, run_diagnose, format_result
    res = run_diagnose(DiagnoseConfig("http://127.0.0.1:8000", Path("diag-out"), PlanConfig(budget_s=120)))
    res.analysis.diagnosis.verdict          # the verdict, as `ttft analyze diag-out` gives it
    print(format_result(res))               # steps and why, start-up, goodput, timing

Workers: :mod:`.plan` (which step next and why, over recorded :class:`.points.Point` s; the
:mod:`.ladder` and the :mod:`.ramp`, settings and steps in :mod:`.design`), :mod:`.result`,
:mod:`.run` (one probe session, one capture, a verdict after every step), :mod:`.limits` (the
server's context limit), :mod:`.summary` (text).
"""

from diag.analysis.diagnose.plan import CONFIDENT, Decision, PlanConfig, Step, confident_stop, next_step
from diag.analysis.diagnose.points import Point, goodput, point_from_metrics
from diag.analysis.diagnose.result import DiagnoseResult, StepRecord
from diag.analysis.diagnose.run import DiagnoseConfig, DiagnoseError, run_diagnose
from diag.analysis.diagnose.summary import format_result

__all__ = ["CONFIDENT", "Decision", "DiagnoseConfig", "DiagnoseError", "DiagnoseResult", "PlanConfig", "Point",
           "Step", "StepRecord", "confident_stop", "format_result", "goodput", "next_step", "point_from_metrics",
           "run_diagnose"]
