"""ttft profile really attaches py-spy to a process and writes the profile into a capture."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collectors.pyspy import find_pyspy
from diag.ground.capture import load_capture
from diag.cli import main

pytestmark = pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed")


@pytest.mark.slow
def test_profile_attaches_and_capture_carries_the_shares(tmp_path, capsys):
    # the bundled engine's real tokenizer, encoding in a loop: its CPU time must land in "tokenize"
    script = textwrap.dedent("""
        import time
        from diag.bundled_engine.tokenizer import Tokenizer
        tok = Tokenizer.bundled()
        text = "the quick brown fox jumps over the lazy dog " * 400
        end = time.time() + 20
        while time.time() < end:
            tok.encode(text)
    """)
    root = str(Path(__file__).resolve().parents[3])
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": root})
    try:
        time.sleep(2.0)
        rc = main(["profile", str(proc.pid), "-d", "1.5", "-o", str(tmp_path / "cap")])
    finally:
        proc.kill()
        proc.wait()
    out = capsys.readouterr()
    if rc == 2 and "ptrace" in out.err:
        pytest.skip("ptrace not permitted here: " + out.err.strip())
    assert rc == 0, out.err
    cap = load_capture(tmp_path / "cap")
    shares = cap.meta["pyspy"]["shares"]
    assert max(shares, key=shares.get) == "tokenize"
    assert "tokenize" in out.out


def test_profile_of_a_missing_pid_is_one_line(tmp_path, capsys):
    rc = main(["profile", "999999", "-d", "0.5", "--engine", "transformers", "--native", "-o", str(tmp_path / "cap")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "999999" in err
