"""A real vLLM disaggregated prefill/decode pair for the tests, and a probe of it.

:func:`pair` starts two vLLM 0.32.0 ``api_server`` processes with vLLM's NixlConnector (``kv_producer``
for prefill, ``kv_consumer`` for decode, ``kv_buffer_device: cpu``: NIXL's UCX backend registers the
KV cache as host memory), each with its own NIXL side channel on 127.0.0.1, and the proxy of
``tests/support/pd_proxy.py`` before them; :func:`probe` runs ``ttft probe`` through the proxy with
``--metrics prefill=URL --metrics decode=URL``.

A slow link between the instances (``--link-rate``): run as a script inside a private network
namespace (``unshare -n``), this sets the namespace's loopback to a token-bucket rate (``tc qdisc
… tbf``; its MTU to 9000, below the bucket, or larger packets are never sent) and makes UCX use TCP
(``UCX_TLS=tcp,self``: shared memory would go around the link). Everything runs in that namespace
(the pair, the proxy, the probe), so nothing outside it is slowed. ``python vllm_pd.py --link-rate
16mbit --streams 1 OUT`` writes the probe's capture to OUT and exits 0; 3 with one line when the
namespace's link cannot be set (no ``tc`` or no ``tbf``), 4 when the pair cannot start. With
``--probe-args`` (the real-vLLM matrix's ``pd_transfer`` draws, ``vllm_matrix.py``) OUT is a folder:
:func:`capture` writes the probe's capture to ``OUT/cli`` and a scrape of both instances to
``OUT/scrape`` (5 when either fails), the decode instance started with ``--decode-args``.

Threads: two to start the instances at once; the servers and the proxy are child process groups.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hf_serve import ttft_command
from vllm_matrix import SCRAPE_INTERVAL_S, _background, _run, cpu_split, pinned, taskset
from vllm_serve import VLLMServe, free_port

CLIENT_CPUS, SERVER_CPUS = cpu_split()
PROXY = Path(__file__).resolve().parents[1] / "support" / "pd_proxy.py"


def instance(model: Path, python: Path, nixl: Path, role: str, log_dir: Path, args: Sequence[str] = (),
             ucx_tls: str | None = None) -> VLLMServe:
    """One instance of the pair: NixlConnector in ``role`` (kv_producer: prefill, kv_consumer:
    decode), its NIXL side channel on a free 127.0.0.1 port, UCX on the loopback (``ucx_tls``: its
    transports, default UCX's own choice)."""
    kv = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    pin = pinned(SERVER_CPUS)
    env = {**pin["env"], "PYTHONPATH": str(nixl), "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
           "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()), "UCX_NET_DEVICES": "lo"}
    if ucx_tls:
        env["UCX_TLS"] = ucx_tls
    return VLLMServe(model, ["--kv-transfer-config", json.dumps(kv), *args], env, prefix=pin["prefix"],
                     python=python, log_dir=log_dir)


@contextlib.contextmanager
def pair(model: Path, python: Path, nixl: Path, log_dir: Path, decode_args: Sequence[str] = (),
         ucx_tls: str | None = None) -> Iterator[tuple[str, str, str]]:
    """Prefill and decode instances started together, the proxy before them: yields (proxy, prefill,
    decode) URLs; stops all three on the way out. RuntimeError when an instance does not start."""
    pre = instance(model, python, nixl, "kv_producer", log_dir, (), ucx_tls)
    dec = instance(model, python, nixl, "kv_consumer", log_dir, decode_args, ucx_tls)
    proxy = None
    try:
        with ThreadPoolExecutor(2) as pool:
            for fut in [pool.submit(pre.start), pool.submit(dec.start)]:
                fut.result()
        proxy = subprocess.Popen([*taskset(CLIENT_CPUS), sys.executable, str(PROXY), pre.url, dec.url],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        assert proxy.stdout is not None
        line = proxy.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"the P/D proxy did not start: {line!r}")
        yield f"http://127.0.0.1:{line.split()[-1]}", pre.url, dec.url
    finally:
        if proxy is not None:
            proxy.kill()
            proxy.wait(10)
        pre.stop()
        dec.stop()


def probe(urls: tuple[str, str, str], out: Path, streams: int, requests: int = 30) -> subprocess.CompletedProcess[str]:
    """``ttft probe`` through the proxy, 64-token prompts and 16-token answers, both instances' /metrics."""
    proxy, pre, dec = urls
    return subprocess.run([*taskset(CLIENT_CPUS), *ttft_command(), "probe", proxy, "-n", str(requests), "-c",
                           str(streams), "--input-tokens", "64", "--output-tokens", "16", "--metrics", f"prefill={pre}",
                           "--metrics", f"decode={dec}", "-o", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=600)


def capture(urls: tuple[str, str, str], out_dir: Path, probe_args: Sequence[str]) -> None:
    """The real-vLLM matrix's captures of a pair: ``ttft probe`` through the proxy with ``probe_args``
    (``OUT/cli``: the client's), and beside it ``ttft scrape prefill=URL decode=URL`` of the two
    instances' own /metrics (``OUT/scrape``: the series ``--metrics prefill=URL --metrics decode=URL``
    would add to the probe's capture, labelled with their roles, kept apart so that the client's
    capture can be scored alone). RuntimeError when the probe or the scrape fails."""
    proxy, pre, dec = urls
    client = taskset(CLIENT_CPUS)
    with _background([*client, *ttft_command(), "scrape", f"prefill={pre}/metrics", f"decode={dec}/metrics",
                      "--interval", str(SCRAPE_INTERVAL_S), "-d", "900", "-o", str(out_dir / "scrape")]):
        _run([*client, *ttft_command(), "probe", proxy, *probe_args, "--timeout", "180", "--no-progress", "-o",
              str(out_dir / "cli")], timeout_s=600)


def run_on_slow_link(out: Path, model: Path, python: Path, nixl: Path, rate: str, args: Sequence[str],
                     timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    """This script (pair, proxy, probe) in a private network namespace (``unshare -n``) whose loopback
    runs at ``rate`` (tc, e.g. ``16mbit``), writing to ``out``; ``args``: its other options. Exit
    codes as :func:`main`'s."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests"), str(root / "tests" / "thirdparty")])}
    return subprocess.run(["unshare", "-n", "--kill-child", sys.executable, str(Path(__file__).resolve()), str(out),
                           "--model", str(model), "--python", str(python), "--nixl", str(nixl), "--link-rate", rate,
                           *args], capture_output=True, text=True, timeout=timeout_s, env=env)


def slow_loopback(rate: str) -> str | None:
    """Rate-limit this network namespace's loopback (call only inside a private one); None when set,
    else why not in one line."""
    cmds = [["ip", "link", "set", "lo", "mtu", "9000"], ["ip", "link", "set", "lo", "up"],
            ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate, "burst", "64kb", "latency", "2000ms"]]
    for cmd in cmds:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except OSError as exc:
            return f"`{' '.join(cmd[:3])}`: {exc.strerror or exc}"
        if r.returncode != 0:
            return f"`{' '.join(cmd)}`: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="probe a real vLLM P/D pair over a slow link (inside unshare -n)")
    ap.add_argument("out", type=Path, help="the probe's capture")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--python", type=Path, required=True, help="the vLLM venv's python")
    ap.add_argument("--nixl", type=Path, required=True, help="NIXL's folder (vllm_serve.install_nixl)")
    ap.add_argument("--link-rate", default=None, help="tc rate of the loopback, e.g. 16mbit (UCX over TCP)")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--decode-args", default="", help="the decode instance's own vLLM flags, one shell-quoted string")
    ap.add_argument("--probe-args", default=None,
                    help="the probe's load, one shell-quoted string (the matrix's draw): OUT is then a folder for "
                    "cli/ and scrape/ (capture())")
    a = ap.parse_args(argv)
    if a.link_rate:
        why = slow_loopback(a.link_rate)
        if why:
            print(f"vllm_pd: cannot slow the link: {why}", file=sys.stderr)
            return 3
    logs = a.out if a.probe_args is not None else a.out.parent
    try:
        with pair(a.model, a.python, a.nixl, logs, shlex.split(a.decode_args),
                  ucx_tls="tcp,self" if a.link_rate else None) as urls:
            if a.probe_args is not None:
                try:
                    capture(urls, a.out, shlex.split(a.probe_args))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"vllm_pd: the captures failed: {exc}", file=sys.stderr)
                    return 5
                return 0
            proc = probe(urls, a.out, a.streams)
    except RuntimeError as exc:
        print(f"vllm_pd: {exc}", file=sys.stderr)
        return 4
    sys.stderr.write(proc.stderr[-3000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
