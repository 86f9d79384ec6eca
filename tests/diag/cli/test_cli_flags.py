"""Flags that agree: every --help shows the defaults, vLLM's names work as aliases of the
serve flags, and the completion script (generated from the parser) completes commands,
options and option choices in a real bash."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from diag.cli import COMMANDS, build_parser, main
from diag.cli.commands.completion import bash_script


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return re.sub(r"\s+", " ", capsys.readouterr().out)


def test_every_help_shows_defaults_and_never_a_none(capsys: pytest.CaptureFixture[str]) -> None:
    serve = _help(capsys, "serve")
    assert "tokens per KV-cache block (default: 16)" in serve
    assert "(default: prefill-first)" in serve
    for name in COMMANDS:
        text = _help(capsys, name)
        assert "(default: None)" not in text and "(default: False)" not in text, name


def test_vllm_names_are_aliases_of_the_serve_flags() -> None:
    parser = build_parser()
    ours = parser.parse_args(["serve", "--max-running", "8", "--max-context", "512", "--max-batched-tokens", "256"])
    vllm = parser.parse_args(["serve", "--max-num-seqs", "8", "--max-model-len", "512", "--max-num-batched-tokens", "256"])
    for dest in ("max_running", "max_context", "max_batched_tokens"):
        assert getattr(ours, dest) == getattr(vllm, dest)
    assert (vllm.max_running, vllm.max_context, vllm.max_batched_tokens) == (8, 512, 256)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_completion_script_completes_in_bash() -> None:
    script = bash_script(build_parser())

    def complete(*words: str) -> list[str]:
        arr = " ".join(f"'{w}'" for w in words)
        cmd = f'{script}\nCOMP_WORDS=({arr}); COMP_CWORD={len(words) - 1}; _ttft; printf "%s\\n" "${{COMPREPLY[@]}}"'
        out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30, check=True).stdout
        return [w for w in out.splitlines() if w]

    assert complete("ttft", "ana") == ["analyze"]
    assert "--max-num-seqs" in complete("ttft", "serve", "--max-")
    assert complete("ttft", "serve", "--policy", "") == ["prefill-first", "decode-first", "chunked"]
    assert complete("ttft", "probe", "--sweep", "c") == ["concurrency"]
    assert complete("ttft", "completion", "") == ["bash", "zsh"]


def test_the_progress_line_shows_rate_and_eta() -> None:
    import io

    from diag.cli.commands.probe import ProgressLine

    out = io.StringIO()
    bar = ProgressLine(out)
    bar(0, 10, "concurrency=4")
    bar._t0 -= 2.0  # two seconds in
    bar._last = 0.0
    bar(4, 10, "concurrency=4")
    line = out.getvalue().split("\r")[-1]
    assert "4/10" in line and "2.0 req/s" in line and "ETA    3s" in line


def test_one_way_to_turn_a_source_off_and_d_for_duration() -> None:
    parser = build_parser()
    a = parser.parse_args(["watch", "http://h:1", "--no-metrics", "--no-otlp", "--no-probe", "-d", "5"])
    assert a.no_metrics and a.no_otlp and a.no_probe and a.duration == 5.0
    for argv in (["scrape", "http://h:1/metrics", "-o", "x", "-d", "7"], ["receive", "-o", "x", "-d", "7"],
                 ["probe", "http://h:1", "-d", "7"], ["analyze", "--from-prometheus", "http://h:9", "-d", "7"]):
        assert parser.parse_args(argv).duration == 7.0, argv[0]
