"""``ttft instrument`` bootstrap: runs at interpreter start in COMMAND's Python processes.

``ttft instrument`` puts this directory first on ``PYTHONPATH``, so ``site`` imports this module
as ``sitecustomize``. It first runs the ``sitecustomize`` this one shadows (the next one on
``sys.path``, if any), then registers our import hooks. It never raises: any failure is one
line on stderr and the process runs as it would without us. Runs on the main thread, once.
"""

import os
import sys


def _chain_previous() -> None:
    """Execute the next ``sitecustomize`` on sys.path (the one we shadow), as site would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _start() -> None:
    try:
        from collectors.instrument.runtime import current
    except ImportError as exc:
        print(f"ttft instrument: ttft-diag is not importable in this Python ({sys.executable}): {exc}; "
              "running uninstrumented", file=sys.stderr)
        return
    inst = current()
    inst.install_toggle()
    if "transformers" in inst.targets:
        from collectors.instrument import transformers_serve

        transformers_serve.install(inst)


try:
    _chain_previous()
except Exception as _exc:  # the shadowed sitecustomize failed: say so, as site would
    print(f"ttft instrument: the existing sitecustomize failed: {_exc}", file=sys.stderr)
try:
    _start()
except Exception as _exc:
    print(f"ttft instrument: bootstrap failed, running uninstrumented: {_exc}", file=sys.stderr)
