"""Hugging Face ``transformers serve`` as a real third-party engine for the tests.

:func:`build_tiny_llama` saves a random-weight Llama (2 layers, hidden 64) with the bundled
engine's byte-level BPE tokenizer and a plain chat template — no hub access.
:class:`TransformersServe` runs ``transformers serve MODEL_DIR`` as a subprocess on a free
loopback port (plain, one request at a time; or ``--continuous-batching``) and stops it;
:class:`InstrumentedTransformersServe` runs it under ``ttft instrument``.

What this engine exposes (transformers 5.2x, ``transformers/cli/serve.py``): no ``/metrics``,
no traces; ``usage`` in the last chunk of a stream; a role-only chunk sent before the prompt's
forward (TTFT must not end there); HTTP 422 "Unexpected fields" for ``min_tokens`` and
``ignore_eos`` (the probe's compatibility check drops them). Seen from the probe, also: its
text streamer emits text only up to the last space, so the first content of a random-weight
model waits a random number of decode steps (``build_tiny_llama(spaced=True)`` makes every
token space-led); its first ~20 requests after start run several times slower than the rest
(a start-up with no span: the client sees only slow first requests); plain mode serves one
request at a time.

What the tool can and cannot say from it (client only; tests/thirdparty/test_transformers_verdicts.py):
it can name ``queue`` in plain mode at one load level (first tokens each following another
stream's end), ``prefill_compute`` from a prompt-length sweep at concurrency 1, ``healthy`` at
light load, and report slow first requests apart; it cannot split TTFT into stages (no spans,
no /metrics: tokenize, queue and prefill are one number), cannot tell network from the server's
front end, cannot see the model load (no cold-start span), and at a single prompt length and
concurrency 1 it can only say ``inconclusive`` when TTFT is many decode steps long.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from vllm_serve import free_port

TOKENIZER_JSON = Path(__file__).resolve().parents[2] / "diag" / "bundled_engine" / "data" / "tokenizer.json"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
#: ``extra_args`` for ``--continuous-batching`` on a CPU: a small paged KV cache (the default sizes
#: it from free memory, and building the batch processor's static tensors then takes many seconds)
CB_SMALL_CACHE_ARGS: list[str] = ["--cb-num-blocks", "128", "--cb-block-size", "32"]


def build_tiny_llama(out_dir: Path, seed: int = 0, *, hidden_size: int = 64, layers: int = 2,
                     spaced: bool = False) -> Path:
    """Save a random-weight tiny Llama and its tokenizer in ``out_dir``; returns it.

    ``hidden_size``/``layers`` size it (a larger one makes a long prompt's prefill cost real time
    on a CPU). ``spaced``: the output rows of the tokens that start with a space are scaled x100,
    so the model (greedy or sampled) says a space-led token every step. The server's text
    streamer emits text only up to the last space, so with random tokens the first content waits
    a random number of decode steps; spaced, the first content comes a step after the first
    token and TTFT measures the prompt's work, not the streamer's.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_JSON))
    tok.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    tok.chat_template = CHAT_TEMPLATE
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    if spaced:
        vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
        rows = [i for i, t in enumerate(vocab) if t.startswith("\u0120") and len(t) > 1]
        with torch.no_grad():
            model.lm_head.weight[rows] *= 100.0
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def serve_command() -> list[str]:
    """The ``transformers`` CLI of the running interpreter's environment."""
    exe = Path(sys.executable).with_name("transformers")
    return [str(exe)] if exe.exists() else [shutil.which("transformers") or "transformers"]


class TransformersServe:
    """``with TransformersServe(model_dir, continuous_batching=False) as srv: srv.url``.

    Starts the server, waits until ``/health`` answers (``start_timeout_s``), and on exit
    (or :meth:`stop`) sends SIGINT, then SIGTERM, then kills it, each when it has not stopped within
    10 s (``srv.killed``). The log is ``srv.log_path``.
    """

    def __init__(self, model_dir: Path, continuous_batching: bool = False, start_timeout_s: float = 90.0,
                 extra_args: list[str] | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.continuous_batching = continuous_batching
        self.start_timeout_s = start_timeout_s
        self.extra_args = list(extra_args or [])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.model_dir.parent / f"serve-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None
        self.killed = False

    def command(self) -> list[str]:
        """The server's command line (``__enter__`` runs it)."""
        cmd = [*serve_command(), "serve", str(self.model_dir), "--host", "127.0.0.1", "--port", str(self.port),
               "--device", "cpu", *self.extra_args]
        if self.continuous_batching:
            cmd.append("--continuous-batching")
        return cmd

    def __enter__(self) -> TransformersServe:
        cmd = self.command()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        log = open(self.log_path, "wb")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        while time.monotonic() - t0 < self.start_timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        self.started_s = time.monotonic() - t0
                        return self
            except OSError:
                time.sleep(0.25)
        self.__exit__()
        raise RuntimeError(f"transformers serve did not answer /health in {self.start_timeout_s:g} s: {self.log_tail()}")

    def stop(self) -> int | None:
        """Stop the server (if it runs); its exit code, None if it never started."""
        if self.proc is None:
            return None
        # transformers serve --continuous-batching does not exit on SIGINT by itself (its CB loop
        # thread is not a daemon; the same without ttft instrument): SIGTERM follows, as a supervisor would send
        for sig in (signal.SIGINT, signal.SIGTERM):
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
            self.proc.wait(5)
        return self.proc.returncode

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n_chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return "(no log)"


def ttft_command() -> list[str]:
    """The ``ttft`` CLI of the running interpreter's environment (``python -m diag`` without one)."""
    exe = Path(sys.executable).with_name("ttft")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "diag"]


class InstrumentedTransformersServe(TransformersServe):
    """The same server under ``ttft instrument --capture CAPTURE_DIR [INSTRUMENT_ARGS] -- transformers serve ...``
    (``capture_dir`` None: no ``--capture``, e.g. ``INSTRUMENT_ARGS`` ``--otlp URL``)."""

    def __init__(self, model_dir: Path, capture_dir: Path | None, instrument_args: list[str] | None = None,
                 **kwargs: object) -> None:
        super().__init__(model_dir, **kwargs)  # type: ignore[arg-type]
        self.capture_dir = Path(capture_dir) if capture_dir is not None else None
        self.instrument_args = list(instrument_args or [])

    def command(self) -> list[str]:
        capture = ["--capture", str(self.capture_dir)] if self.capture_dir is not None else []
        return [*ttft_command(), "instrument", *capture, *self.instrument_args, "--", *super().command()]
