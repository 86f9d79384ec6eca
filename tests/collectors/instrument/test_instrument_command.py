"""``ttft instrument`` as a command: runs COMMAND with the bootstrap, passes its exit status on,
chains an existing sitecustomize, and starts our receiver for an engine that traces itself."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diag.cli import main


def _ttft(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diag", *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def test_command_runs_with_the_bootstrap_and_keeps_its_exit_status(tmp_path):
    code = ("import os, sys; print('sitecustomize' in sys.modules, os.environ['TTFT_INSTRUMENT_CAPTURE']); "
            "sys.exit(3)")
    res = _ttft("instrument", "--capture", str(tmp_path / "srv"), "--", sys.executable, "-c", code)
    assert res.returncode == 3, res.stderr
    assert res.stdout.split() == ["True", str(tmp_path / "srv")]
    assert res.stderr == ""
    assert not (tmp_path / "srv").exists()  # a process that never imports an engine writes nothing


def test_an_existing_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.TTFT_TEST_MARK = 'theirs'\n")
    res = _ttft("instrument", "--capture", str(tmp_path / "srv"), "--", sys.executable, "-c",
                "import builtins; print(builtins.TTFT_TEST_MARK)", env={"PYTHONPATH": str(site)})
    assert res.returncode == 0 and res.stdout.strip() == "theirs", res.stderr


def test_usage_errors_are_one_line(tmp_path, capsys):
    assert main(["instrument", "--capture", str(tmp_path / "srv")]) == 2
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "spans.otlp.jsonl").write_text("")
    assert main(["instrument", "--capture", str(tmp_path / "old"), "--", "true"]) == 2
    assert main(["instrument", "--capture", str(tmp_path / "x"), "--", str(tmp_path / "no-such-engine")]) == 2
    assert main(["instrument", "--capture", str(tmp_path / "y"), "--paused", "--", "true"]) == 2
    assert main(["instrument", "--capture", str(tmp_path / "y"), "--toggle-signal", "TERM", "--", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("ttft instrument: error:") for line in err)
    assert "--paused needs --toggle-signal" in err[3] and "USR1, USR2" in err[4]


def test_the_toggle_signal_and_paused_reach_the_command(tmp_path):
    code = "import os; print(os.environ.get('TTFT_INSTRUMENT_TOGGLE_SIGNAL'), os.environ.get('TTFT_INSTRUMENT_PAUSED'))"
    res = _ttft("instrument", "--capture", str(tmp_path / "srv"), "--toggle-signal", "SIGUSR1", "--paused", "--",
                sys.executable, "-c", code)
    assert res.returncode == 0 and res.stdout.split() == ["USR1", "1"], res.stderr


@pytest.fixture
def fake_vllm(tmp_path):
    """A ``vllm`` executable that records its argv and exports one span to --otlp-traces-endpoint (gRPC)."""
    pytest.importorskip("grpc")
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        argv = sys.argv[1:]
        open({str(tmp_path / 'argv.json')!r}, "w").write(json.dumps(argv))
        endpoint = argv[argv.index("--otlp-traces-endpoint") + 1]
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
        provider.get_tracer("vllm").start_span("llm_request").end()
        provider.shutdown()
        """))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_vllm_gets_its_flags_and_our_receiver_writes_its_spans(tmp_path, fake_vllm):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    res = _ttft("instrument", "--capture", str(tmp_path / "srv"), "--", str(fake_vllm), "serve", "some/model",
                env={"PATH": f"{fake_vllm.parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert res.returncode == 0, res.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:2] == ["serve", "some/model"]
    assert argv[argv.index("--otlp-traces-endpoint") + 1].startswith("grpc://127.0.0.1:")
    assert argv[argv.index("--collect-detailed-traces") + 1] == "all"
    assert "added --otlp-traces-endpoint" in res.stderr
    spans = Path(tmp_path / "srv" / "spans.otlp.jsonl").read_text()
    assert "llm_request" in spans
    meta = json.loads((tmp_path / "srv" / "meta.json").read_text())
    assert meta["engine"] == "vllm" and "tested as built" in meta["instrument"]["note"]
