"""``ttft serve``: flags, the listening line, a capture, clean shutdown; bad flags exit 2."""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import time
import urllib.request

import pytest

from diag.cli.commands import serve
from support.engine_testutil import serve_process

LAUNCH = (
    "import argparse, sys; from diag.cli.commands import serve; p = argparse.ArgumentParser(prog='ttft'); "
    "sub = p.add_subparsers(); serve.add_parser(sub); sys.exit(serve.run(p.parse_args(sys.argv[1:])))"
)


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve.add_parser(p.add_subparsers())
    return p.parse_args(["serve", *argv])


def test_policies_literal_matches_the_scheduler():
    from diag.bundled_engine.scheduler_types import POLICIES

    assert serve.POLICIES == POLICIES


def test_defaults_and_flags():
    a = _parse("--tp", "2", "--policy", "chunked", "--chunk-size", "64", "--inject", "scheduler_stall_ms=5",
               "--inject", "load_delay_s=1", "--kv-blocks", "32", "--port", "0")
    assert a.tp == 2 and a.policy == "chunked" and a.chunk_size == 64 and a.kv_blocks == 32 and a.port == 0
    assert a.inject == ["scheduler_stall_ms=5", "load_delay_s=1"]
    d = _parse()
    assert d.host == "127.0.0.1" and d.model == "tiny" and d.device == "cpu" and d.tp == 1
    assert d.grammar_cache_size == 64 and d.grammar_workers == 1
    g = _parse("--grammar-cache-size", "0", "--grammar-workers", "3", "--inject", "grammar_compile_ms=250")
    assert g.grammar_cache_size == 0 and g.grammar_workers == 3 and g.inject == ["grammar_compile_ms=250"]
    assert not d.pd and d.pd_decode_kv_blocks is None and d.pd_decode_max_running is None
    p = _parse("--pd", "--pd-decode-kv-blocks", "64", "--pd-decode-max-running", "4", "--inject", "kv_transfer_ms_per_mb=20")
    assert p.pd and p.pd_decode_kv_blocks == 64 and p.pd_decode_max_running == 4
    assert d.lora_modules == [] and d.max_loras is None and d.max_cpu_loras is None and d.max_lora_rank == 16
    lo = _parse("--lora-modules", "a", "b=/x", "--max-loras", "2", "--max-cpu-loras", "3", "--max-lora-rank", "8",
                "--inject", "lora_load_ms=20")
    assert lo.lora_modules == ["a", "b=/x"] and (lo.max_loras, lo.max_cpu_loras, lo.max_lora_rank) == (2, 3, 8)


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--inject", "nope=1"], "unknown fault 'nope'"),
        (["--inject", "scheduler_stall_ms=x"], "is not a number"),
        (["--port", "70000"], "--port must be in"),
        (["--inject", "collective_latency_ms=3"], "needs --tp 2"),
        (["--model", "/no/such/dir"], "not a preset"),
        (["--max-running", "0"], "max_running must be >= 1"),
        (["--keepalive-timeout", "0"], "--keepalive-timeout must be > 0"),
        (["--grammar-cache-size", "-1"], "--grammar-cache-size must be >= 0"),
        (["--grammar-workers", "0"], "--grammar-workers >= 1"),
        (["--inject", "grammar_compile_ms=-5"], "grammar_compile_ms must be between 0 and"),
        (["--pd", "--tp", "2"], "--pd with --tp 2: the bundled engine does not combine"),
        (["--pd", "--pp", "2"], "--pd with --pp 2"),
        (["--inject", "kv_transfer_latency_ms=5"], "need --pd"),
        (["--pd-decode-kv-blocks", "8"], "need --pd"),
        (["--max-loras", "2"], "need --lora-modules"),
        (["--inject", "lora_load_ms=5"], "lora_load_ms needs --lora-modules"),
        (["--lora-modules", "a", "a"], "adapter 'a' is named twice"),
        (["--lora-modules", "a,b"], "--lora-modules 'a,b': expected NAME or NAME=PATH"),
        (["--lora-modules", "tiny"], "adapter 'tiny' has the base model's name"),
        (["--lora-modules", "a", "--tp", "2"], "--lora-modules with --tp 2"),
        (["--lora-modules", "a", "--pd"], "--lora-modules with --pd"),
        (["--lora-modules", "a", "--max-loras", "2", "--max-cpu-loras", "1"], "--max-cpu-loras (1) must be >= --max-loras (2)"),
        (["--lora-modules", "a=/no/such/adapter"], "/no/such/adapter: not a LoRA adapter directory"),
    ],
)
def test_bad_flags_exit_2_with_one_line(capsys, argv, msg):
    assert serve.run(_parse(*argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ttft serve: error:") and msg in err and "\n" not in err


def test_serve_subprocess_end_to_end(tmp_path):
    cap = tmp_path / "cap"
    cmd = [sys.executable, "-c", LAUNCH, "serve", "--port", "0", "--capture", str(cap), "--policy", "chunked",
           "--inject", "tokenize_ms_per_token=0.5", "--grammar-cache-size", "5", "--grammar-workers", "2"]
    with serve_process(cmd) as (proc, line):
        m = re.fullmatch(r"ttft serve: listening on (http://127\.0\.0\.1:(\d+)) \(model=tiny, device=cpu, tp=1\)\n", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = m.group(1)
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps({"prompt": "hi", "max_tokens": 3}).encode(),
                                     headers={"Content-Type": "application/json"})
        body = json.loads(urllib.request.urlopen(req, timeout=30).read())
        assert body["usage"]["completion_tokens"] >= 1
    rc = proc.returncode
    assert rc == 0, proc.stderr.read()
    meta = json.loads((cap / "meta.json").read_text())
    assert meta["faults_injected"] == {"tokenize_ms_per_token": 0.5}
    assert meta["engine_config"]["grammar_cache_size"] == 5 and meta["engine_config"]["grammar_workers"] == 2
    names = {s["name"] for line in (cap / "spans.otlp.jsonl").read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
    assert {"ttft.request", "tokenize", "queue", "prefill", "sample", "detokenize", "ttft.cold_start"} <= names


def _health_on(sock: socket.socket) -> bytes:
    """One GET /health on an open keep-alive connection; the whole response (its Content-Length body)."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "closed before the response"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += sock.recv(4096)
    return head


def test_keepalive_timeout_closes_an_idle_connection():
    """--keepalive-timeout S: a connection idle for S is closed by the server (as uvicorn's and
    cpp-httplib's 5 s do); within S the same connection serves the next request."""
    cmd = [sys.executable, "-c", LAUNCH, "serve", "--port", "0", "--keepalive-timeout", "0.4"]
    with serve_process(cmd) as (proc, line):
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        with socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=10) as sock:
            assert _health_on(sock).startswith(b"HTTP/1.1 200")
            time.sleep(0.1)
            assert _health_on(sock).startswith(b"HTTP/1.1 200")  # idle 0.1 s < 0.4 s: kept
            t0 = time.monotonic()
            assert sock.recv(1) == b""  # the server closed it
            idle_s = time.monotonic() - t0
    assert 0.3 <= idle_s <= 3.0, idle_s
