"""``ttft diff`` tells a trade-off as it is, and gates CI with ``--fail-on``.

The issue's case: chunked prefill (samples/interference -> samples/interference_chunked) cut the
ITL tail by 91% and paid for it in TTFT; the old story said "ITL also grew" (from ITL p50) and
"healthy (every SLO given is met)" right after TTFT p50 +241%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.cli import main
from diag.analysis.report.diff import DiffResult, diff_paths
from diag.analysis.report.diff_gate import METRIC_KEYS, FailOnError, check_fail_on, parse_fail_on

ROOT = Path(__file__).resolve().parents[4] / "samples"
A, B = str(ROOT / "interference"), str(ROOT / "interference_chunked")


@pytest.fixture(scope="module")
def chunked() -> DiffResult:
    return diff_paths(A, B)


def _line(text: str, start: str) -> str:
    return next(x for x in text.splitlines() if x.startswith(start))


def test_better_and_worse_are_both_told(chunked: DiffResult) -> None:
    text = chunked.format_text()
    better, worse = _line(text, "Better in B:"), _line(text, "Worse in B:")
    assert "ITL p99" in better and "-91%" in better and "TPOT" in better
    assert "TTFT p50" in worse and "+241%" in worse and "ITL p50" in worse
    assert "ITL p99" not in worse and "TTFT" not in better
    assert "ITL also grew" not in text


def test_each_side_names_the_finding_that_explains_it(chunked: DiffResult) -> None:
    text = chunked.format_text()
    why_better = _line(text, "Why better")
    assert "A's finding [interference]" in why_better and "gone in B" in why_better
    why_worse = _line(text, "Why worse: TTFT")
    assert "queue" in why_worse and "3.0% -> 56%" in why_worse


def test_a_healthy_b_verdict_is_not_read_as_no_worse(chunked: DiffResult) -> None:
    verdict = _line(chunked.format_text(), "Verdict changed: interference -> healthy")
    assert "not against A" in verdict and "TTFT p50 +241%" in verdict


def test_json_lists_better_and_worse(chunked: DiffResult) -> None:
    d = chunked.to_dict()
    assert "ITL p99" in d["better"] and "TTFT p50" in d["worse"]
    assert d["schema"] == "diff" and d["schema_version"] >= 1 and d["tool_version"]
    json.dumps(d, allow_nan=False)


def test_fail_on_parses_and_refuses_bad_bounds() -> None:
    (b,) = parse_fail_on("ttft_p99=+10%")
    assert b.key == "ttft_p99" and b.sign == 1 and b.rel == pytest.approx(0.10)
    (t,) = parse_fail_on("requests=-5%")
    assert t.sign == -1
    (ms,) = parse_fail_on("itl_p99=+20ms")
    assert ms.abs == pytest.approx(0.020)
    for bad, why in (("ttft_p99=10", "unit"), ("ttft_p42=+10%", "known"), ("ttft_p99", "METRIC=")):
        with pytest.raises(FailOnError, match=why):
            parse_fail_on(bad)
    assert {"ttft_p99", "itl_p99", "tpot_p50", "requests", "output_tokens", "errors"} <= set(METRIC_KEYS)


def test_fail_on_judges_the_direction(chunked: DiffResult) -> None:
    (ttft,) = check_fail_on(parse_fail_on("ttft_p99=+10%"), chunked)
    assert ttft.failed and "+131%" in ttft.detail
    (itl,) = check_fail_on(parse_fail_on("itl_p99=+10%"), chunked)
    assert not itl.failed  # it fell 91%
    (gen,) = check_fail_on(parse_fail_on("ttft_p99=+500ms"), chunked)
    assert not gen.failed  # +397 ms is within +500 ms


def test_diff_command_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", A, B, "--fail-on", "ttft_p99=+10%"]) == 1
    assert "regression: ttft_p99" in capsys.readouterr().err
    assert main(["diff", A, B, "--fail-on", "itl_p99=+10%", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fail_on"][0]["key"] == "itl_p99" and doc["fail_on"][0]["failed"] is False
    assert main(["diff", B, A, "--fail-on", "itl_p99=+10%"]) == 1  # the other way round it is a regression
    capsys.readouterr()
    assert main(["diff", A, B, "--fail-on", "ttft_p99=10"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
