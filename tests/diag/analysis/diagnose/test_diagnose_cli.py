"""``ttft diagnose`` at the command line: bad input and an unreachable server end as one line on
stderr with exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from diag import cli
from diag.cli.commands.diagnose import parse_budget
from support.engine_testutil import free_port


@pytest.mark.parametrize("argv, message", [
    (["--budget", "soon"], "bad --budget 'soon'"),
    (["--budget", "0s"], "--budget must be > 0"),
    (["--max-concurrency", "0"], "max-concurrency must be >= 1"),
    (["--slo", "ttft=2s"], "bad SLO item 'ttft=2s'"),
    (["--join", "/nonexistent/capture"], "--join /nonexistent/capture: no such capture"),
    (["--wait-ready", "-1"], "--wait-ready must be >= 0"),
])
def test_bad_options_are_one_line_errors(argv, message, capsys, tmp_path) -> None:  # noqa: ANN001
    rc = cli.main(["diagnose", "http://127.0.0.1:9", "-o", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_a_server_that_does_not_answer_is_a_one_line_error(capsys, tmp_path) -> None:  # noqa: ANN001
    """Even with --no-progress the wait is said when it starts (not at the end), then one error line."""
    rc = cli.main(["diagnose", f"http://127.0.0.1:{free_port()}", "-o", str(tmp_path / "out"), "--no-progress",
                   "--wait-ready", "1"])
    wait, error = capsys.readouterr().err.splitlines()
    assert wait.startswith("ttft diagnose: the server is not serving yet (connection refused); waiting up to 1 s"), wait
    assert rc == 2 and "the server did not answer (connect_refused) in 1 s (--wait-ready)" in error, error


def test_an_output_directory_that_holds_a_capture_is_refused(capsys, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "meta.json").write_text("{}")
    rc = cli.main(["diagnose", f"http://127.0.0.1:{free_port()}", "-o", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "exists and is not empty" in err and err.count("\n") == 1, err


def test_budgets_read_as_seconds() -> None:
    assert parse_budget("120s") == 120 and parse_budget("90") == 90 and parse_budget("1.5m") == 90
