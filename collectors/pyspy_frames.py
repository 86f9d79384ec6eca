"""py-spy frame classification: one frame -> one CPU stage, and the rules every Python stack shares.

A :class:`Rule` matches a :class:`Frame` (``func (file:line)`` as py-spy prints it) by regular
expressions on py-spy's short file name and on ``Class.method``. A :class:`PatternSet` is one
engine's rules in priority order; :meth:`PatternSet.classify_stack` picks a sample's stage:

1. walk the stack from the leaf to the root and take the *deepest frame that matches a primary
   rule*; within that frame the *first rule in the set's order* wins;
2. only when no frame matched a primary rule, do the same with the *fallback* rules (plumbing
   that holds everything else: the asyncio/uvloop event loop, ``nn.Module.__call__``, native
   torch libraries), so that plumbing never outranks the code it calls;
3. no match at all: ``other``.

Frames no rule matches are transparent. The shared tables here:

* :data:`COMMON_RULES` -- library frames any serving stack has: blocking waits (idle), HF
  tokenizers / sentencepiece / tiktoken and jinja2 chat templates, the llama-cpp-python bindings
  (read from its source, not attached to), torch.distributed, JSON /
  pydantic / msgspec / pickle, HTTP servers and clients (uvicorn, starlette, fastapi, aiohttp,
  h11, anyio, ...), ``torch.nn`` layers, HF logits processors and text streamers, and native
  frames seen through ``py-spy --native`` (libc waits, the Rust tokenizers, torch's sampling ops);
* :data:`NAME_RULES` -- what an unknown engine's own code usually calls things (``*.forward``,
  ``sample*``/``top_k``, ``*schedul*``, ``*tokenize*``, ``*detokeniz*``); only the ``generic`` set
  uses them, an engine's own set names its files instead;
* :data:`FALLBACK_RULES` -- the plumbing described in step 2.

Pure functions, no I/O; thread-safe (everything here is immutable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from diag.ground import stages as S
from diag.ground.external import DECODE_FUNCS as _DECODE_FUNCS

# --- CPU stages (what a sample is attributed to): defined in diag.ground.stages ----------------------
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


@dataclass(frozen=True)
class Frame:
    """One frame as py-spy prints it: ``func (file:line)``; line is None with --nolineno and for
    most native frames (``--native``: file is the shared library, e.g. ``libc.so.6``)."""

    func: str
    file: str
    line: int | None = None

    def label(self) -> str:
        """``func (file)`` without the line: the key used in top-frame tables."""
        return f"{self.func} ({self.file})" if self.file else self.func


_COMPREHENSION_RE = re.compile(r"(\.<locals>)?\.<(listcomp|genexpr|dictcomp|setcomp|lambda)>$")


def _match_name(func: str) -> str:
    """``Tok.decode.<locals>.<genexpr>`` -> ``Tok.decode``: a comprehension or lambda counts
    as the function that holds it."""
    while True:
        new = _COMPREHENSION_RE.sub("", func)
        if new == func:
            return func
        func = new


@dataclass(frozen=True)
class Rule:
    """A frame matches when every given pattern ``search``-es: file (py-spy's short file
    name) and func (``Class.method`` as py-spy prints it). ``leaf_only``: only as the leaf.
    ``fallback``: considered only when no primary rule matched any frame of the stack."""

    stage: str
    file: re.Pattern[str] | None = None
    func: re.Pattern[str] | None = None
    leaf_only: bool = False
    why: str = ""
    fallback: bool = False

    def matches(self, frame: Frame, is_leaf: bool) -> bool:
        return self._matches(frame.file, _match_name(frame.func), is_leaf)

    def _matches(self, file: str, func: str, is_leaf: bool) -> bool:
        if self.leaf_only and not is_leaf:
            return False
        if self.file is not None and not self.file.search(file):
            return False
        return self.func is None or bool(self.func.search(func))


def _r(stage: str, file: str | None = None, func: str | None = None, *, leaf_only: bool = False,
       why: str = "", fallback: bool = False) -> Rule:
    return Rule(stage, re.compile(file) if file else None, re.compile(func) if func else None,
                leaf_only, why, fallback)


@dataclass(frozen=True)
class PatternSet:
    """The rules of one engine, in priority order (the first match within a frame wins)."""

    engine: str
    rules: tuple[Rule, ...]

    def classify(self, frame: Frame, is_leaf: bool = False, fallback: bool = False) -> str | None:
        """The stage of the first primary (``fallback=True``: fallback) rule matching ``frame``."""
        func = _match_name(frame.func)
        for rule in self.rules:
            if rule.fallback == fallback and rule._matches(frame.file, func, is_leaf):
                return rule.stage
        return None

    def classify_stack(self, frames: Sequence[Frame],
                       cache: dict[tuple[Frame, bool, bool], str | None] | None = None
                       ) -> tuple[str, Frame | None]:
        """(stage, the frame that decided it) for one stack, root first (module docstring).
        ``cache``: a dict the caller keeps across stacks of one profile (memoizes frames)."""
        memo = {} if cache is None else cache
        last = len(frames) - 1
        for fallback in (False, True):
            for i in range(last, -1, -1):
                key = (frames[i], i == last, fallback)
                if key in memo:
                    got = memo[key]
                else:
                    got = memo[key] = self.classify(frames[i], i == last, fallback)
                if got is not None:
                    return got, frames[i]
        return CPU_OTHER, None


# --- shared by every engine; an engine's own rules come first so that they win within a frame --

_TOKENIZER_LIBS = (r"(^|/)(tokenizers|sentencepiece|tiktoken)/[\w/]*\.py$|(^|/)transformers/(tokenization_\w+"
                   r"|models/[^/]+/tokenization_\w+)\.py$")
#: native tokenizer libraries (py-spy --native): Rust/C++ symbols, mangled
_TOKENIZER_NATIVE = r"(^|/)(tokenizers|sentencepiece|tiktoken)[\w./-]*\.so(\.[\d.]+)?$|_tiktoken\.\S*\.so$"
_STDLIB = r"(^|/lib/python[\d.]+/)"  # py-spy prints stdlib files bare ("threading.py")
_LLAMA_CPP = r"(^|/)llama_cpp/(llama|_internals|llama_cpp|llama_tokenizer)\.py$|(^|/)lib(llama|ggml[\w-]*)\.(so|dylib)(\.[\d.]+)?$"
_NATIVE_SYS = r"(^|/)(libc|libpthread|libpython[\d.]*|ld-linux[\w-]*)\.so(\.[\d.]+)?$|(^|/)(ceval_gil|thread_pthread)\.h$"
_TORCH_NATIVE = (r"(^|/)(libtorch\w*|libc10\w*|libllama|libggml[\w-]*|libgomp|libiomp5|libmkl\w*|libdnnl|libopenblas\w*|libcu\w+|libnccl"
                 r"|libnvrtc\w*)\.so(\.[\d.]+)?$")

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
    _r(CPU_IDLE, _NATIVE_SYS, r"^(epoll_p?wait\d?|p?poll|p?select\d?|pthread_cond_(timed|clock)?wait\w*"
                              r"|sem_(timed|clock)?wait|__?futex\w*|futex\w*|(clock_)?nanosleep|sched_yield"
                              r"|PyThread_acquire_lock_timed|take_gil|drop_gil|accept4?)$",
       why="native: blocked in epoll/poll/a condition/a lock or waiting for the GIL (--native)"),
    _r(CPU_SERIALIZATION, r"(^|/)zmq/", r"(^|\.)(send|recv)_(pyobj|json|serialized)$",
       why="zmq pickling/json of messages"),
    # tokenizer libraries: decode-type calls are detokenize, the rest tokenize
    _r(CPU_DETOKENIZE, _TOKENIZER_LIBS, _DECODE_FUNCS, why="tokenizer library decode"),
    _r(CPU_TOKENIZE, _TOKENIZER_LIBS, why="tokenizer library"),
    _r(CPU_DETOKENIZE, _TOKENIZER_NATIVE, r"(?i)decode", why="native tokenizer decode (DecodeStream, decoders; --native)"),
    _r(CPU_TOKENIZE, _TOKENIZER_NATIVE, why="native tokenizer (Rust tokenizers, sentencepiece, tiktoken; --native)"),
    _r(CPU_TOKENIZE, r"(^|/)jinja2/|(^|/)transformers/utils/chat_template_utils\.py$", why="chat template rendering"),
    _r(CPU_DETOKENIZE, r"(^|/)transformers/generation/streamers\.py$",
       why="HF text streamers (TextStreamer, TextIteratorStreamer): ids -> text"),
    _r(CPU_SAMPLE, r"(^|/)transformers/generation/(logits_process|stopping_criteria|continuous_batching/cb_logits_processors)\.py$",
       why="HF logits processors (temperature, top-k/top-p, penalties) and stopping criteria"),
    _r(CPU_SAMPLE, _TORCH_NATIVE, r"(^|::|_)(multinomial|argmax|topk|top_k_top_p\w*|sampling\w*)(_|::|$)",
       why="native torch sampling ops: multinomial, argmax, topk (--native)"),
    # llama-cpp-python (abetlen/llama-cpp-python@3691546: llama_cpp/llama.py, _internals.py, llama_cpp.py
    # ctypes bindings, server/app.py): a Python server over llama.cpp; libllama/libggml with --native
    _r(CPU_DETOKENIZE, _LLAMA_CPP, r"(^|\.)(detokenize|llama_detokenize|\w*token_to_piece)$|^LlamaTokenizer\.decode$",
       why="llama_cpp Llama.detokenize / token_to_piece"),
    _r(CPU_TOKENIZE, _LLAMA_CPP, r"(^|\.)(tokenize|llama_tokenize)$|^LlamaTokenizer\.encode$",
       why="llama_cpp Llama.tokenize / llama_tokenize"),
    _r(CPU_TOKENIZE, r"(^|/)llama_cpp/llama_chat_format\.py$", why="llama_cpp chat formats (templates)"),
    _r(CPU_SAMPLE, _LLAMA_CPP, r"^Llama\.(sample|_init_sampler)$|^LlamaContext\.sample_\w+$|^(LlamaSampler|LlamaSamplingContext"
                                r"|CustomSampler)\.|(^|\.)llama_sampler_\w+$",
       why="llama_cpp Llama.sample, LlamaSampler, llama_sampler_* (C)"),
    _r(CPU_SAMPLE, r"(^|/)llama_cpp/llama_grammar\.py$", why="llama_cpp grammar-constrained sampling"),
    _r(CPU_FORWARD, _LLAMA_CPP, r"^Llama\.eval$|^LlamaContext\.(decode|encode)$|^LlamaBatch\.|(^|\.)(llama_decode|llama_encode"
                                r"|ggml_\w+)$",
       why="llama_cpp Llama.eval -> LlamaContext.decode -> llama_decode (the forward, in C)"),
    _r(CPU_SCHEDULER, _LLAMA_CPP, r"^Llama\.generate$", why="llama_cpp Llama.generate: prefix reuse, KV trimming, the loop"),
    _r(CPU_SCHEDULER, r"(^|/)llama_cpp/llama_cache\.py$", why="llama_cpp prompt (KV state) cache"),
    _r(CPU_DETOKENIZE, _LLAMA_CPP, r"^Llama\._create_completion$",
       why="llama_cpp _create_completion's own per-token work: text assembly, stop strings"),
    _r(CPU_HTTP, r"(^|/)llama_cpp/server/", why="llama_cpp.server (FastAPI app)"),
    _r(CPU_COMM, r"(^|/)torch/distributed/", r"(?<!is_initialized)(?<!get_rank)(?<!get_world_size)(?<!is_available)$",
       why="torch.distributed collective"),
    _r(CPU_SERIALIZATION,
       r"(^|/)(json|orjson|ujson|simplejson|msgspec|msgpack|pydantic|pydantic_core|google/protobuf|cloudpickle)/"
       r"|(^|/)(pickle|copyreg|_pickle)\.py$",
       why="JSON / msgspec / pickle / protobuf / pydantic"),
    _r(CPU_HTTP,
       r"(^|/)(aiohttp|uvicorn|starlette|fastapi|sse_starlette|h11|h2|httptools|httpx|httpcore|urllib3"
       r"|requests|werkzeug|flask|websockets|grpc|anyio|sniffio|uvloop)/|"
       + _STDLIB + r"(http/server|http/client|socketserver|asyncio/(streams|selector_events|sslproto))\.py$",
       why="HTTP server/client, ASGI plumbing (anyio) and socket transports"),
    _r(CPU_FORWARD, r"(^|/)torch/nn/modules/(?!module\.py$)",
       why="torch.nn layers (Linear, Embedding, norms, attention modules)"),
    _r(CPU_FORWARD, r"(^|/)torch/(_dynamo|_inductor|_functorch|fx|_higher_order_ops|cuda/graphs|_prims\w*)/|(^|/)torch/cuda/graphs\.py$",
       why="torch.compile / CUDA graphs running the model"),
)

#: what an unknown engine's own code usually calls things; the generic set only
NAME_RULES: tuple[Rule, ...] = (
    _r(CPU_DETOKENIZE, None, r"(^|\.)_?detokeni\w*$|(^|\.)\w*Detokeni[sz]er\.|(^|\.)\w*Streamer\.(put|end|on_finalized_text)$",
       why="a detokenizer or text streamer (by name)"),
    _r(CPU_TOKENIZE, None, r"(^|\.)_?(\w*tokeni[sz]e\w*|\w*chat_template\w*)$", why="a tokenize / chat-template function (by name)"),
    _r(CPU_SAMPLE, r"(^|/)\w*sampl\w*(/|\.py$)|(^|/)\w*logits_?process\w*(/|\.py$)",
       why="a sampler / logits-processor module (by name)"),
    _r(CPU_SAMPLE, None, r"(^|\.)_?(sample\w*|\w*_sample|\w*logits_?process\w*|apply_\w*penalt\w*|multinomial)$|(^|\.|_)(top_?[kp]|min_p)(_\w*)?$",
       why="a sampling function (by name)"),
    _r(CPU_SCHEDULER, r"(^|/)\w*schedul\w*(/|\.py$)|(^|/)\w*(block_manager|kv_cache_manager)\w*\.py$",
       why="a scheduler / KV-block manager module (by name)"),
    _r(CPU_SCHEDULER, None, r"(^|\.)_?\w*schedul\w*$|(^|\.)\w*Scheduler\.", why="a scheduling function (by name)"),
    _r(CPU_FORWARD, None, r"(^|\.)(forward\w*|_?execute_model|_?run_model|model_step)$",
       why="a model forward (nn.Module.forward convention, by name)"),
)

#: plumbing: only when nothing else in the stack matched (step 2 of the module docstring)
FALLBACK_RULES: tuple[Rule, ...] = (
    _r(CPU_HTTP, _STDLIB + r"asyncio/(runners|base_events|events|futures|tasks)\.py$",
       why="the event loop itself (a server's front end): as the leaf, uvloop's C loop doing socket I/O and callbacks",
       fallback=True),
    _r(CPU_FORWARD, r"(^|/)torch/(nn/modules/module|nn/functional|functional|_tensor|overrides|_ops)\.py$",
       why="nn.Module.__call__ and torch ops called from code no rule names", fallback=True),
    _r(CPU_FORWARD, _TORCH_NATIVE, why="native torch / ggml / BLAS / OpenMP kernels called from code no rule names (--native)",
       fallback=True),
)

GENERIC = PatternSet("generic", COMMON_RULES + NAME_RULES + FALLBACK_RULES)
