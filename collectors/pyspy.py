"""py-spy sampler: attach to a serving process for a window, attribute its CPU samples to stages.

py-spy has no Python API; it is driven as a subprocess::

    py-spy record --pid PID --duration S --rate R --format raw -o FILE [--gil] [--idle] [--nonblocking]

The raw format is one line per distinct stack, ``frame;frame;...;leaf COUNT``, root first, each
frame ``func (file.py:line)`` with a package-relative file name (``vllm/v1/core/sched/
scheduler.py``); ``process PID:"cmdline"`` and ``thread (ID): name`` prefixes may lead.
There are no timestamps: the result is a profile of the window, not a time series.

**Attribution.** Each sample goes to exactly one CPU stage: walk its stack from the leaf towards
the root and take the *deepest frame that matches any rule* of the engine's :class:`PatternSet`;
within that frame the *first rule in the set's order* wins. Frames no rule matches are
transparent (time in an unmatched helper counts for its nearest matching caller); a stack with
no matching frame is ``other``. Without ``--native``, time in C/Rust extensions (HF tokenizers,
torch kernels launched from Python) is charged to the Python frame that called them. Without
``idle=True`` py-spy drops idle threads, so ``idle`` then only holds busy-waits it sees.

Front door: :class:`PySpySampler` (``record()``, or ``start()`` then ``wait()``/``stop()``;
``save(capture_dir)``), :func:`parse_raw`, :func:`attribute`, :data:`PATTERN_SETS`.
The sampler is a :class:`collectors.base.SeriesCollector`: once its window ended,
``collect()`` gives the window's samples per stage as series rows (one timestamp, the end).
Threading: a sampler object is driven from one owner thread (``collect()`` from any);
py-spy itself runs as a child process.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from collectors.base import empty_series_frame
from diag import stages as S

# --- CPU stages (what a sample is attributed to): defined in diag.stages ----------------------
CPU_TOKENIZE = S.TOKENIZE  # prompt -> ids, chat template, input processing
CPU_SCHEDULER = S.CPU_SCHEDULER
CPU_SERIALIZATION = S.CPU_SERIALIZATION
CPU_HTTP = S.CPU_HTTP
CPU_FORWARD = S.CPU_FORWARD
CPU_COMM = S.COMM  # torch.distributed collectives (CPU-side wait/launch)
CPU_SAMPLE = S.SAMPLE  # logits -> token (top-k/top-p, penalties, grammar masks)
CPU_DETOKENIZE = S.DETOKENIZE  # ids -> text
CPU_IDLE = S.CPU_IDLE
CPU_OTHER = S.CPU_OTHER
CPU_STAGES: tuple[str, ...] = S.CPU_STAGES

#: the series rows of a window: source, series name (value: samples), entity "pid<PID>/<stage>"
SOURCE = "pyspy"
SERIES_CPU_SAMPLES = "cpu_samples"

PROFILE_DIR = "profile"
RAW_FILE = "pyspy.raw.txt"
SUMMARY_FILE = "pyspy.json"
PTRACE_HINT = (
    "run as root, grant CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE; Kubernetes: "
    "securityContext.capabilities.add: [SYS_PTRACE]) or set sysctl kernel.yama.ptrace_scope=0"
)


class PySpyError(RuntimeError):
    """py-spy could not profile the target; the message is one line that says why."""


class PySpyUnavailable(PySpyError):
    """The py-spy executable is not installed."""


class PySpyPermissionError(PySpyError):
    """ptrace (process_vm_readv) was refused by the kernel or the container."""


# --- the raw format ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One Python frame as py-spy prints it: ``func (file:line)``; line is None with --nolineno."""

    func: str
    file: str
    line: int | None = None

    def label(self) -> str:
        """``func (file)`` without the line: the key used in top-frame tables."""
        return f"{self.func} ({self.file})" if self.file else self.func


@dataclass(frozen=True)
class Stack:
    """A distinct stack (root first) and how many samples had it."""

    frames: tuple[Frame, ...]
    count: int
    pid: int | None = None
    thread: str | None = None


_FRAME_RE = re.compile(r"^(?P<func>.*) \((?P<loc>[^()]*)\)$")
_THREAD_RE = re.compile(r"^thread \((?P<id>[^)]*)\)(?::[^;]*)?;")
_PROCESS_RE = re.compile(r'^process (?P<pid>\d+):"')


def _parse_frame(text: str) -> Frame:
    m = _FRAME_RE.match(text)
    if m is None:
        return Frame(text.strip(), "")
    loc = m.group("loc")
    file, sep, line = loc.rpartition(":")
    if sep and line.isdigit():
        return Frame(m.group("func"), file, int(line))
    return Frame(m.group("func"), loc)


def parse_raw(text: str, source: str = "<raw>") -> list[Stack]:
    """Parse py-spy's ``--format raw`` output. A malformed line raises ValueError naming it."""
    stacks: list[Stack] = []
    for lineno, raw_line in enumerate(text.splitlines(), 1):
        line = raw_line.rstrip()
        if not line.strip():
            continue
        body, sep, count_s = line.rpartition(" ")  # " 1": a sample with no Python frame
        if not sep or not count_s.isdigit():
            raise ValueError(f"{source}: line {lineno}: not 'frame;...;frame COUNT': {line[:80]!r}")
        pid: int | None = None
        while True:  # process prefixes (nested with --subprocesses): keep the innermost
            m = _PROCESS_RE.match(body)
            if m is None:
                break
            end = body.find('";', m.end())
            if end < 0:
                body = ""
                break
            pid = int(m.group("pid"))
            body = body[end + 2:]
        thread: str | None = None
        m = _THREAD_RE.match(body)
        if m is not None:
            thread = m.group("id")
            body = body[m.end():]
        frames = tuple(_parse_frame(f) for f in body.split(";") if f) if body else ()
        stacks.append(Stack(frames, int(count_s), pid, thread))
    return stacks


# --- rules -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A frame matches when every given pattern ``search``-es: file (py-spy's short file
    name) and func (``Class.method`` as py-spy prints it). ``leaf_only``: only as the leaf."""

    stage: str
    file: re.Pattern[str] | None = None
    func: re.Pattern[str] | None = None
    leaf_only: bool = False
    why: str = ""

    def matches(self, frame: Frame, is_leaf: bool) -> bool:
        return self._matches(frame.file, _match_name(frame.func), is_leaf)

    def _matches(self, file: str, func: str, is_leaf: bool) -> bool:
        if self.leaf_only and not is_leaf:
            return False
        if self.file is not None and not self.file.search(file):
            return False
        return self.func is None or bool(self.func.search(func))


_COMPREHENSION_RE = re.compile(r"(\.<locals>)?\.<(listcomp|genexpr|dictcomp|setcomp|lambda)>$")


def _match_name(func: str) -> str:
    """``Tok.decode.<locals>.<genexpr>`` -> ``Tok.decode``: a comprehension or lambda counts
    as the function that holds it."""
    while True:
        new = _COMPREHENSION_RE.sub("", func)
        if new == func:
            return func
        func = new


def _r(stage: str, file: str | None = None, func: str | None = None, *, leaf_only: bool = False,
       why: str = "") -> Rule:
    return Rule(stage, re.compile(file) if file else None, re.compile(func) if func else None,
                leaf_only, why)


@dataclass(frozen=True)
class PatternSet:
    """The rules of one engine, in priority order (the first match within a frame wins)."""

    engine: str
    rules: tuple[Rule, ...]

    def classify(self, frame: Frame, is_leaf: bool = False) -> str | None:
        """The stage of the first rule that matches ``frame``, or None."""
        func = _match_name(frame.func)
        for rule in self.rules:
            if rule._matches(frame.file, func, is_leaf):
                return rule.stage
        return None


# Shared by every engine; engine rules come first so that they win within a frame.
_DECODE_FUNCS = r"(^|\.)(decode\w*|batch_decode|_decode\w*|convert_ids_to_tokens|convert_tokens_to_string|id_to_token|detokeni\w*)$"
_TOKENIZER_LIBS = (r"(^|/)(tokenizers|sentencepiece|tiktoken)/|(^|/)transformers/(tokenization_\w+"
                   r"|models/[^/]+/tokenization_\w+)\.py$")
_STDLIB = r"(^|/lib/python[\d.]+/)"  # py-spy prints stdlib files bare ("threading.py")
COMMON_RULES: tuple[Rule, ...] = (
    # idle: the thread is blocked waiting (deep frames, so they win over their callers)
    _r(CPU_IDLE, _STDLIB + r"((selectors|threading|queue|socket|ssl|subprocess)\.py"
                 r"|multiprocessing/(connection|queues|synchronize|popen_\w+|pool)\.py"
                 r"|concurrent/futures/_base\.py|asyncio/(queues|locks|tasks)\.py)$",
       r"(^|\.)(select|poll|epoll|wait\w*|get|recv\w*|accept|acquire|join|result|sleep|_poll|_recv\w*|read|readinto)$",
       why="blocked in select/poll/wait/get/recv"),
    _r(CPU_IDLE, _STDLIB + r"concurrent/futures/thread\.py$", r"(^|\.)_worker$", leaf_only=True,
       why="thread-pool worker waiting for work"),
    _r(CPU_IDLE, r"(^|/)zmq/", r"(^|\.)(poll|_poll\w*|wait\w*)$", why="zmq poll"),
    _r(CPU_SERIALIZATION, r"(^|/)zmq/", r"(^|\.)(send|recv)_(pyobj|json|serialized)$",
       why="zmq pickling/json of messages"),
    # tokenizer libraries: decode-type calls are detokenize, the rest tokenize
    _r(CPU_DETOKENIZE, _TOKENIZER_LIBS, _DECODE_FUNCS, why="tokenizer library decode"),
    _r(CPU_TOKENIZE, _TOKENIZER_LIBS, why="tokenizer library"),
    _r(CPU_TOKENIZE, r"(^|/)jinja2/", why="chat template rendering"),
    _r(CPU_COMM, r"(^|/)torch/distributed/", why="torch.distributed collective"),
    _r(CPU_SERIALIZATION,
       r"(^|/)(json|orjson|ujson|simplejson|msgspec|msgpack|pydantic|pydantic_core|google/protobuf|cloudpickle)/"
       r"|(^|/)(pickle|copyreg|_pickle)\.py$",
       why="JSON / msgspec / pickle / protobuf / pydantic"),
    _r(CPU_HTTP,
       r"(^|/)(aiohttp|uvicorn|starlette|fastapi|sse_starlette|h11|h2|httptools|httpx|httpcore|urllib3"
       r"|requests|werkzeug|flask|websockets|grpc)/|"
       + _STDLIB + r"(http/server|http/client|socketserver|asyncio/(streams|selector_events|sslproto))\.py$",
       why="HTTP server/client and socket transports"),
)

_BUNDLED = r"(^|/)(diag/)?engine/"
BUNDLED = PatternSet("bundled", (
    _r(CPU_DETOKENIZE, _BUNDLED + r"tokenizer\.py$",
       r"^IncrementalDetokenizer\.|(^|\.)(decode\w*|_decode\w*|detokeni\w*)$",
       why="diag/engine/tokenizer.py decode / IncrementalDetokenizer"),
    _r(CPU_TOKENIZE, _BUNDLED + r"tokenizer\.py$", why="diag/engine/tokenizer.py (encode, chat template)"),
    _r(CPU_DETOKENIZE, _BUNDLED, r"(^|\.)_?detokeni\w*$", why="a detokenize function in the engine"),
    _r(CPU_TOKENIZE, _BUNDLED, r"(^|\.)_?tokeni[sz]e\w*$", why="a tokenize function in the engine"),
    _r(CPU_SAMPLE, _BUNDLED + r"sampler\.py$", why="diag/engine/sampler.py"),
    _r(CPU_COMM, _BUNDLED + r"tp\.py$", r"(^|\.)_?(all_reduce|all_gather\w*|broadcast\w*|barrier|reduce_scatter\w*)$",
       why="diag/engine/tp.py collectives"),
    _r(CPU_FORWARD, _BUNDLED + r"(model|tp)\.py$", why="diag/engine/model.py forward, tp.py runners"),
    _r(CPU_SCHEDULER, _BUNDLED + r"scheduler\.py$", why="diag/engine/scheduler.py"),
    _r(CPU_HTTP, _BUNDLED + r"server\.py$", why="diag/engine/server.py (HTTP, SSE)"),
    _r(CPU_SCHEDULER, _BUNDLED + r"engine\.py$", why="diag/engine/engine.py step loop bookkeeping"),
) + COMMON_RULES)

VLLM = PatternSet("vllm", (
    _r(CPU_DETOKENIZE, r"(^|/)vllm/v1/engine/detokenizer\.py$|(^|/)vllm/(tokenizers|transformers_utils)/detokenizer\w*\.py$"
                       r"|(^|/)vllm/engine/output_processor/",
       why="vllm/v1/engine/detokenizer.py (IncrementalDetokenizer)"),
    _r(CPU_DETOKENIZE, r"(^|/)vllm/(tokenizers|transformers_utils)/", _DECODE_FUNCS, why="vLLM tokenizer decode"),
    _r(CPU_TOKENIZE, r"(^|/)vllm/v1/engine/(input_)?processor\.py$|(^|/)vllm/inputs/(preprocess|parse)\.py$"
                     r"|(^|/)vllm/(tokenizers|renderers|multimodal)/|(^|/)vllm/transformers_utils/tokenizer\w*"
                     r"|(^|/)vllm/entrypoints/(chat_utils|renderer)\.py$",
       why="input processing: tokenizer, chat template, multimodal"),
    _r(CPU_TOKENIZE, r"(^|/)vllm/entrypoints/", r"(^|\.)_?(\w*tokeni[sz]e\w*|preprocess\w*|normalize_prompt\w*|render\w*|\w*chat_template\w*)$",
       why="OpenAI server tokenizing/rendering the prompt"),
    _r(CPU_SAMPLE, r"(^|/)vllm/v1/sample/|(^|/)vllm/model_executor/layers/(sampler|rejection_sampler)\.py$"
                   r"|(^|/)vllm/v1/structured_output/|(^|/)vllm/model_executor/guided_decoding/",
       why="vllm/v1/sample (top-k/top-p, penalties, logprobs), structured output"),
    _r(CPU_FORWARD, r"(^|/)vllm/(v1/worker|worker|model_executor|attention|v1/attention|compilation"
                    r"|v1/executor|executor|v1/spec_decode|lora)/|(^|/)vllm/forward_context\.py$"
                    r"|(^|/)vllm/distributed/device_communicators/shm_broadcast\.py$",
       why="model runner / executor (shm_broadcast: engine waiting on the workers' forward)"),
    _r(CPU_COMM, r"(^|/)vllm/distributed/", why="vllm/distributed collectives"),
    _r(CPU_SCHEDULER, r"(^|/)vllm/v1/core/|(^|/)vllm/core/|(^|/)vllm/v1/engine/core\.py$",
       why="vllm/v1/core/sched/scheduler.py, KV-cache manager, EngineCore loop"),
    _r(CPU_SERIALIZATION, r"(^|/)vllm/v1/serial_utils\.py$", why="msgpack IPC between front end and engine core"),
    _r(CPU_HTTP, r"(^|/)vllm/entrypoints/", why="vllm/entrypoints/openai API server"),
) + COMMON_RULES)

_SRT = r"(^|/)sglang/srt/"
SGLANG = PatternSet("sglang", (
    _r(CPU_DETOKENIZE, _SRT + r"managers/detokenizer_manager\.py$", why="DetokenizerManager"),
    _r(CPU_TOKENIZE, _SRT + r"managers/tokenizer_manager\w*\.py$", r"(^|\.)_?(\w*tokeni[sz]\w*|_create_tokenized_object)$",
       why="TokenizerManager._tokenize_one_request / batch tokenize"),
    _r(CPU_TOKENIZE, _SRT + r"managers/(async_dynamic_batch_tokenizer|multimodal_processor|mm_utils)\.py$"
                     + r"|" + _SRT + r"(utils/)?hf_transformers_utils\.py$|" + _SRT + r"(conversation|jinja_template_utils)\.py$"
                     + r"|" + _SRT + r"multimodal/",
       why="tokenizer helpers, chat templates, multimodal processing"),
    _r(CPU_TOKENIZE, _SRT + r"(entrypoints|openai_api)/", r"(^|\.)_?(process_messages|\w*chat_template\w*|\w*tokeni[sz]e\w*)$",
       why="OpenAI server applying the chat template"),
    _r(CPU_SAMPLE, _SRT + r"layers/sampler\.py$|" + _SRT + r"(sampling|constrained)/",
       why="sglang/srt/layers/sampler.py, sampling params, grammar"),
    _r(CPU_FORWARD, _SRT + r"(model_executor|models|layers|speculative|lora)/|" + _SRT + r"managers/tp_worker\w*\.py$",
       why="TpModelWorker / ModelRunner forward"),
    _r(CPU_COMM, _SRT + r"distributed/", why="sglang/srt/distributed collectives"),
    _r(CPU_SCHEDULER, _SRT + r"managers/(scheduler\w*|schedule_batch|schedule_policy|data_parallel_controller)\.py$"
                      + r"|" + _SRT + r"mem_cache/",
       why="sglang/srt/managers/scheduler.py, radix cache, allocators"),
    _r(CPU_HTTP, _SRT + r"(entrypoints|openai_api)/|" + _SRT + r"managers/tokenizer_manager\w*\.py$",
       why="http_server.py / OpenAI serving; the rest of TokenizerManager is request handling"),
) + COMMON_RULES)

GENERIC = PatternSet("generic", COMMON_RULES)

PATTERN_SETS: dict[str, PatternSet] = {p.engine: p for p in (BUNDLED, VLLM, SGLANG, GENERIC)}


def pattern_set(engine: str | PatternSet) -> PatternSet:
    """The rules for ``engine`` ("bundled", "vllm", "sglang", "generic") or the set itself."""
    if isinstance(engine, PatternSet):
        return engine
    try:
        return PATTERN_SETS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(PATTERN_SETS)}") from None


# --- the profile ------------------------------------------------------------------------------


@dataclass
class StageProfile:
    """CPU samples per stage for one py-spy window.

    ``shares[stage]`` = samples of that stage / ``samples_total`` (0..1, over thread-samples:
    with several busy threads a window of N seconds holds up to N × rate × threads samples;
    with ``gil=True`` only the GIL holder is sampled, so shares are of GIL time).
    ``top_frames[stage]``: the frames that decided the stage, most samples first.
    """

    engine: str
    samples_total: int
    counts: dict[str, int]
    top_frames: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def shares(self) -> dict[str, float]:
        n = self.samples_total
        return {s: (c / n if n else 0.0) for s, c in self.counts.items()}

    def busy_shares(self) -> dict[str, float]:
        """Shares of the non-idle samples (idle left out), 0..1."""
        busy = self.samples_total - self.counts.get(CPU_IDLE, 0)
        return {s: (c / busy if busy else 0.0) for s, c in self.counts.items() if s != CPU_IDLE}

    def dominant(self, include_idle: bool = False) -> str | None:
        """The stage with the most samples (None when there are none)."""
        items = [(c, s) for s, c in self.counts.items() if c and (include_idle or s != CPU_IDLE)]
        return max(items)[1] if items else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "samples_total": self.samples_total,
            "counts": dict(self.counts),
            "shares": self.shares,
            "busy_shares": self.busy_shares(),
            "top_frames": {s: [[f, c] for f, c in v] for s, v in self.top_frames.items()},
            "attribution": "inclusive: deepest frame matching any rule; first rule within a frame",
            **self.meta,
        }


def attribute(stacks: Iterable[Stack], engine: str | PatternSet = "bundled", top_n: int = 5) -> StageProfile:
    """Attribute every sample to one CPU stage (see the module docstring for the rule)."""
    ps = pattern_set(engine)
    counts: dict[str, int] = {s: 0 for s in CPU_STAGES}
    frames_by_stage: dict[str, Counter[str]] = {s: Counter() for s in CPU_STAGES}
    cache: dict[tuple[Frame, bool], str | None] = {}
    total = 0
    for st in stacks:
        total += st.count
        stage, decided = CPU_OTHER, None
        last = len(st.frames) - 1
        for i in range(last, -1, -1):
            key = (st.frames[i], i == last)
            got = cache.get(key, "")
            if got == "":
                got = cache[key] = ps.classify(st.frames[i], i == last)
            if got is not None:
                stage, decided = got, st.frames[i]
                break
        counts[stage] = counts.get(stage, 0) + st.count
        label = decided.label() if decided else (st.frames[-1].label() if st.frames else "<no frames>")
        frames_by_stage.setdefault(stage, Counter())[label] += st.count
    top = {s: c.most_common(top_n) for s, c in frames_by_stage.items() if c}
    return StageProfile(ps.engine, total, counts, top)


def attribute_raw(text: str, engine: str | PatternSet = "bundled", source: str = "<raw>") -> StageProfile:
    """:func:`parse_raw` then :func:`attribute`."""
    return attribute(parse_raw(text, source), engine)


# --- driving py-spy ----------------------------------------------------------------------------


def find_pyspy() -> str | None:
    """The py-spy executable: on PATH, else next to this Python (a venv's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    for name in ("py-spy", "py-spy.exe"):
        cand = Path(sys.executable).parent / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


_PERMISSION_MARKERS = ("permission denied", "operation not permitted", "os error 1)", "eperm",
                       "ptrace", "sys_ptrace", "elevated permissions")
_NOT_PYTHON_MARKERS = ("failed to find python version", "failed to get process executable name",
                       "no such file or directory", "failed to find python interpreter",
                       "no such process", "not a python")


def explain_failure(pid: int, returncode: int | None, stderr: str) -> PySpyError:
    """Turn py-spy's exit status and stderr into one clear line."""
    low = stderr.lower()
    if any(m in low for m in _PERMISSION_MARKERS):
        return PySpyPermissionError(f"py-spy cannot attach to PID {pid}: ptrace not permitted; {PTRACE_HINT}")
    if any(m in low for m in _NOT_PYTHON_MARKERS):
        return PySpyError(f"py-spy: PID {pid} is not a running Python process (or it exited)")
    detail = ""
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("Error:"):
            detail = line[len("Error:"):].strip()
            break
        if line and not line.startswith(("py-spy>", "Stack backtrace", "stack backtrace")) \
                and not re.match(r"^\d+:", line) and not detail:
            detail = line
    return PySpyError(f"py-spy failed on PID {pid} (exit {returncode}): {detail or 'no error text'}")


class PySpySampler:
    """Records one window of a process with py-spy and attributes it to CPU stages.

    ``duration_s`` is rounded up to whole seconds (py-spy's ``--duration`` is an integer);
    ``stop()`` ends a window early (SIGINT: py-spy writes what it has) and keeps the result in
    :attr:`profile` (a py-spy failure in :attr:`error`, raised again by :meth:`wait`).
    ``available`` is False with a one-line ``note`` when py-spy is not installed. One owner
    thread drives it; :meth:`collect` may be called from any thread.
    """

    def __init__(
        self,
        pid: int,
        *,
        duration_s: float = 10.0,
        rate_hz: int = 100,
        engine: str | PatternSet = "bundled",
        gil: bool = False,
        idle: bool = False,
        nonblocking: bool = False,
        subprocesses: bool = False,
        py_spy: str | None = None,
    ) -> None:
        if duration_s <= 0 or rate_hz <= 0:
            raise ValueError("duration_s and rate_hz must be > 0")
        self.pid = int(pid)
        self.duration_s = max(1, math.ceil(duration_s))
        self.rate_hz = int(rate_hz)
        self.patterns = pattern_set(engine)
        self.gil, self.idle, self.nonblocking, self.subprocesses = gil, idle, nonblocking, subprocesses
        self.exe = py_spy or find_pyspy()
        self.available = self.exe is not None
        self.note = ("" if self.available else
                     "py-spy unavailable: the py-spy executable is not installed (pip install py-spy)")
        self.raw_text = ""
        self.profile: StageProfile | None = None
        #: one line when the window failed (py-spy could not attach, no output); "" otherwise
        self.error = ""
        self._failure: PySpyError | ValueError | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._out: Path | None = None
        self._started_unix_s = 0.0
        self._ended_unix_s = 0.0

    def command(self, out_path: str | Path) -> list[str]:
        """The py-spy command line for one window written to ``out_path``."""
        cmd = [str(self.exe or "py-spy"), "record", "--pid", str(self.pid),
               "--duration", str(self.duration_s), "--rate", str(self.rate_hz),
               "--format", "raw", "-o", str(out_path)]
        if self.gil:
            cmd.append("--gil")
        if self.idle:
            cmd.append("--idle")
        if self.nonblocking:
            cmd.append("--nonblocking")
        if self.subprocesses:
            cmd.append("--subprocesses")
        return cmd

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Launch py-spy for the window (returns at once). Raises PySpyError (one line)."""
        if not self.available:
            raise PySpyUnavailable(self.note)
        if self._proc is not None:
            raise PySpyError("this sampler has already recorded a window; make a new one")
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            raise PySpyError(f"py-spy: no process with PID {self.pid}") from None
        except PermissionError:
            pass  # exists but belongs to someone else: py-spy will say whether it may attach
        self._tmp = tempfile.TemporaryDirectory(prefix="ttft-pyspy-")
        self._out = Path(self._tmp.name) / RAW_FILE
        self._started_unix_s = time.time()
        self._proc = subprocess.Popen(
            self.command(self._out), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )

    def wait(self, timeout_s: float | None = None) -> StageProfile:
        """Wait for the window to end (default: its duration + 30 s) and attribute it."""
        if self.profile is not None:
            return self.profile
        if self._failure is not None:
            raise self._failure
        if self._proc is None:
            raise PySpyError("py-spy was not started")
        limit = self.duration_s + 30.0 if timeout_s is None else timeout_s
        try:
            out, err = self._proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            self._proc.send_signal(signal.SIGINT)
            try:
                out, err = self._proc.communicate(timeout=10.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                out, err = self._proc.communicate()
        try:
            return self._finish(out, err)
        except (PySpyError, ValueError) as exc:  # no output, or output py-spy garbled
            self._failure, self.error = exc, str(exc)
            raise

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the window now (py-spy writes the samples so far) and attribute it into
        :attr:`profile`. Owner thread; waits at most about ``timeout_s`` (+10 s if py-spy
        ignores SIGINT); idempotent, a no-op when never started; a py-spy failure is kept in
        :attr:`error` instead of raised."""
        if self.profile is not None or self._failure is not None or self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
        try:
            self.wait(timeout_s)
        except (PySpyError, ValueError):
            pass  # kept in self.error

    def collect(self) -> pd.DataFrame:
        """The window's samples per CPU stage once it ended, else no rows (any thread).

        One row per stage of :data:`CPU_STAGES`: ``ts_s`` = the window's end (Unix s),
        ``source`` = ``"pyspy"``, ``series`` = ``"cpu_samples"``, ``entity`` =
        ``"pid<PID>/<stage>"``, ``value`` = samples (thread-samples, see :class:`StageProfile`).
        """
        prof = self.profile
        if prof is None:
            return empty_series_frame()
        names = list(prof.counts)
        return pd.DataFrame({
            "ts_s": [float(self._ended_unix_s)] * len(names),
            "source": [SOURCE] * len(names),
            "series": [SERIES_CPU_SAMPLES] * len(names),
            "entity": [f"pid{self.pid}/{name}" for name in names],
            "value": [float(prof.counts[name]) for name in names],
        }, columns=list(S.SERIES_COLUMNS))

    def record(self, capture_dir: str | Path | None = None) -> StageProfile:
        """start() + wait(); with ``capture_dir``, also save() into it."""
        self.start()
        prof = self.wait()
        if capture_dir is not None:
            self.save(capture_dir)
        return prof

    def _finish(self, out: bytes, err: bytes) -> StageProfile:
        assert self._proc is not None and self._out is not None
        self._ended_unix_s = time.time()
        stderr = (err or b"").decode("utf-8", "replace") + (out or b"").decode("utf-8", "replace")
        rc = self._proc.returncode
        try:
            if not self._out.exists():
                raise explain_failure(self.pid, rc, stderr)
            self.raw_text = self._out.read_text(encoding="utf-8", errors="replace")
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
        prof = attribute(parse_raw(self.raw_text, f"py-spy output for PID {self.pid}"), self.patterns)
        prof.meta = {
            "pid": self.pid,
            "rate_hz": self.rate_hz,
            "duration_s": self.duration_s,
            "window_unix_s": [self._started_unix_s, self._ended_unix_s],
            "options": {"gil": self.gil, "idle": self.idle, "nonblocking": self.nonblocking,
                        "subprocesses": self.subprocesses},
            "command": self.command(RAW_FILE),
            "py_spy_exit": rc,
        }
        if "process exited" in stderr:
            prof.meta["note"] = "the process exited during the window"
        if prof.samples_total == 0:
            prof.meta["note"] = ("py-spy recorded no samples: the process was idle "
                                 "(try idle=True) or exited")
        self.profile = prof
        return prof

    def save(self, capture_dir: str | Path) -> tuple[Path, Path]:
        """Write ``profile/pyspy.raw.txt`` and ``profile/pyspy.json`` into the capture."""
        if self.profile is None:
            raise PySpyError("nothing recorded yet")
        return save_profile(capture_dir, self.raw_text, self.profile)


def save_profile(capture_dir: str | Path, raw_text: str, profile: StageProfile) -> tuple[Path, Path]:
    """Write the raw py-spy output and its stage summary under ``<capture>/profile/``."""
    d = Path(capture_dir) / PROFILE_DIR
    d.mkdir(parents=True, exist_ok=True)
    raw_path, json_path = d / RAW_FILE, d / SUMMARY_FILE
    raw_path.write_text(raw_text, encoding="utf-8")
    json_path.write_text(json.dumps(profile.to_dict(), indent=2) + "\n", encoding="utf-8")
    return raw_path, json_path


def load_profile(capture_dir: str | Path, engine: str | PatternSet | None = None) -> StageProfile:
    """Re-attribute a saved raw profile (e.g. with another engine's rules)."""
    d = Path(capture_dir) / PROFILE_DIR
    raw_path = d / RAW_FILE
    if not raw_path.exists():
        raise FileNotFoundError(f"{raw_path}: no py-spy profile in this capture")
    if engine is None:
        try:
            engine = json.loads((d / SUMMARY_FILE).read_text(encoding="utf-8")).get("engine", "bundled")
        except (OSError, ValueError):
            engine = "bundled"
    assert engine is not None
    return attribute_raw(raw_path.read_text(encoding="utf-8", errors="replace"), engine, str(raw_path))


def record(pid: int, duration_s: float = 10.0, engine: str | PatternSet = "bundled",
           capture_dir: str | Path | None = None, **options: Any) -> StageProfile:
    """One window of ``pid`` attributed to stages; see :class:`PySpySampler` for options."""
    return PySpySampler(pid, duration_s=duration_s, engine=engine, **options).record(capture_dir)
