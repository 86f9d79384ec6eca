"""The one exit-code contract every ``ttft`` command keeps, and the ``--help`` text that states it.

0: ok; 1: an SLO given with ``--slo`` is broken, or a regression crossed a ``--fail-on`` bound;
2: bad input (a usage error, a file that is not a capture) or nothing to judge (verdict
``no_data``: no requests and no series); 130: interrupted (Ctrl-C). Constants only, any thread.
"""

from __future__ import annotations

OK = 0
#: an SLO broken or a regression beyond its bound: a CI gate that fails
FAILED_GATE = 1
#: bad input, or nothing to judge (no_data)
BAD_INPUT = 2
INTERRUPTED = 130

EPILOG = (
    "exit codes: 0 ok; 1 an SLO (--slo) is broken or a regression crossed a --fail-on bound; "
    "2 bad input (usage, not a capture) or nothing to judge (verdict no_data); 130 interrupted"
)

__all__ = ["BAD_INPUT", "EPILOG", "FAILED_GATE", "INTERRUPTED", "OK"]
