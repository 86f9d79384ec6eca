"""Which screen layout the dashboard uses at a terminal size (nvitop's ``-m auto|compact|full``).

* ``compact`` (from 80×24): verdict with its top evidence rows on one line each, a latency line,
  throughput/batch/KV with the busy numbers, the stage breakdown; no slowest-requests table.
* ``medium`` (from 120×40): every panel; the verdict's evidence keeps its meaning column only
  where it fits, and the verdict panel is shorter so the table and the busy panel show.
* ``full`` (from 160×48): every panel at full height.

``auto`` picks by size, again on each resize. Pure functions, any thread.
"""

from __future__ import annotations

LAYOUTS: tuple[str, ...] = ("auto", "compact", "medium", "full")

#: the smallest (columns, rows) of each layout that ``auto`` picks
MEDIUM_MIN = (120, 36)
FULL_MIN = (160, 48)


def choose_layout(requested: str, columns: int, rows: int) -> str:
    """The layout to draw: ``requested`` unless it is ``auto``, else the largest whose minimum
    size fits ``columns`` × ``rows`` (terminal cells). ValueError on an unknown name."""
    if requested not in LAYOUTS:
        raise ValueError(f"unknown layout {requested!r}: choose one of {', '.join(LAYOUTS)}")
    if requested != "auto":
        return requested
    if columns >= FULL_MIN[0] and rows >= FULL_MIN[1]:
        return "full"
    if columns >= MEDIUM_MIN[0] and rows >= MEDIUM_MIN[1]:
        return "medium"
    return "compact"
