"""What is, and is not, a capture: a one-line "not a capture" for a file that holds no OTLP JSON
lines (a saved Prometheus scrape, a log), and the one warning naming the files beside a capture
that loading it does not read (saved scrapes, a nested capture, spans under another name), with
the command that would read them. Pure reads of at most a few KiB per file; any thread.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from diag.ground.capture import META_FILE, PROFILE_DIR, SERIES_DIR, SPANS_FILE, SPANS_FILE_GZ
from diag.ground.capture_spans import open_spans

#: a file is sniffed from its first bytes only
SNIFF_BYTES = 4096
#: every OTLP JSON line (ExportTraceServiceRequest) starts with this key
OTLP_KEY = "resourceSpans"
#: meta.json key where ``ttft scrape --from-files`` records the scrapes it read
SCRAPED_FILES_KEY = "prometheus_files"
_PROM_LINE = re.compile(r"^(# (HELP|TYPE|EOF)( .*)?|[A-Za-z_:][A-Za-z0-9_:]*(\{.*\})?\s+\S+(\s+-?\d+)?)$")
_READ = frozenset({SPANS_FILE, SPANS_FILE_GZ, META_FILE, SERIES_DIR, PROFILE_DIR, META_FILE + ".tmp"})
_SHOWN = 4


def _head(path: Path) -> tuple[str | None, str]:
    """(the first non-empty line or None for an empty file, the first SNIFF_BYTES as text);
    ValueError for a binary file."""
    try:
        with open_spans(path) as fh:
            raw = fh.read(SNIFF_BYTES)
    except (OSError, EOFError):
        return None, ""  # the loader names unreadable files itself
    if b"\0" in raw:
        raise ValueError("binary")
    head = raw.decode("utf-8", errors="replace")
    return next((x.strip() for x in head.splitlines() if x.strip()), None), head


def looks_like_prometheus(line: str) -> bool:
    return bool(_PROM_LINE.match(line))


def not_a_capture(path: Path) -> str | None:
    """Why a file given as a capture is not one (one line, starting "not a capture"), or None
    when its first line could be OTLP JSON (or it is empty: then it simply holds no spans)."""
    try:
        line, head = _head(path)
    except ValueError:
        return f"not a capture: {path} is a binary file, not OTLP JSON lines"
    if line is None or (line.startswith("{") and OTLP_KEY in head):
        return None
    if line.startswith("{"):
        return (f"not a capture: {path} holds JSON but not OTLP spans (no {OTLP_KEY!r} in its first "
                f"{SNIFF_BYTES} bytes: a JSON log?)")
    if looks_like_prometheus(line):
        return (f"not a capture: {path} is Prometheus text (a saved /metrics scrape); make a capture of it with "
                f"`ttft scrape --from-files {path} -o DIR`")
    shown = line if len(line) <= 60 else line[:59] + "…"
    return (f"not a capture: {path} is not OTLP JSON lines (first line {shown!r}); a capture is a directory "
            f"with {SPANS_FILE}, {META_FILE} or {SERIES_DIR}/, or a .jsonl file of OTLP JSON")


def unread_warning(root: Path, meta: dict[str, Any]) -> str | None:
    """One warning naming what sits in capture ``root`` that loading it does not read, or None."""
    scraped = meta.get(SCRAPED_FILES_KEY)
    done = set(scraped.get("files", [])) if isinstance(scraped, dict) else set()
    prom: list[str] = []
    nested: list[str] = []
    spans: list[str] = []
    try:
        entries = sorted(root.iterdir(), key=lambda e: natural_key(e.name))
    except OSError:
        return None
    for e in entries:
        if e.name in _READ or e.name.startswith(".") or e.name in done:
            continue
        if e.is_dir():
            if any((e / f).exists() for f in (SPANS_FILE, SPANS_FILE_GZ, META_FILE)):
                nested.append(e.name + "/")
        elif e.name.endswith((".prom", ".prom.gz")):
            prom.append(e.name)
        elif e.name.endswith((".jsonl", ".jsonl.gz")) and not e.name.startswith("prompts"):
            spans.append(e.name)
    parts = []
    if prom:
        glob = _common_glob(prom)
        parts.append(f"{_names(prom)} (saved Prometheus scrapes: `ttft scrape --from-files {root / glob} -o {root}` "
                     "makes them this capture's series)")
    if nested:
        parts.append(f"{_names(nested)} (a capture of its own: name it to read it, e.g. `ttft analyze {root / nested[0]}`)")
    if spans:
        parts.append(f"{_names(spans)} (only {SPANS_FILE} is read: give the file itself as a capture)")
    if not parts:
        return None
    n = len(prom) + len(nested) + len(spans)
    return f"{root}: {n} file(s) here are not read as part of this capture: " + "; ".join(parts)


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that puts ``t2`` before ``t10`` (digit runs compare as numbers)."""
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name))


def _names(names: list[str]) -> str:
    more = f", … ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _common_glob(names: list[str]) -> str:
    """``metrics.t0.prom, metrics.t1.prom`` -> ``metrics.t*.prom`` (digits folded), else ``*.prom``."""
    folded = {re.sub(r"\d+", "*", n) for n in names}
    return folded.pop() if len(folded) == 1 else "*.prom"


__all__ = ["SCRAPED_FILES_KEY", "looks_like_prometheus", "natural_key", "not_a_capture", "unread_warning"]
