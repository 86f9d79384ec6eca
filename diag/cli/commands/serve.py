"""``ttft serve``: run the bundled reference engine behind an OpenAI-compatible HTTP server.

Importing this module is cheap (torch loads only in :func:`run`).
"""

from __future__ import annotations

import argparse
import sys

from diag.bundled_engine.faults import FAULTS, FaultError, parse_injections

#: the scheduler's policies (kept literal so that ``ttft --help`` does not import torch;
#: tests check it equals ``diag.bundled_engine.scheduler_types.POLICIES``)
POLICIES: tuple[str, ...] = ("prefill-first", "decode-first", "chunked")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``serve`` on the CLI's sub-parsers."""
    faults_help = "; ".join(f"{k}: {v[1]}" for k, v in FAULTS.items())
    p = sub.add_parser(
        "serve",
        help="run the bundled reference engine (OpenAI-compatible, instrumented)",
        description="Serve a Llama-style model with a paged KV cache and continuous batching over an "
        "OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health, "
        "/metrics). Every request is traced stage by stage when --capture or --otlp is given.",
    )
    p.add_argument("--model", default="tiny", help="preset (tiny, small) or a local Hugging Face Llama checkpoint directory")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"), help="default: float32 on cpu, bfloat16 on cuda")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel ranks (gloo on cpu, nccl on cuda)")
    p.add_argument("--pp", type=int, default=1, metavar="N",
                   help="pipeline-parallel stages, one process each, activations by send/recv (gloo on cpu, nccl on "
                   "cuda); not with --tp (default 1)")
    p.add_argument("--pp-microbatches", type=int, default=None, metavar="N",
                   help="--pp: micro-batches a step's sequences are split into so stages overlap (default: --pp)")
    # disaggregated prefill/decode (diag.bundled_engine.pd)
    p.add_argument("--pd", action="store_true",
                   help="disaggregated prefill/decode: this process prefills and samples each first token, a "
                   "spawned decode worker (its own model copy, KV cache and step loop) receives each request's KV "
                   "over send/recv (gloo on cpu) and decodes, like vLLM's P/D with a KV connector; not with --tp "
                   "or --pp (default off)")
    p.add_argument("--pd-decode-kv-blocks", type=int, default=None, metavar="N",
                   help="--pd: the decode worker's KV-cache blocks; requests wait on the decode side when they do "
                   "not fit (default: as many as --kv-blocks)")
    p.add_argument("--pd-decode-max-running", type=int, default=None, metavar="N",
                   help="--pd: the decode worker's running cap (default: --max-running)")
    p.add_argument("--policy", default="prefill-first", choices=POLICIES, help="scheduling policy")
    p.add_argument("--chunk-size", type=int, default=256, metavar="N", help="prefill tokens per step for --policy chunked")
    p.add_argument("--kv-blocks", type=int, default=None, metavar="N", help="KV-cache blocks (small = KV pressure)")
    p.add_argument("--block-size", type=int, default=16, metavar="N", help="tokens per KV-cache block")
    p.add_argument("--max-running", "--max-num-seqs", type=int, default=32, metavar="N",
                   help="max sequences in the running batch (vLLM's --max-num-seqs)")
    p.add_argument("--max-waiting", type=int, default=256, metavar="N", help="waiting-queue limit; beyond it: HTTP 503")
    p.add_argument("--max-context", "--max-model-len", type=int, default=2048, metavar="N",
                   help="max tokens per sequence, prompt + output (vLLM's --max-model-len)")
    p.add_argument("--max-batched-tokens", "--max-num-batched-tokens", type=int, default=2048, metavar="N",
                   help="token budget per engine step (vLLM's --max-num-batched-tokens)")
    # admission (diag.bundled_engine.scheduler)
    p.add_argument("--admission", default="fcfs", choices=("fcfs", "skip-blocked"),
                   help="fcfs: admission stops at a waiting request that does not fit, those behind it wait too "
                   "(head-of-line); skip-blocked: pass over it and admit what fits (default fcfs)")
    p.add_argument("--max-partial-prefills", type=int, default=None, metavar="N",
                   help="--policy chunked: at most N prompts in prefill per step, the chunk split evenly among them "
                   "(like vLLM --max-num-partial-prefills; default: no cap, a running partial prefill goes first)")
    p.add_argument("--kv-admission", default="on-demand", choices=("on-demand", "reserve"),
                   help="on-demand: KV blocks as tokens are computed; reserve: admit a request only if KV holds its "
                   "prompt + max_tokens (the context limit when max_tokens is unset), like TensorRT-LLM "
                   "GUARANTEED_NO_EVICT (default on-demand)")
    p.add_argument("--enable-prefix-caching", action="store_true",
                   help="reuse the KV of full blocks a new prompt shares with an earlier one (chained block hashes, "
                   "LRU eviction of unreferenced blocks), like vLLM --enable-prefix-caching (default off)")
    # structured output (diag.bundled_engine.grammar_cache)
    p.add_argument("--grammar-cache-size", type=int, default=64, metavar="N",
                   help="compiled response_format grammars kept, least recently used out first (like vLLM's "
                   "VLLM_XGRAMMAR_CACHE_MB, counted in grammars); 0: none, every such request compiles its own "
                   "(default 64)")
    p.add_argument("--grammar-workers", type=int, default=1, metavar="N",
                   help="threads that compile grammars; requests waiting for theirs are passed over, never "
                   "blocking others (vLLM: (cpus + 1) // 2; default 1)")
    # LoRA adapters (diag.bundled_engine.lora_manager)
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME[=PATH]",
                   help="serve LoRA adapters by name: a request whose model is NAME runs with it; PATH is a peft "
                   "adapter directory (adapter_config.json, adapter_model.safetensors), without it a random adapter "
                   "made from the name; loaded into a slot when first scheduled, like vLLM --enable-lora "
                   "--lora-modules")
    p.add_argument("--max-loras", type=int, default=None, metavar="K",
                   help="--lora-modules: adapter slots, distinct adapters in the running batch at once; a request "
                   "for another waits until a slot frees (default 1)")
    p.add_argument("--max-cpu-loras", type=int, default=None, metavar="M",
                   help="--lora-modules: adapters kept in host memory, least recently used out; others are read "
                   "from disk when loaded into a slot (default: --max-loras)")
    p.add_argument("--max-lora-rank", type=int, default=16, metavar="R",
                   help="--lora-modules: the largest adapter rank served; a larger one is refused at start "
                   "(default 16)")
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"inject a fault (repeatable): {faults_help}",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (printed)")
    p.add_argument("--capture", metavar="DIR", default=None, help="write a capture (spans + meta.json) to DIR")
    p.add_argument("--otlp", metavar="URL", default=None,
                   help="export spans over OTLP/HTTP to URL (e.g. http://127.0.0.1:4318; default: "
                   "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT when set)")
    p.add_argument("--seed", type=int, default=0, help="seed for random preset weights and unseeded sampling")
    p.add_argument(
        "--lazy-load",
        action="store_true",
        help="bind and print the listening line first, then load the model in the background; requests "
        "wait until it is ready and /health answers 503 {\"status\": \"loading\"} meanwhile (scale from zero)",
    )
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch threads per rank (default cores // tp)")
    # the HTTP front end (diag.bundled_engine.frontend)
    p.add_argument("--http-workers", type=int, default=None, metavar="N",
                   help="HTTP request workers; a request holds one until its response ends, more wait before the "
                   "engine (like llama.cpp --threads-http; default unbounded)")
    p.add_argument("--http-backlog", type=int, default=256, metavar="N",
                   help="requests that may wait for an HTTP worker; beyond it: HTTP 503 (default 256)")
    p.add_argument("--keepalive-timeout", type=float, default=None, metavar="S",
                   help="close a keep-alive connection idle for S seconds (uvicorn's and cpp-httplib's default is "
                   "5 s; default: aiohttp's, about an hour)")
    p.add_argument("--tokenizer-workers", type=int, default=1, metavar="N",
                   help="tokenizer threads that tokenize and enqueue requests (default 1)")
    return p


def run(args: argparse.Namespace) -> int:
    """Start the server, print the listening line, serve until SIGINT/SIGTERM.

    Exit code 0; 2 for bad flags or a failed (eager) start; 1 when a ``--lazy-load`` model load
    failed (the server kept answering 503 until stopped).
    """
    try:
        faults = parse_injections(args.inject)
    except FaultError as exc:
        print(f"ttft serve: error: {exc}", file=sys.stderr)
        return 2
    from collectors.otel_env import check_protocol, endpoint_from_env

    if args.otlp is None:
        args.otlp = endpoint_from_env()
    try:
        if args.otlp is not None:
            check_protocol()
    except ValueError as exc:
        print(f"ttft serve: error: {exc}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"ttft serve: error: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    from diag.bundled_engine import CheckpointError, EngineConfig, serve
    from diag.bundled_engine.lora import parse_lora_module
    from diag.bundled_engine.tokenizer import TokenizerError
    from diag.bundled_engine.tp import TPError

    try:
        lora_modules = tuple(parse_lora_module(m) for m in args.lora_modules)
    except ValueError as exc:
        print(f"ttft serve: error: {exc}", file=sys.stderr)
        return 2
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        tp=args.tp,
        pp=args.pp,
        pp_microbatches=args.pp_microbatches,
        policy=args.policy,
        chunk_size=args.chunk_size,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        max_running=args.max_running,
        max_waiting=args.max_waiting,
        max_context=args.max_context,
        max_batched_tokens=args.max_batched_tokens,
        seed=args.seed,
        num_threads=args.threads,
        faults=faults,
        lazy_load=args.lazy_load,
        http_workers=args.http_workers,
        http_backlog=args.http_backlog,
        tokenizer_workers=args.tokenizer_workers,
        http_keepalive_s=args.keepalive_timeout,
        admission=args.admission,
        max_partial_prefills=args.max_partial_prefills,
        kv_admission=args.kv_admission,
        prefix_caching=args.enable_prefix_caching,
        grammar_cache_size=args.grammar_cache_size,
        grammar_workers=args.grammar_workers,
        pd=args.pd,
        pd_decode_kv_blocks=args.pd_decode_kv_blocks,
        pd_decode_max_running=args.pd_decode_max_running,
        lora_modules=lora_modules,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        max_lora_rank=args.max_lora_rank,
    )

    def ready(srv: object) -> None:
        from diag.bundled_engine.server import ServerThread

        assert isinstance(srv, ServerThread)
        print(
            f"ttft serve: listening on {srv.url} (model={srv.engine.model_name}, device={config.device}, tp={config.tp}"
            + (", pd" if config.pd else "")
            + (f", lora={','.join(m.name for m in config.lora_modules)} in {config.lora_slots()} "
               f"slot{'s' if config.lora_slots() != 1 else ''}" if config.lora_modules else "") + ")",
            flush=True,
        )
        if srv.engine.max_context_tokens < config.max_context:
            print(f"ttft serve: serving a context of {srv.engine.max_context_tokens} tokens, below --max-context "
                  f"{config.max_context}: the model's positions or the KV cache ({config.num_kv_blocks()} blocks of "
                  f"{config.block_size} tokens) hold no more", flush=True)

    failed: list[BaseException] = []

    def load_failed(exc: BaseException) -> None:
        failed.append(exc)
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"ttft serve: error: model failed to load: {msg} (serving 503s until stopped)", file=sys.stderr, flush=True)

    try:
        config.validate()
        serve(config, host=args.host, port=args.port, capture_dir=args.capture, otlp_endpoint=args.otlp,
              on_ready=ready, on_load_failed=load_failed)
    except (ValueError, CheckpointError, TokenizerError, TPError, OSError) as exc:
        print(f"ttft serve: error: {exc}", file=sys.stderr)
        return 2
    return 1 if failed else 0
