"""Every design document the code or the docs cite is in the repository.

A docstring or a document that says "(docs/design.md)" or "`benchmarks/README.md`" sends the
reader to a file; a citation of a file that is not there (the brief's ``DESIGN.md``, a removed
``units.md``) is a dead end for the next engineer.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: where citations are read: the packages, benchmarks, docs and the README
SOURCES = ("diag", "collectors", "rules", "tui", "benchmarks", "docs")
#: a cited project document: ``docs/NAME.md``, or an upper-case ``NAME.md`` (``DESIGN.md``,
#: ``benchmarks/README.md``); a deeper ``docs/…`` path is another project's (Dynamo's docs)
CITED = re.compile(r"(?<![\w/.-])((?:docs/[\w-]+|(?:[\w-]+/)?[A-Z][A-Z_]+)\.md)\b")


def _citing_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in SOURCES:
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md") and "__pycache__" not in p.parts]
    return files


def test_every_cited_document_exists() -> None:
    dead = []
    for path in _citing_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for cited in CITED.findall(line):
                if not ((ROOT / cited).exists() or (path.parent / cited).exists()):
                    dead.append(f"{path.relative_to(ROOT)}:{n}: {cited}")
    assert not dead, "cited documents that are not in the repository:\n" + "\n".join(dead)


def test_the_readme_is_a_front_page() -> None:
    """Two screens: the pitch, the two set-up commands, everyday commands and links to docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 120, len(lines)
    assert max(len(line) for line in lines if not line.startswith("python3 -m venv")) <= 130
