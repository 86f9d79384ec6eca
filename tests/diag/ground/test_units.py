"""diag.ground.units: each unit's text, the edge cases, the threshold text and json_safe."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from diag.ground.units import Unit, crossed_mark, fill, fmt_s, fmt_threshold, fmt_value, is_num, json_safe, unit_of


def test_the_closed_set_is_exactly_the_documented_one():
    assert {u.value for u in Unit} == {"s", "share", "%", "x", "requests", "tokens", "steps",
                                       "tokens/s", "s/s", "bytes", "count", ""}
    assert Unit("s") is Unit.S and Unit.S == "s" and f"{Unit.SHARE}" == "share"


@pytest.mark.parametrize("value,unit,text", [
    (850e-6, "s", "850 µs"),
    (0.0123, "s", "12.3 ms"),
    (1.523, "s", "1.52 s"),
    (12.54, "s", "12.5 s"),
    (150.0, "s", "2m30s"),
    (120.0, "s", "2m00s"),
    (3900.0, "s", "1h05m"),
    (0.05, "share", "5.0%"),
    (0.42, "share", "42%"),
    (0.0994, "share", "9.9%"),
    (42.0, "%", "42%"),
    (5.0, "%", "5.0%"),
    (2.0, "x", "2.00x"),
    (13.0, "requests", "13 requests"),
    (1, "requests", "1 request"),
    (13.46, "requests", "13.5 requests"),
    (512, "tokens", "512 tokens"),
    (3, "steps", "3 steps"),
    (1234.0, "tokens/s", "1.2k tokens/s"),
    (850.0, "tokens/s", "850 tokens/s"),
    (3.4e6, "tokens/s", "3.4M tokens/s"),
    (0.934, "s/s", "0.93 s/s"),
    (1.5 * 2**30, "bytes", "1.5 GiB"),
    (512, "bytes", "512 B"),
    (4, "count", "4"),
    (4.0, "count", "4"),
    (0.12345, "", "0.123"),
    (7, "", "7"),
])
def test_each_unit_reads_one_way(value, unit, text):
    assert fmt_value(value, unit) == text
    assert fmt_value(value, Unit(unit)) == text


def test_missing_and_special_values():
    for unit in Unit:
        assert fmt_value(None, unit) == "-"
        assert fmt_value(float("nan"), unit) == "-"
    assert fmt_s(None) == "-" and fmt_s(float("nan")) == "-"
    assert fmt_value(float("inf"), "x") == "inf"
    assert fmt_value(float("-inf"), "s") == "-inf"
    assert fmt_value("n/a", "s") == "n/a"
    assert fmt_value(True, "") == "yes" and fmt_value(np.bool_(False), "") == "no"


def test_zero_and_negative():
    assert fmt_s(0) == "0 s"
    assert fmt_value(0, "share") == "0.0%"
    assert fmt_value(0, "requests") == "0 requests"
    assert fmt_s(-0.0123) == "-12.3 ms"
    assert fmt_s(-150) == "-2m30s"
    assert fmt_value(-0.05, "share") == "-5.0%"
    assert fmt_value(-2, "x") == "-2.00x"


def test_rounding_boundaries_move_to_the_next_scale():
    assert fmt_s(0.99995) == "1.00 s"          # not "1000.0 ms"
    assert fmt_s(0.9994) == "999.4 ms"
    assert fmt_s(0.0009996) == "1.0 ms"        # not "1000 µs"
    assert fmt_s(9.999) == "10.0 s"
    assert fmt_s(59.97) == "1m00s"
    assert fmt_s(119.6) == "2m00s"
    assert fmt_value(0.09996, "share") == "10%"  # not "10.0%"
    assert fmt_value(999.7, "tokens/s") == "1.0k tokens/s"


def test_legacy_units_map_to_the_closed_set():
    assert fmt_value(12.3, "ms") == "12.3 ms" == fmt_value(0.0123, "s")
    assert fmt_value(0.05, "ratio of TTFT") == "5.0%"
    assert fmt_value(0.05, "fraction") == "5.0%"
    assert fmt_value(3.0, "levels") == "3"
    assert fmt_value(1234.0, "tokens/s per stream") == "1.2k tokens/s"
    assert unit_of("ratio") is None                # ambiguous: share or multiplier
    assert fmt_value(0.5, "preemptions") == "0.5 preemptions"
    assert unit_of(Unit.X) is Unit.X and unit_of("tokens") is Unit.TOKENS


def test_threshold_text():
    assert fmt_threshold(">=", 0.3, "share") == "≥ 30%"
    assert fmt_threshold("<", 0.5, Unit.S) == "< 500.0 ms"
    assert fmt_threshold(">=", 2, "x") == "≥ 2.00x"
    assert fmt_threshold(None, 4, "count") == "4"
    assert fmt_threshold(">=", ">= 30% (legacy text)", "share") == ">= 30% (legacy text)"
    assert fmt_threshold(">=", None, "share") == ""


def test_crossed_mark():
    assert crossed_mark(True) == "✓ crossed"
    assert crossed_mark(False) == "✗ not crossed"
    assert crossed_mark(None) == ""


def test_is_num():
    assert is_num(1) and is_num(np.float64(2.5)) and is_num(np.int32(3))
    assert not is_num(True) and not is_num(float("nan")) and not is_num(None) and not is_num("1")


def test_json_safe_makes_strict_json():
    doc = {
        1: np.float64(1.5), "nan": float("nan"), "inf": np.float32("inf"), "i": np.int64(7),
        "b": np.bool_(True), "arr": np.array([1.0, np.nan]), "t": (1, 2), "u": Unit.SHARE,
        "nested": [{"x": float("-inf")}], "obj": object.__name__, "none": None,
    }
    out = json_safe(doc)
    assert out == {"1": 1.5, "nan": None, "inf": None, "i": 7, "b": True, "arr": [1.0, None],
                   "t": [1, 2], "u": "share", "nested": [{"x": None}], "obj": "object", "none": None}
    assert type(out["i"]) is int and type(out["b"]) is bool
    json.dumps(out, allow_nan=False)


def test_json_safe_pandas_missing():
    pd = pytest.importorskip("pandas")
    assert json_safe([pd.NA, pd.NaT, pd.Timestamp("2026-01-01")]) == [None, None, "2026-01-01 00:00:00"]
    assert math.isclose(json_safe(np.float32(0.5)), 0.5)


def test_rates():
    from diag.ground.units import fmt_rate

    assert fmt_rate(12.5, "requests") == "12.5 requests/s"
    assert fmt_rate(3400, Unit.STEPS) == "3.4k steps/s"
    assert fmt_rate(1234, "tokens") == "1.2k tokens/s" == fmt_value(1234, "tokens/s")
    assert fmt_rate(1.5 * 2**30, "bytes") == "1.5 GiB/s"
    assert fmt_rate(None, "requests") == "-" and fmt_rate(float("nan"), "bytes") == "-"
    assert fmt_rate(2.345, "tokens") == "2.35 tokens/s"


def test_as_float_keeps_finite_numbers_only():
    import numpy as np

    from diag.ground.units import as_float

    assert as_float(3) == 3.0 and as_float(np.float32(0.5)) == 0.5 and as_float("1.25") == 1.25
    assert as_float(None) is None and as_float("x") is None
    assert as_float(float("nan")) is None and as_float(np.inf) is None


def test_fill_formats_each_field_by_its_spec_and_a_missing_value_as_a_dash():
    text = fill("{share:.0%} of TTFT, {ratio:.2f}x (< {min:g}x), {n:g} requests: {why}",
                share=0.423, ratio=1.5, min=2.0, n=12.0, why="too few")
    assert text == f"{0.423:.0%} of TTFT, {1.5:.2f}x (< {2.0:g}x), {12.0:g} requests: too few" == \
        "42% of TTFT, 1.50x (< 2x), 12 requests: too few"
    assert fill("{a:.1f} and {b:.0%}", a=None, b=float("nan")) == "- and -"
    assert fill("{x:.1f} ms", x=np.float64(12.34)) == "12.3 ms"
