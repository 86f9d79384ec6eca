"""SLO specs: every value carries its unit; a bare number is refused, naming the units."""

from __future__ import annotations

import pytest

from diag.cli import main
from diag.ground.slo import SLOError, parse_slo


def test_units_convert_to_seconds() -> None:
    assert parse_slo("ttft_p99=100ms,tpot_p99=2s,itl_p50=250us") == pytest.approx(
        {"ttft_p99": 0.1, "tpot_p99": 2.0, "itl_p50": 250e-6})


@pytest.mark.parametrize("spec", ["ttft_p99=100", "ttft_p99=2s,tpot_p99=50", "e2e_p95=1.5"])
def test_a_bare_number_is_refused_naming_the_units(spec: str) -> None:
    with pytest.raises(SLOError) as err:
        parse_slo(spec)
    msg = str(err.value)
    assert "\n" not in msg
    assert "no unit" in msg and "ms" in msg and "us" in msg and " s" in msg


def test_unknown_unit_is_refused() -> None:
    with pytest.raises(SLOError, match="ms, s or us"):
        parse_slo("ttft_p99=100min")


@pytest.mark.parametrize("command", ["analyze", "report", "view"])
def test_every_command_refuses_a_bare_slo(command: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: ``--slo ttft_p99=100`` was read as 100 s and turned kv_cache into healthy."""
    argv = [command, "samples/kv_cache/client", "samples/kv_cache/server-0", "--slo", "ttft_p99=100"]
    if command == "report":
        argv += ["-o", str(tmp_path / "r.json")]
    if command == "view":
        argv = [command, "samples/kv_cache", "--no-tui", "--slo", "ttft_p99=100"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ttft_p99=100" in err[0] and "ms" in err[0]
