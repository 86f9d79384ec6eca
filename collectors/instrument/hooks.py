"""Import hooks and guarded wrappers: how ``ttft instrument`` patches an engine it does not own.

:class:`PostImportHooks` is a ``sys.meta_path`` finder that lets the real finders locate a
module, then runs our patcher right after the module's code has executed (before the importer
gets the module back, so ``from m import f`` already sees the patched ``f``). A module that is
already imported is patched at once. :class:`HookStats` counts what happened: every hook body
runs under :meth:`HookStats.guard`, which swallows and counts any exception so that a hook can
never break the engine. Patching is wrapping public attributes with :func:`wrap_method`; the
original is kept on the wrapper (``__wrapped__``) and is always called. A :class:`HookSwitch`
turns every wrapper of a process into a plain call of the original (tracing paused) and back.

Threading: the finder runs on whatever thread imports the module (under the import lock);
:class:`HookStats` counters are plain ints updated under a lock (a hook failing is rare).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

Patcher = Callable[[ModuleType], None]


class HookStats:
    """Counts hook failures by hook name; the totals go into the capture's meta.json at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors: dict[str, int] = {}
        self.first_error: dict[str, str] = {}
        self.patched: list[str] = []
        self._guards: dict[str, _Guard] = {}

    @property
    def total_errors(self) -> int:
        return sum(self.errors.values())

    def count(self, hook: str, exc: BaseException) -> None:
        """Note one swallowed exception of ``hook`` (any thread)."""
        with self._lock:
            self.errors[hook] = self.errors.get(hook, 0) + 1
            if hook not in self.first_error:
                self.first_error[hook] = f"{type(exc).__name__}: {exc}"[:300]
                log.debug("ttft instrument: hook %s failed: %s", hook, exc)

    def guard(self, hook: str) -> _Guard:
        """``with stats.guard(name):`` runs a hook body; an exception inside is swallowed and counted.

        The guard for a name is made once and reused (no generator per call: hooks on the
        per-token path enter one for every token); it holds no state, so any thread may use it.
        """
        g = self._guards.get(hook)
        if g is None:
            g = self._guards.setdefault(hook, _Guard(self, hook))
        return g

    def as_meta(self) -> dict[str, Any]:
        with self._lock:
            return {"hook_errors": dict(self.errors), "hook_errors_total": sum(self.errors.values()),
                    "hook_first_error": dict(self.first_error), "patched": list(self.patched)}


class HookSwitch:
    """On: the wrappers run their hooks; off: each calls the original and nothing else.

    Flipped from any thread (a signal handler, on the main thread); a flip takes effect at the
    next wrapped call, so a request in flight at a flip gets part of its stage spans.
    ``toggles`` holds (Unix s, on) for every flip, for meta.json.
    """

    __slots__ = ("on", "toggles")

    def __init__(self, on: bool = True) -> None:
        self.on = on
        self.toggles: list[tuple[float, bool]] = []

    def set(self, on: bool) -> None:
        self.on = on
        self.toggles.append((round(time.time(), 6), on))


class _Guard:
    """A reusable context manager: swallows and counts an ``Exception`` raised in its block."""

    __slots__ = ("_stats", "_hook")

    def __init__(self, stats: HookStats, hook: str) -> None:
        self._stats = stats
        self._hook = hook

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is None:
            return False
        if not issubclass(exc_type, Exception):
            return False  # KeyboardInterrupt, SystemExit: not ours to swallow
        self._stats.count(self._hook, exc)  # a hook must never break the engine
        return True


def wrap_method(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]],
                stats: HookStats, label: str, switch: HookSwitch | None = None) -> bool:
    """Replace ``owner.name`` by ``make(original)`` (functools.wraps'd); False when it is missing.

    With a ``switch``, the replacement calls ``make(original)`` while the switch is on and the
    original alone while it is off. Idempotent: an attribute already wrapped by us is left alone.
    """
    original = getattr(owner, name, None)
    if original is None or getattr(original, "__ttft_wrapped__", False):
        return False
    hooked = make(original)
    replacement = hooked
    if switch is not None:
        def switched(*args: Any, **kwargs: Any) -> Any:
            return (hooked if switch.on else original)(*args, **kwargs)
        replacement = switched
    wrapper = functools.wraps(original)(replacement)
    wrapper.__ttft_wrapped__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)
    stats.patched.append(label)
    return True


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the patcher on the executed module."""

    def __init__(self, loader: importlib.abc.Loader, patcher: Patcher, hooks: PostImportHooks, name: str) -> None:
        self._loader = loader
        self._patcher = patcher
        self._hooks = hooks
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hooks.run_patcher(self._name, module, self._patcher)

    def __getattr__(self, attr: str) -> Any:  # get_code, get_source, is_package, ...
        return getattr(self._loader, attr)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """``sys.meta_path`` finder that patches named modules right after they are imported."""

    def __init__(self, stats: HookStats) -> None:
        self._stats = stats
        self._patchers: dict[str, Patcher] = {}
        self._done: set[str] = set()
        self._busy = threading.local()

    def register(self, module_name: str, patcher: Patcher) -> None:
        """Patch ``module_name`` when it is imported (at once when it already is)."""
        self._patchers[module_name] = patcher
        mod = sys.modules.get(module_name)
        if mod is not None:
            self.run_patcher(module_name, mod, patcher)

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def run_patcher(self, name: str, module: ModuleType, patcher: Patcher) -> None:
        if name in self._done:
            return
        self._done.add(name)
        with self._stats.guard(f"patch:{name}"):
            patcher(module)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patcher = self._patchers.get(fullname)
        if patcher is None or fullname in self._done or getattr(self._busy, "on", False):
            return None
        self._busy.on = True  # let the other finders answer without recursing into us
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.on = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, patcher, self, fullname)
        return spec
