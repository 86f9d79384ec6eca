"""py-spy sampler: the raw parser, the executable and its failures, py-spy for real (the stage rules
per engine are in ``test_pyspy_engines.py``)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collectors import pyspy as P
from collectors.base import SeriesCollector
from collectors.pyspy import (
    CPU_FORWARD, CPU_IDLE, CPU_OTHER, CPU_TOKENIZE, Frame, PySpyError, PySpyPermissionError, PySpySampler,
    PySpyUnavailable, attribute, parse_raw,
)
from diag.ground import stages as S

# --- the raw format ------------------------------------------------------------------------------

RAW = textwrap.dedent("""\
    <module> (run.py:4);encode (diag/bundled_engine/tokenizer.py:2) 48
    <module> (run.py:4) 8

    thread (2975): MainThread;<module> (spin2.py:10);JSONEncoder.iterencode (json/encoder.py:258) 32
    thread (0x7f3a1c2d3740);<module> (a.py:1);f (a.py) 3
    process 2973:"bash -c x;y";process 2975:"/usr/bin/python serve.py --port 8000";thread (2976): Thread-1 (waiter);Thread._bootstrap (threading.py:1002);Queue.get (queue.py:171) 5
    main (app.py:9);PyEval_EvalFrame (libpython3.11.so.1.0) 2
     1
    """)


def test_parse_raw_frames_counts_and_prefixes():
    stacks = parse_raw(RAW)
    assert [s.count for s in stacks] == [48, 8, 32, 3, 5, 2, 1]
    assert stacks[6].frames == ()  # py-spy writes " 1" for a sample without Python frames
    assert attribute(stacks).counts[CPU_OTHER] == 8 + 3 + 2 + 1
    a = stacks[0]
    assert a.frames == (Frame("<module>", "run.py", 4), Frame("encode", "diag/bundled_engine/tokenizer.py", 2))
    assert a.pid is None and a.thread is None
    assert stacks[2].thread == "2975"
    assert stacks[2].frames[-1] == Frame("JSONEncoder.iterencode", "json/encoder.py", 258)
    assert stacks[3].thread == "0x7f3a1c2d3740"
    assert stacks[3].frames[-1] == Frame("f", "a.py", None)  # --nolineno
    nested = stacks[4]
    assert nested.pid == 2975 and nested.thread == "2976"
    assert [f.func for f in nested.frames] == ["Thread._bootstrap", "Queue.get"]
    assert stacks[5].frames[-1] == Frame("PyEval_EvalFrame", "libpython3.11.so.1.0", None)


def test_parse_raw_rejects_a_line_without_count():
    with pytest.raises(ValueError, match=r"^prof\.txt: line 2: not 'frame;\.\.\.;frame COUNT'"):
        parse_raw("a (x.py:1) 3\na (x.py:1);b (y.py:2)\n", "prof.txt")
    assert parse_raw("") == [] and attribute([]).samples_total == 0


# --- failures and the executable -----------------------------------------------------------------


def test_explain_failure_lines():
    e = P.explain_failure(42, 1, "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n")
    assert isinstance(e, PySpyPermissionError)
    msg = str(e)
    assert "\n" not in msg and "PID 42" in msg
    assert "CAP_SYS_PTRACE" in msg and "--cap-add SYS_PTRACE" in msg and "ptrace_scope=0" in msg
    e = P.explain_failure(42, 1, "Error: Failed to find python version from target process\n\nStack backtrace:\n   0: x\n")
    assert type(e) is PySpyError and "not a running Python process" in str(e)
    e = P.explain_failure(42, 2, "Error: something odd happened\n\nStack backtrace:\n   0: anyhow\n")
    assert str(e) == "py-spy failed on PID 42 (exit 2): something odd happened"


def _fake_pyspy(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "py-spy"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_fake_pyspy_permission_denied(tmp_path):
    exe = _fake_pyspy(tmp_path, "echo \"Permission Denied: Try running again with elevated permissions\" >&2\nexit 1\n")
    with pytest.raises(PySpyPermissionError, match=r"ptrace not permitted; run as root, grant CAP_SYS_PTRACE"):
        PySpySampler(os.getpid(), duration_s=1, py_spy=exe).record()


def test_fake_pyspy_command_line_and_capture_files(tmp_path):
    raw = ("handle_chat (diag/bundled_engine/server.py:120);Tokenizer.encode (diag/bundled_engine/tokenizer.py:80) 30\n"
           "Engine.run (diag/bundled_engine/engine.py:150);Condition.wait (threading.py:327) 10\n")
    (tmp_path / "canned.txt").write_text(raw)
    args_file = tmp_path / "args.txt"
    # writes the canned profile to the file after -o, records its arguments
    exe = _fake_pyspy(tmp_path, textwrap.dedent(f"""\
        echo "$@" > {args_file}
        while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then cp {tmp_path / 'canned.txt'} "$2"; fi; shift; done
        """))
    s = PySpySampler(os.getpid(), duration_s=1.2, rate_hz=250, gil=True, idle=True, nonblocking=True, native=True,
                     py_spy=exe)
    cap = tmp_path / "cap"
    assert isinstance(s, SeriesCollector)
    assert s.collect().empty and tuple(s.collect().columns) == S.SERIES_COLUMNS
    prof = s.record(cap)
    rows = s.collect().set_index("entity")
    assert tuple(s.collect().columns) == S.SERIES_COLUMNS and set(rows.source) == {"pyspy"}
    assert set(rows.series) == {P.SERIES_CPU_SAMPLES} and rows.ts_s.nunique() == 1
    assert rows.loc[f"pid{os.getpid()}/{CPU_TOKENIZE}", "value"] == 30.0
    assert rows.loc[f"pid{os.getpid()}/{CPU_IDLE}", "value"] == 10.0 and rows.value.sum() == 40.0
    args = args_file.read_text().split()
    assert args[:9] == ["record", "--pid", str(os.getpid()), "--duration", "2", "--rate", "250", "--format", "raw"]
    assert args[9] == "-o" and {"--gil", "--idle", "--nonblocking", "--native"} <= set(args[11:])
    assert prof.counts[CPU_TOKENIZE] == 30 and prof.counts[CPU_IDLE] == 10
    assert prof.shares[CPU_TOKENIZE] == pytest.approx(0.75) and prof.busy_shares()[CPU_TOKENIZE] == 1.0
    assert (cap / "profile" / "pyspy.raw.txt").read_text() == raw
    summary = json.loads((cap / "profile" / "pyspy.json").read_text())
    assert summary["counts"][CPU_TOKENIZE] == 30 and summary["pid"] == os.getpid()
    assert summary["options"]["gil"] is True and summary["options"]["native"] is True and summary["rate_hz"] == 250
    again = P.load_profile(cap)
    assert again.counts == prof.counts and again.engine == "bundled"
    assert P.load_profile(cap, "vllm").counts[CPU_OTHER] == 30  # re-attributed with vLLM's rules


def test_stop_keeps_a_failure_instead_of_raising(tmp_path):
    exe = _fake_pyspy(tmp_path, "echo \"Permission Denied: Try running again with elevated permissions\" >&2\nexit 1\n")
    s = PySpySampler(os.getpid(), duration_s=1, py_spy=exe)
    s.stop()  # never started: a no-op
    s.start()
    deadline = time.monotonic() + 10
    while s.running and time.monotonic() < deadline:  # let it fail on its own, not by our SIGINT
        time.sleep(0.01)
    s.stop()
    assert s.profile is None and "ptrace not permitted" in s.error and "\n" not in s.error
    assert s.collect().empty
    with pytest.raises(PySpyPermissionError, match="ptrace not permitted"):
        s.wait()


def test_pyspy_missing_gives_a_note(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    assert P.find_pyspy() is None
    s = PySpySampler(os.getpid())
    assert s.available is False
    assert s.note == "py-spy unavailable: the py-spy executable is not installed (pip install py-spy)"
    with pytest.raises(PySpyUnavailable, match="pip install py-spy"):
        s.record()


def test_find_pyspy_next_to_the_interpreter(monkeypatch, tmp_path):
    exe = _fake_pyspy(tmp_path, "exit 0\n")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert P.find_pyspy() == exe


def test_bad_arguments():
    with pytest.raises(ValueError):
        PySpySampler(1, duration_s=0)
    with pytest.raises(ValueError, match="unknown engine"):
        PySpySampler(1, engine="nope")


# --- py-spy for real (we run as root here) -------------------------------------------------------

needs_pyspy = pytest.mark.skipif(P.find_pyspy() is None, reason="py-spy not installed")

TOKENIZER_PY = '''\
def encode(text):
    out = []
    for word in text.split():
        out.append(sum(ord(c) for c in word) % 50000)
    return out
'''
MODEL_PY = '''\
import math
def forward(n):
    acc = 0.0
    for i in range(n):
        acc += math.sin(i) * math.cos(i)
    return acc
'''
MAIN_PY = '''\
import sys, time
from diag.bundled_engine.tokenizer import encode
from diag.bundled_engine.model import forward
text = "hello tokenizer world " * 200
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.monotonic()
    while time.monotonic() - t < 0.04:   # ~80% of the time in the tokenizer
        encode(text)
    t = time.monotonic()
    while time.monotonic() - t < 0.01:   # ~20% in the "forward"
        forward(2000)
'''


@pytest.fixture
def workload(tmp_path):
    pkg = tmp_path / "diag" / "bundled_engine"
    pkg.mkdir(parents=True)
    (tmp_path / "diag" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "tokenizer.py").write_text(TOKENIZER_PY)
    (pkg / "model.py").write_text(MODEL_PY)
    (tmp_path / "serve.py").write_text(MAIN_PY)
    procs: list[subprocess.Popen[str]] = []

    def start(seconds: float) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "serve.py", str(seconds)], cwd=tmp_path,
                             stdout=subprocess.PIPE, text=True, env={"PATH": os.environ.get("PATH", "")})
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


@needs_pyspy
def test_real_attach_attributes_the_dominant_stage(workload, tmp_path):
    proc = workload(30)
    s = PySpySampler(proc.pid, duration_s=2, rate_hz=200, engine="bundled")
    prof = s.record(tmp_path / "cap")
    assert prof.samples_total >= 100, prof.to_dict()
    assert prof.dominant() == CPU_TOKENIZE, prof.counts
    shares = prof.busy_shares()
    assert shares[CPU_TOKENIZE] > 0.5 and shares[CPU_FORWARD] > 0.05, shares
    assert shares[CPU_TOKENIZE] > 2 * shares[CPU_FORWARD]
    assert "encode (diag/bundled_engine/tokenizer.py)" in dict(prof.top_frames[CPU_TOKENIZE])
    assert (tmp_path / "cap" / "profile" / "pyspy.raw.txt").stat().st_size > 0
    assert json.loads((tmp_path / "cap" / "profile" / "pyspy.json").read_text())["pid"] == proc.pid


@needs_pyspy
def test_real_stop_ends_the_window_early(workload):
    proc = workload(30)
    s = PySpySampler(proc.pid, duration_s=60, rate_hz=100)
    t0 = time.monotonic()
    s.start()
    assert s.running
    time.sleep(1.5)
    s.stop()
    prof = s.profile
    assert time.monotonic() - t0 < 20
    assert prof is not None and not s.running and prof.samples_total > 20
    s.stop()
    assert s.profile is prof  # idempotent
    rows = s.collect()  # the protocol's view of the window: samples per stage
    assert isinstance(s, SeriesCollector) and rows.value.sum() == prof.samples_total
    assert rows.set_index("entity").loc[f"pid{proc.pid}/{CPU_TOKENIZE}", "value"] == prof.counts[CPU_TOKENIZE]


@needs_pyspy
def test_real_not_a_python_process():
    p = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(PySpyError, match="not a running Python process"):
            PySpySampler(p.pid, duration_s=1).record()
    finally:
        p.kill()
        p.wait()


@needs_pyspy
def test_real_target_exits_during_the_window(workload):
    proc = workload(1.5)
    prof = PySpySampler(proc.pid, duration_s=10, rate_hz=100).record()
    assert prof.samples_total > 20 and prof.dominant() == CPU_TOKENIZE
    assert prof.meta.get("note") == "the process exited during the window"


def test_no_such_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the PID is free now
    s = PySpySampler(p.pid, duration_s=1, py_spy=sys.executable)
    with pytest.raises(PySpyError, match=f"no process with PID {p.pid}"):
        s.start()


@needs_pyspy
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_real_ptrace_refused_for_an_unprivileged_user(workload, tmp_path):
    proc = workload(30)
    exe = P.find_pyspy()
    if not os.access(exe, os.X_OK) or not (os.stat(exe).st_mode & stat.S_IXOTH):
        pytest.skip("py-spy not executable by other users")
    wrapper = _fake_pyspy(tmp_path, f'exec setpriv --reuid=65534 --regid=65534 --clear-groups {exe} "$@"\n')
    os.chmod(tmp_path, 0o755)
    with pytest.raises(PySpyPermissionError) as info:
        PySpySampler(proc.pid, duration_s=1, py_spy=wrapper).record()
    assert "\n" not in str(info.value) and "ptrace_scope" in str(info.value)
