"""The house has floors, and nothing imports upward: an AST check over every module and import.

Every module of ``diag``, ``collectors``, ``rules`` and ``tui`` is placed in one room of
:data:`HOUSE`; every import in it (at the top *and* inside functions; an ``if TYPE_CHECKING:``
block is exempt, it never runs) must go to a room the rules below allow:

* a room may always import itself (its own package);
* the roof (floor 4) may import anything;
* nothing outside the roof and ``tui`` itself imports ``tui``;
* ground (floor 1) imports ground only;
* floor 2 (collectors, rules, the bundled engine) imports ground and its own room only, so
  collectors and rules never import each other, plus the exceptions in :data:`EXCEPTIONS`;
* floor 3 (the upper rooms) imports floors 1-3.

A module that is in no room fails (a new module must be placed), and so does an import of an
in-house module that does not exist (a module moved, an importer left behind). No dependency:
``ast`` and ``fnmatch`` only.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES: tuple[str, ...] = ("diag", "collectors", "rules", "tui")


@dataclass(frozen=True)
class Room:
    """Modules (``fnmatch`` patterns over dotted names) that share a floor and may import each other."""

    floor: int
    name: str
    patterns: tuple[str, ...]


#: The floor table: one pattern per room, a package and everything under it. The ground also
#: holds the ``diag`` package itself (its ``__init__`` imports nothing; the Ray runtime_env
#: ships its folder), the roof ``diag.__main__`` (``python -m diag``). Where two patterns
#: match, the longest wins.
HOUSE: tuple[Room, ...] = (
    Room(1, "ground", ("diag", "diag.ground*")),
    Room(2, "collectors", ("collectors*",)),
    Room(2, "rules", ("rules*",)),
    Room(2, "engine", ("diag.bundled_engine*",)),
    Room(3, "upper", ("diag.analysis*",)),
    Room(3, "tui", ("tui*",)),
    Room(4, "roof", ("diag.__main__", "diag.cli*")),
)

#: (importer pattern, imported pattern, why it is allowed)
EXCEPTIONS: tuple[tuple[str, str, str], ...] = (
    ("diag.bundled_engine.*", "collectors.spans",
     "the bundled engine emits its spans through the one span helper module, as any instrumented engine would"),
)

#: the room whose modules only the roof and the room itself may import
PRIVATE_ROOM = "tui"


def _matches(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern)


def room_of(name: str, house: tuple[Room, ...] = HOUSE) -> Room | None:
    """The room of a dotted module name: the longest matching pattern wins; None when unplaced."""
    best: tuple[int, Room] | None = None
    for room in house:
        for pattern in room.patterns:
            if _matches(name, pattern) and (best is None or len(pattern) > best[0]):
                best = (len(pattern), room)
    return best[1] if best else None


def modules_under(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` of ``packages`` under ``root``."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, dotted module) for each in-house module that ``name`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[int, str]] = []
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the importer's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            # `from a import b`: b is the module a.b when there is one, else a name in a
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                out.append((node.lineno, target))
    return out


def check_house(root: Path, house: tuple[Room, ...] = HOUSE,
                exceptions: tuple[tuple[str, str, str], ...] = EXCEPTIONS,
                packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every breach of the floor rules under ``root``, one line each (empty: the house holds)."""
    known = modules_under(root, packages)
    problems: list[str] = []
    for name, path in known.items():
        room = room_of(name, house)
        if room is None:
            problems.append(f"{name}: on no floor (place it in HOUSE)")
            continue
        for line, target in imported_modules(name, path, known):
            where = f"{name}:{line} imports {target}"
            if target not in known:
                problems.append(f"{where}: no such module")
                continue
            to = room_of(target, house)
            if to is None or to is room or room.floor == 4:
                continue  # unplaced targets are reported once, as modules
            if any(_matches(name, a) and _matches(target, b) for a, b, _why in exceptions):
                continue
            if to.name == PRIVATE_ROOM:
                problems.append(f"{where}: only the roof and {PRIVATE_ROOM} import {PRIVATE_ROOM}")
            elif room.floor == 1 and to.floor != 1:
                problems.append(f"{where}: ground imports ground only, not {to.name} (floor {to.floor})")
            elif room.floor == 2 and to.floor != 1:
                problems.append(f"{where}: {room.name} (floor 2) imports ground and itself only, "
                                f"not {to.name} (floor {to.floor})")
            elif room.floor == 3 and to.floor > 3:
                problems.append(f"{where}: floor 3 does not import the roof")
    return problems


# --- the house as it is ---------------------------------------------------------------------


def test_every_module_is_on_a_floor_and_no_import_goes_up():
    problems = check_house(ROOT)
    assert not problems, "\n".join(problems)


def test_the_floor_table_places_the_known_modules():
    assert room_of("diag").name == "ground" and room_of("diag.ground.stages").name == "ground"
    assert room_of("diag.bundled_engine").name == "engine" and room_of("diag.bundled_engine.kv.blocks").name == "engine"
    assert room_of("diag.cli.commands.demo").name == "roof" and room_of("diag.analysis.report.html").name == "upper"
    assert room_of("collectors.probe.client").name == "collectors" and room_of("tui.widgets.panels").name == "tui"
    assert room_of("diag.somewhere_new") is None


def test_every_command_module_is_registered():
    from diag import cli

    on_disk = {p.stem for p in (ROOT / "diag" / "cli" / "commands").glob("*.py") if p.stem != "__init__"}
    assert set(cli.COMMANDS) == on_disk
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(cli.COMMANDS)  # type: ignore[arg-type]


# --- the checker can fail -------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_the_checker_reports_back_imports(tmp_path):
    root = _tree(tmp_path, {
        "diag/__init__.py": "",
        "diag/ground/stages.py": "from rules import runner\n",  # ground importing rules
        "diag/ground/tables.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tui.app\n",  # exempt
        "diag/cli/__init__.py": "import tui.app\nfrom rules.runner import run\n",  # the roof: anything
        "diag/cli/commands/__init__.py": "",
        "diag/bundled_engine/__init__.py": "",
        "diag/bundled_engine/server.py": "from collectors import spans\nfrom ..capture import x\n",
        "collectors/__init__.py": "",
        "collectors/spans.py": "from diag.ground import stages\n",
        "collectors/nvml.py": "def f():\n    import tui.app\n    from . import spans\n",  # tui, in a function
        "collectors/probe.py": "from rules.runner import run\n",  # floor 2 sideways
        "rules/__init__.py": "",
        "rules/runner.py": "from .model import Finding\nfrom diag.ground.stages import QUEUE\n",
        "rules/model.py": "",
        "tui/__init__.py": "",
        "tui/app.py": "from diag.cli import main\n",  # floor 3 importing the roof
        "diag/analysis/scenarios/__init__.py": "from diag.analysis.scenarios import runner\n",
        "diag/analysis/scenarios/runner.py": "from tui import app\n",  # upper, not tui
        "diag/orphan.py": "",  # on no floor
    })
    problems = check_house(root)
    assert any(p.startswith("diag.ground.stages:1 imports rules.runner: ground imports ground only") for p in problems)
    assert any(p.startswith("collectors.nvml:2 imports tui.app: only the roof and tui import tui") for p in problems)
    assert any(p.startswith("collectors.probe:1 imports rules.runner: collectors (floor 2)") for p in problems)
    assert any(p.startswith("tui.app:1 imports diag.cli: floor 3 does not import the roof") for p in problems)
    assert any(p.startswith("diag.analysis.scenarios.runner:1 imports tui.app: only the roof") for p in problems)
    assert "diag.orphan: on no floor (place it in HOUSE)" in problems
    assert "diag.bundled_engine.server:2 imports diag.capture: no such module" in problems  # relative, resolved
    assert len(problems) == 7, "\n".join(problems)  # the allowed imports stay quiet


@pytest.mark.parametrize("text", ["import diag.missing\n", "from collectors.gone import x\n"])
def test_the_checker_reports_an_import_of_a_module_that_moved(tmp_path, text):
    root = _tree(tmp_path, {"diag/__init__.py": "", "diag/ground/stages.py": text, "collectors/__init__.py": ""})
    (problem,) = check_house(root)
    assert problem.endswith(": no such module")
