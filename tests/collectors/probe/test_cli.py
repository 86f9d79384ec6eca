"""``ttft probe`` through diag.cli: exit codes, --json, summary, usage errors."""

from __future__ import annotations

import argparse
import json

import pytest

from diag.cli.commands import probe as probe_cmd


def _main(argv):
    from diag.cli import main

    return main(["probe", *argv])


def test_probe_json_and_capture(server, tmp_path, capsys):
    rc = _main([server.url("ok"), "--api", "chat", "-c", "2", "-n", "4", "--warmup", "1", "--input-tokens", "16",
                "--output-tokens", "3", "-o", str(tmp_path / "cap"), "--json", "--slo", "ttft_p99=2s"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metrics"]["requests"]["ok"] == 4 and doc["api"] == "chat"
    assert doc["metrics"]["slo"]["all_met"] is True and "ttft_s" in doc["definitions"]
    assert (tmp_path / "cap" / "spans.otlp.jsonl").exists()


def test_failed_requests_still_exit_zero_with_a_summary(server, tmp_path, capsys):
    # the server answers 503 to every path, /v1/models too: without --wait-ready 0 the probe would
    # first wait its default 60 s for a server that looks like it is still loading
    rc = _main([server.url("http503"), "-n", "2", "--warmup", "0", "--no-capture", "--no-progress",
                "--wait-ready", "0"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "error http_5xx: 2" in out and "client:" in out


def test_a_refusing_server_gets_one_line_naming_the_flag(server, tmp_path, capsys):
    # like transformers serve: 422 "Unexpected fields" on min_tokens/ignore_eos
    rc = _main([server.url("strict"), "-n", "2", "--warmup", "0", "-o", str(tmp_path / "c"), "--no-progress"])
    assert rc == 0
    cap = capsys.readouterr()
    text = cap.out + cap.err
    lines = [ln for ln in text.splitlines() if "compatibility:" in ln]
    assert len(lines) == 1 and "--no-exact-output" in lines[0] and "Unexpected fields" in lines[0]
    assert "error http_4xx" not in text
    # the flag the line names skips the check, and the run still completes
    rc = _main([server.url("strict"), "-n", "2", "--warmup", "0", "--no-capture", "--no-progress",
                "--no-exact-output", "--no-compat-check"])
    assert rc == 0 and "compatibility:" not in capsys.readouterr().out


def test_sweep_text_output(server, tmp_path, capsys):
    rc = _main([server.url("ok"), "--sweep", "prompt", "--sweep-values", "32,64", "-n", "1", "--warmup", "0",
                "-o", str(tmp_path / "c"), "--progress"])
    assert rc == 0
    cap = capsys.readouterr()
    assert "prompt=32" in cap.out and "prompt=64" in cap.out and "capture:" in cap.out
    assert "prompt=64" in cap.err  # the forced progress line


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--input-tokens", "uniform:9-1"], "length spec"),
        (["--slo", "ttft=3"], "bad SLO item"),
        (["--workers", "0"], "--workers"),
        (["--sweep-values", "1,2"], "need --sweep"),
        (["--sweep", "concurrency", "--sweep-values", "1,x"], "sweep-values"),
        (["--prompts", "/nonexistent.jsonl"], "no such prompts file"),
        (["--max-concurrency", "4"], "goes with --rate"),
    ],
)
def test_usage_errors_are_one_line_exit_2(server, capsys, argv, msg):
    rc = _main([server.url("ok"), "--no-capture", *argv])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1


def test_parser_registers():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    probe_cmd.add_parser(sub)
    args = parser.parse_args(["probe", "http://x:1", "--rate", "5", "--duration", "3", "--burstiness", "0.5"])
    cfg, sweep = probe_cmd.build_config(args)
    assert cfg.load.rate_rps == 5 and cfg.load.duration_s == 3 and cfg.load.concurrency == 256 and sweep is None
