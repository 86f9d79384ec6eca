"""The transformers versions the patches know; any other gets one line and no patch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from collectors.instrument import BOOTSTRAP_DIR, transformers_serve
from collectors.instrument.runtime import Instrumentation


@pytest.mark.parametrize("version,ok", [("5.24.0", True), ("5.20.0", True), ("5.24.9", True), ("5.25.0", False),
                                        ("5.19.2", False), ("6.0.0", False), ("4.57.1", False), ("nightly", False)])
def test_version_range(version, ok):
    assert transformers_serve.version_supported(version) is ok


def test_an_unknown_version_says_one_line_and_registers_nothing(capsys):
    inst = Instrumentation(environ={})
    before = list(sys.meta_path)
    assert transformers_serve.install(inst, version="6.1.0") is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "transformers 6.1.0" in err[0] and ">=5.20,<5.25" in err[0] and "uninstrumented" in err[0]
    assert sys.meta_path == before and inst.stats.patched == [] and inst.sink is None


def test_a_real_process_with_an_unknown_transformers_runs_untouched(tmp_path):
    """A fake ``transformers`` 7.0 distribution first on the path: one line, the program's own output."""
    dist = tmp_path / "transformers-7.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 7.0.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), str(tmp_path)]),
           "TTFT_INSTRUMENT_CAPTURE": str(tmp_path / "srv")}
    out = subprocess.run([sys.executable, "-c", "import sys; print('engine ran', len(sys.meta_path))"],
                         env=env, capture_output=True, text=True, timeout=60)
    plain = subprocess.run([sys.executable, "-c", "import sys; print('engine ran', len(sys.meta_path))"],
                           env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == plain.stdout  # no finder of ours on sys.meta_path
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ttft instrument: transformers 7.0.0 is not in the range"), out.stderr
    assert not (tmp_path / "srv").exists()
