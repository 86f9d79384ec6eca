"""The random scenario matrix in CI: one fixed, printed seed, 12 draws, each run for real on the
bundled engine and diagnosed server-side and client-only; a wrong verdict fails, with the command
that reproduces that one draw. As the fixed catalogue's matrix test does, a draw that misses runs
once more on a fresh calibration (timing noise on 2 shared cores flips a borderline draw now and
then). Scored by the verdict contract (docs/verdict.md; outcomes in
:mod:`diag.analysis.scenarios.random_matrix`): a draw that names a wrong cause twice fails, and so does one
called ``healthy`` twice where a cause was injected and not even leading; one that passes only on
its rerun is a warning. A draw that is ``inconclusive``, or ``healthy``/``inconclusive`` with the
truth as its leading candidate under the verdict floor, twice is a warning too, not a failure: the
rules said they cannot decide (an honest answer the product gives by design), not a wrong
bottleneck; the accuracy budget of ``ttft scenarios check --random 50`` still scores it as a miss. The seed was
fixed before it was first run (the date this test was written); it is never changed to one that passes. Fresh seeds are for measuring, by hand:
``ttft scenarios check --random 50``.

About 12 s a draw on 2 CPU cores (one engine process per phase, as the catalogue runs), so the
whole test takes about 2 minutes (98 s here, on a 2-core box shared with other work).

The near-miss space (``ttft scenarios check --near-miss``) has its own test on the same seed: its
draws of the three families only that space holds (a long prompt behind nothing, an idle-closing
keep-alive, light load on long prompts), truth ``healthy``, scored the same way (about 40 s).
"""

from __future__ import annotations

import time
import warnings

import pytest

from diag.analysis.scenarios import MODES, calibrate
from diag.analysis.scenarios.random_draws import NEAR_MISS_EXTRA, NEAR_MISS_SPACE, near_miss_draw
from diag.analysis.scenarios.random_matrix import LEADING_RIGHT, MISSED, UNDECIDED, WRONG, RandomResult, check_random, outcome

CI_SEED = 20261201
CI_DRAWS = 12


def _calibration():
    cal = calibrate()
    return calibrate() if cal.noisy else cal  # measured while something else ran: once more


def _no_wrong_verdict_twice(indices: list[int], tmp_path, space: str = "main") -> None:
    """Run draws ``indices`` of the CI seed in ``space``; a miss runs once more on a fresh
    calibration: wrong or missed twice fails, inconclusive or the truth only leading twice warns."""
    cal = _calibration()
    print(f"random matrix ({space} space): seed {CI_SEED}, draws {indices}, calibration {cal.to_dict()}")
    t0 = time.monotonic()
    results = check_random(CI_SEED, indices, tmp_path / "runs", cal, modes=MODES, space=space)
    res = RandomResult(CI_SEED, cal, MODES, results, wall_s=time.monotonic() - t0)
    print(res.format_text())
    assert len(res.results) == len(indices) and all(len(r.verdicts[m]) == 1 for r in res.results for m in MODES)
    misses = [f"{r.draw.name} [{m}]: expected {t}, got {v.category} ({v.confidence:.2f}), {outcome(v, t, m)}; "
              f"{r.draw.describe()}\n    reproduce: {res.command(r.draw)} (calibration {cal.to_dict()})"
              for r, m, v, t in res.misses()]
    if not misses:
        return
    # as the fixed catalogue's matrix test does: a draw that missed runs once more on a fresh
    # calibration; a miss on both runs fails, a pass on the rerun is a warning (a margin to widen)
    cal2 = calibrate()
    missed = sorted({(r.draw.index, m) for r, m, _, _ in res.misses()})
    again = RandomResult(CI_SEED, cal2, MODES, check_random(CI_SEED, sorted({i for i, _ in missed}),
                                                            tmp_path / "again", cal2, modes=MODES, space=space))
    print(again.format_text())
    twice = [(f"{r.draw.name} [{m}]: expected {t}, got {v.category} ({v.confidence:.2f})"
              + (f" leading {v.leading} ({v.leading_confidence:.2f})" if v.leading else "") + " again",
              outcome(v, t, m)) for r, m, v, t in again.misses() if (r.draw.index, m) in missed]
    wrong = [text for text, o in twice if o in (WRONG, MISSED)]
    assert not wrong, (f"seed {CI_SEED}: {len(wrong)} draws got a wrong verdict twice\n" + "\n".join(wrong)
                       + "\nfirst runs:\n" + "\n".join(misses))
    undecided = [text for text, o in twice if o in (UNDECIDED, LEADING_RIGHT)]
    if undecided:  # not a wrong answer, but counted as a miss by the matrix's accuracy: say so
        warnings.warn(f"seed {CI_SEED}: inconclusive, or the truth only leading, twice (scored as misses in the "
                      "accuracy budget):\n" + "\n".join(undecided), stacklevel=2)
    warnings.warn(f"seed {CI_SEED}: {len(misses)} first-run misses, none wrong on its rerun:\n"
                  + "\n".join(misses), stacklevel=2)


@pytest.mark.slow
@pytest.mark.timeout(900)  # 12 draws and the reruns of those that missed: past the suite's 300 s on a busy box
def test_random_matrix_fixed_seed_has_no_miss(tmp_path):
    _no_wrong_verdict_twice(list(range(CI_DRAWS)), tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_near_misses_only_the_near_miss_space_holds_name_no_cause(tmp_path):
    indices = [i for i in range(len(NEAR_MISS_SPACE)) if near_miss_draw(CI_SEED, i).family in NEAR_MISS_EXTRA]
    assert sorted(near_miss_draw(CI_SEED, i).family for i in indices) == sorted(NEAR_MISS_EXTRA)
    _no_wrong_verdict_twice(indices, tmp_path, space="near-miss")
