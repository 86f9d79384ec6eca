"""Zero-code instrumentation (``ttft instrument -- COMMAND``): our stage spans on an engine we do
not own, the way ``opentelemetry-instrument`` works.

- :mod:`.commandline`: what the ``ttft`` side builds - COMMAND's environment (``PYTHONPATH``
  with :data:`BOOTSTRAP_DIR`) and, for engines that trace themselves (vLLM, SGLang, TGI), their
  own tracing flags pointed at our OTLP receiver.
- :mod:`.bootstrap` (``sitecustomize.py``): runs at interpreter start inside COMMAND.
- :mod:`.runtime`: the instrumented process's sink, capture claim and flush at exit.
- :mod:`.hooks`: post-import hooks, guarded wrappers, hook-failure counters.
- :mod:`.transformers_serve`, :mod:`.transformers_cb`, :mod:`.tx_request`: the patches for
  Hugging Face ``transformers serve`` (plain and continuous batching).
"""

from __future__ import annotations

from pathlib import Path

#: the directory ``ttft instrument`` puts first on COMMAND's PYTHONPATH
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
