"""rules.features.numeric: sweep labels, the least-squares line, interval coverage."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rules.features.numeric import Coverage, linear_fit, linear_fit_se, merge_intervals, segment_numbers


def testsegment_numbers() -> None:
    seg = pd.Series(["prompt=512", "concurrency=8", "tp=2 c=4", None, "warm"])
    out = segment_numbers(seg)
    assert out.loc[0, "prompt"] == 512 and out.loc[1, "conc"] == 8
    assert out.loc[2, "tp"] == 2 and out.loc[2, "conc"] == 4
    assert out.loc[3].isna().all() and out.loc[4].isna().all()


def testlinear_fit() -> None:
    x = np.array([1.0, 2, 3, 4])
    slope, intercept, r2 = linear_fit(x, 3 * x + 1)
    assert (slope, intercept, r2) == pytest.approx((3, 1, 1))


def test_the_intercept_of_a_narrow_range_far_from_zero_is_loose_and_the_standard_errors_say_how_loose() -> None:
    rng = np.random.default_rng(0)
    near = np.linspace(0.0, 1000.0, 40)  # prompts from 0 tokens: the intercept is measured
    far = np.linspace(800.0, 1000.0, 40)  # the same scatter 800..1000 tokens: it is extrapolated
    noise = rng.normal(0.0, 5.0, 40)
    se_near, se_far = linear_fit_se(near, 0.1 * near + 20 + noise), linear_fit_se(far, 0.1 * far + 20 + noise)
    assert se_far[1] > 5 * se_near[1] and se_far[0] > 4 * se_near[0]
    # by hand: sqrt(s² / Sxx) and sqrt(s² (1/n + mean² / Sxx)) from the residuals, n - 2 degrees of freedom
    slope, icpt, _ = linear_fit(far, 0.1 * far + 20 + noise)
    s2 = float(((0.1 * far + 20 + noise - icpt - slope * far) ** 2).sum()) / 38
    sxx = float(((far - far.mean()) ** 2).sum())
    assert se_far == pytest.approx((np.sqrt(s2 / sxx), np.sqrt(s2 * (1 / 40 + far.mean() ** 2 / sxx))))
    # nothing left to measure the scatter with
    assert linear_fit_se(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == (np.inf, np.inf)
    assert linear_fit_se(np.array([3.0, 3.0, 3.0]), np.array([1.0, 2.0, 3.0])) == (np.inf, np.inf)


intervals = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)), min_size=0, max_size=30)


@settings(max_examples=150, deadline=None)
@given(intervals, st.integers(0, 1300), st.integers(0, 1300))
def test_coverage_matches_brute_force(iv: list[tuple[int, int]], a: int, b: int) -> None:
    a, b = min(a, b), max(a, b)
    s = np.array([x for x, _ in iv], dtype="float64")
    e = np.array([x + d for x, d in iv], dtype="float64")
    grid = np.zeros(1300, dtype=bool)
    for x, d in iv:
        grid[x:x + d] = True
    expect = float(grid[a:b].sum())
    cov = Coverage(s, e)
    assert cov.between(np.array([a]), np.array([b]))[0] == pytest.approx(expect)
    ms, me = merge_intervals(s, e)
    assert np.all(ms[1:] > me[:-1]) if ms.size > 1 else True
    assert cov.total == pytest.approx(float(grid.sum()))
