"""Zero-code stage spans on Hugging Face ``transformers serve`` (plain and ``--continuous-batching``).

Patched public functions (read in transformers 5.24.0, ``transformers/cli/serving/`` and
``transformers/generation/``; the range the patches know is :data:`SUPPORTED`):

=====================  =========================================================  ==============
stage                  hook (file, 5.24.0)                                        thread
=====================  =========================================================  ==============
request span, join     ``server.build_server``: our ASGI middleware outermost;     event loop
                       ``traceparent`` read from the HTTP request
(span start)           ``chat_completion/completion.*Handler.handle_request``     event loop
tokenize               ``tokenization_utils_base.PreTrainedTokenizerBase           event loop
                       .apply_chat_template`` / ``__call__``,
                       ``processing_utils.ProcessorMixin.apply_chat_template``
queue                  tokenize end -> first forward over the request (plain:     generation
                       entry of ``generation.utils.GenerationMixin._prefill``
                       after ``DirectStreamer.put`` got the prompt; CB: start of
                       the ``_generation_step`` whose batch holds it, see
                       :mod:`.transformers_cb`)
prefill                first forward start -> end of the forward that produced    generation
                       the first token (plain: ``_prefill`` returns; CB: a torch
                       forward hook armed for that step only)
sample                 that forward's end -> first token id on the host (plain:   generation
                       ``DirectStreamer.put`` entry; CB: ``update_batch`` end)
detokenize             ``utils.DirectStreamer.put`` / ``CBStreamer.put`` that     inference /
                       decoded the first token (``DecodeStream.step``, enqueue)   event loop
cold start (load)      ``model_manager.ModelManager.load_model_and_processor``    main / loop
cold start (warmup)    CB only: ``CBGenerateManager.init_cb``,                    loop / CB
                       ``ContinuousBatchingManager._create_batch_processor``
=====================  =========================================================  ==============

The streamer, generate-manager and prefill hooks are in :mod:`.transformers_streamers`, the
continuous-batching step hooks in :mod:`.transformers_cb`, the per-request state in
:mod:`.tx_request`. Token times (the server TTFT end) are the ends of the streamer ``put`` calls. What a mode cannot
measure is written to meta.json ``instrument.unmeasured``. Every hook body runs under
``HookStats.guard`` (exceptions swallowed and counted) and calls the original exactly once.

Overhead (``benchmarks/instrument_overhead.py``): per decode step only the streamer ``put``
wrapper runs (plain) or the CB step wrappers with one tuple per request in the batch; no
torch hook stays on the model, span building and export run on the sink's own threads
(OTLP JSON written without protobuf). The measured cost (under 1% of throughput in plain mode,
about 2% of server CPU with ``--continuous-batching``) and its history: ``benchmarks/README.md``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from types import ModuleType
from typing import Any

from collectors.instrument import tx_request as rq
from collectors.instrument.runtime import Instrumentation, say
from diag.ground import stages

#: transformers versions whose serving code the patches were written against (5.25.0 no longer has
#: ``cli/serving/utils.DirectStreamer``: the plain-mode hooks' anchor)
SUPPORTED = (5, 20), (5, 25)
SUPPORTED_TEXT = ">=5.20,<5.25"
TRACED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_SERVING = "transformers.cli.serving."
_NON_STREAMING_NOTE = ("requests with stream=false have no streamer: only their request span and tokenize "
                       "are recorded (queue, prefill, sample, detokenize and token times need stream=true)")


def version_supported(version: str) -> bool:
    """``version`` (e.g. "5.24.0", "5.21.0.dev0") lies in :data:`SUPPORTED`."""
    parts: list[int] = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            return False
        parts.append(int(digits))
    key = tuple(parts + [0] * (2 - len(parts)))
    return SUPPORTED[0] <= key < SUPPORTED[1]


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def install(inst: Instrumentation, version: str | None = None) -> bool:
    """Register the import hooks; False (one line on stderr, nothing patched) for an unknown version."""
    version = installed_version() if version is None else version
    if version is None:
        return False  # not a transformers process: nothing to do, nothing to say
    if not version_supported(version):
        say(f"transformers {version} is not in the range these patches know ({SUPPORTED_TEXT}); "
            "the server runs uninstrumented")
        return False
    from collectors.instrument import transformers_cb

    p = _Patches(inst, version)
    hooks = inst.hooks
    hooks.register(_SERVING + "server", p.patch_server)
    hooks.register(_SERVING + "chat_completion", p.patch_handler("ChatCompletionHandler"))
    hooks.register(_SERVING + "completion", p.patch_handler("CompletionHandler"))
    hooks.register(_SERVING + "model_manager", p.patch_model_manager)
    hooks.register(_SERVING + "utils", p.patch_utils)
    hooks.register("transformers.tokenization_utils_base", p.patch_tokenizer_base)
    hooks.register("transformers.processing_utils", p.patch_processor)
    hooks.register("transformers.generation.utils", p.patch_generation)
    hooks.register("transformers.generation.continuous_batching.continuous_api",
                   lambda m: transformers_cb.patch_continuous_api(p, m))
    hooks.install()
    return True


class _Patches:
    """The patchers; each wraps public callables of one module (see the module docstring)."""

    def __init__(self, inst: Instrumentation, version: str) -> None:
        self.inst = inst
        self.stats = inst.stats
        self.version = version

    @property
    def sink(self) -> Any:
        return self.inst.sink

    def activate(self) -> None:
        """A serving module is being imported: this process is ``transformers serve``."""
        self.inst.activate(rq.ENGINE, self.version)

    def wrap(self, owner: Any, name: str, make: Any, switched: bool = True) -> None:
        """Wrap ``owner.name``; ``switched`` hooks are plain calls while tracing is paused (the
        setup-time ones, which put our middleware in, are not: a paused start must resume)."""
        from collectors.instrument.hooks import wrap_method

        wrap_method(owner, name, make, self.stats, f"{getattr(owner, '__name__', owner)}.{name}",
                    self.inst.switch if switched else None)

    # -- transformers/cli/serving/server.py: build_server -> ASGI middleware ---------------------

    def patch_server(self, mod: ModuleType) -> None:
        self.activate()
        patches = self

        def make(orig: Any) -> Any:
            def build_server(*args: Any, **kwargs: Any) -> Any:
                app = orig(*args, **kwargs)
                with patches.stats.guard("build_server"):
                    app.add_middleware(TraceMiddleware, patches=patches)
                return app
            return build_server

        self.wrap(mod, "build_server", make, switched=False)  # the middleware checks the switch per request

    # -- chat_completion.py / completion.py: handle_request opens the request span ---------------

    def patch_handler(self, cls_name: str) -> Any:
        def patcher(mod: ModuleType) -> None:
            self.activate()
            patches = self

            def make(orig: Any) -> Any:
                async def handle_request(handler: Any, body: dict, request_id: str, *a: Any, **kw: Any) -> Any:
                    req = rq.CURRENT.get()
                    if req is not None and req.trace is None and patches.sink is not None:
                        with patches.stats.guard("handle_request"):
                            req.start(patches.sink, request_id, body)
                            if not req.streaming:
                                patches.inst.note_unmeasured("non-streaming", _NON_STREAMING_NOTE)
                    return await orig(handler, body, request_id, *a, **kw)
                return handle_request

            self.wrap(getattr(mod, cls_name), "handle_request", make)
        return patcher

    # -- tokenization_utils_base.py / processing_utils.py: tokenize ------------------------------

    def _make_tokenize(self, orig: Any) -> Any:
        stats = self.stats

        def tokenize(obj: Any, *args: Any, **kwargs: Any) -> Any:
            req = rq.CURRENT.get()
            if req is None or req.trace is None or req.tokenizing or req.tokenize_end_ns is not None:
                return orig(obj, *args, **kwargs)
            req.tokenizing = True  # the outermost call only (apply_chat_template calls __call__)
            t0 = time.time_ns()
            try:
                return orig(obj, *args, **kwargs)
            finally:
                t1 = time.time_ns()
                req.tokenizing = False
                with stats.guard("tokenize"):
                    req.tokenized(t0, t1)
        return tokenize

    def patch_tokenizer_base(self, mod: ModuleType) -> None:
        self.wrap(mod.PreTrainedTokenizerBase, "apply_chat_template", self._make_tokenize)
        self.wrap(mod.PreTrainedTokenizerBase, "__call__", self._make_tokenize)

    def patch_processor(self, mod: ModuleType) -> None:
        self.wrap(mod.ProcessorMixin, "apply_chat_template", self._make_tokenize)

    # -- model_manager.py: model load = cold start ------------------------------------------------

    def patch_model_manager(self, mod: ModuleType) -> None:
        self.activate()
        patches = self

        def make(orig: Any) -> Any:
            def load_model_and_processor(manager: Any, model_id: str, *args: Any, **kwargs: Any) -> Any:
                before = set(getattr(manager, "loaded_models", {}) or {})
                t0 = time.time_ns()
                result = orig(manager, model_id, *args, **kwargs)
                t1 = time.time_ns()
                with patches.stats.guard("load_model"):
                    loaded = set(getattr(manager, "loaded_models", {}) or {}) - before
                    if loaded and patches.sink is not None:
                        patches.sink.record_cold_start(t0, t1, "load", {stages.GEN_AI_REQUEST_MODEL: str(model_id)})
                return result
            return load_model_and_processor

        self.wrap(mod.ModelManager, "load_model_and_processor", make)

    def patch_generation(self, mod: ModuleType) -> None:
        from collectors.instrument import transformers_streamers

        transformers_streamers.patch_generation(self, mod)

    def patch_utils(self, mod: ModuleType) -> None:
        self.activate()
        from collectors.instrument import transformers_cb, transformers_streamers

        transformers_streamers.patch_utils(self, mod)
        transformers_cb.patch_cb_manager(self, mod)


class TraceMiddleware:
    """Pure ASGI middleware (outermost): one :class:`ServeRequest` per traced HTTP request.

    Runs on the event-loop thread; reads ``traceparent`` from the request headers, puts the
    request in :data:`tx_request.CURRENT` for the handler, notes the response status and ends the
    request span when the last body chunk is sent (or the request fails or is cancelled).
    It never awaits anything of its own: the app runs exactly as without it.
    """

    def __init__(self, app: Any, patches: _Patches) -> None:
        self.app = app
        self.patches = patches

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        req = None
        token = None
        stats = self.patches.stats
        if (scope.get("type") == "http" and scope.get("path") in TRACED_PATHS and self.patches.sink is not None
                and self.patches.inst.switch.on):
            with stats.guard("asgi_request"):
                tp = next((v for k, v in scope.get("headers") or () if k == b"traceparent"), None)
                req = rq.ServeRequest(tp.decode("latin-1") if tp else None, scope["path"])
                token = rq.CURRENT.set(req)
        if req is None:
            await self.app(scope, receive, send)
            return

        async def traced_send(message: dict) -> None:
            with stats.guard("asgi_send"):
                if message.get("type") == "http.response.start":
                    req.status = int(message.get("status", 0))
            await send(message)
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                with stats.guard("asgi_finish"):
                    req.finish()

        error: str | None = "disconnect"  # ended without its last body: the client went away
        try:
            await self.app(scope, receive, traced_send)
            error = None
        except asyncio.CancelledError:
            raise
        except Exception:
            error = "http_500"  # Starlette's ServerErrorMiddleware (outside us) answers 500
            raise
        finally:
            with stats.guard("asgi_finish"):
                req.finish(error=error if not req.ended else None)
            if token is not None:
                rq.CURRENT.reset(token)
