"""The random scenario matrix in CI: one fixed, printed seed, 12 draws, each run for real on the
bundled engine and diagnosed server-side and client-only; a wrong verdict fails, with the command
that reproduces that one draw. As the fixed catalogue's matrix test does, a draw that misses runs
once more on a fresh calibration (timing noise on 2 shared cores flips a borderline draw now and
then); a draw that gets a wrong verdict twice fails, and one that passes only on its rerun is a
warning. A draw that is ``inconclusive`` twice is a warning too, not a failure: the rules said they
cannot decide (an honest answer the product gives by design), not a wrong bottleneck; the
accuracy budget of ``ttft scenarios check --random 50`` still scores it as a miss. The seed was
fixed before it was first run (the date this test was written); it is never changed to one that passes. Fresh seeds are for measuring, by hand:
``ttft scenarios check --random 50``.

About 12 s a draw on 2 CPU cores (one engine process per phase, as the catalogue runs), so the
whole test takes about 2 minutes (98 s here, on a 2-core box shared with other work).
"""

from __future__ import annotations

import time
import warnings

import pytest

from diag.scenarios import MODES, calibrate
from diag.scenarios.random_matrix import RandomResult, check_random
from rules import INCONCLUSIVE

CI_SEED = 20261201
CI_DRAWS = 12


@pytest.mark.slow
def test_random_matrix_fixed_seed_has_no_miss(tmp_path):
    cal = calibrate()
    if cal.noisy:  # measured while something else ran: once more
        cal = calibrate()
    print(f"random matrix: seed {CI_SEED}, draws 0..{CI_DRAWS - 1}, calibration {cal.to_dict()}")
    t0 = time.monotonic()
    results = check_random(CI_SEED, range(CI_DRAWS), tmp_path / "runs", cal, modes=MODES)
    res = RandomResult(CI_SEED, cal, MODES, results, wall_s=time.monotonic() - t0)
    print(res.format_text())
    assert len(res.results) == CI_DRAWS and all(len(r.verdicts[m]) == 1 for r in res.results for m in MODES)
    misses = [f"{r.draw.name} [{m}]: expected {t}, got {v.category} ({v.confidence:.2f}); "
              f"{r.draw.describe()}\n    reproduce: {res.command(r.draw)} (calibration {cal.to_dict()})"
              for r, m, v, t in res.misses()]
    if not misses:
        return
    # as the fixed catalogue's matrix test does: a draw that missed runs once more on a fresh
    # calibration; a miss on both runs fails, a pass on the rerun is a warning (a margin to widen)
    cal2 = calibrate()
    missed = sorted({(r.draw.index, m) for r, m, _, _ in res.misses()})
    again = RandomResult(CI_SEED, cal2, MODES, check_random(CI_SEED, sorted({i for i, _ in missed}),
                                                            tmp_path / "again", cal2, modes=MODES))
    print(again.format_text())
    twice = [(f"{r.draw.name} [{m}]: expected {t}, got {v.category} ({v.confidence:.2f}) again", v.category)
             for r, m, v, t in again.misses() if (r.draw.index, m) in missed]
    wrong = [text for text, category in twice if category != INCONCLUSIVE]
    assert not wrong, (f"seed {CI_SEED}: {len(wrong)} draws got a wrong verdict twice\n" + "\n".join(wrong)
                       + "\nfirst runs:\n" + "\n".join(misses))
    undecided = [text for text, category in twice if category == INCONCLUSIVE]
    if undecided:  # not a wrong answer, but counted as a miss by the matrix's accuracy: say so
        warnings.warn(f"seed {CI_SEED}: inconclusive twice (scored as misses in the accuracy budget):\n"
                      + "\n".join(undecided), stacklevel=1)
    warnings.warn(f"seed {CI_SEED}: {len(misses)} first-run misses, none wrong on its rerun:\n"
                  + "\n".join(misses), stacklevel=1)
