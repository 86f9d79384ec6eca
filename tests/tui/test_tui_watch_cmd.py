"""``ttft watch`` refuses what can never work with a one-line error and exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.cli import main


@pytest.mark.parametrize(("argv", "says"), [
    (["ftp://127.0.0.1:1"], "bad URL 'ftp://127.0.0.1:1'"),
    (["http://127.0.0.1:1", "--probe-timeout", "0"], "--probe-timeout > 0"),
])
def test_watch_refuses_bad_input(argv: list[str], says: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", *argv, "-o", str(tmp_path / "cap")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "cap").exists()  # nothing was started
